// ================================================================================================
// level 4: kernel -- conv::kernel::ConvUniversal over ConvProblemShape (non-persistent: one CTA per output tile)
// ================================================================================================
using ProblemShape = cutlass::conv::ConvProblemShape<kConvOp, kSpatialDims>;
using ConvKernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Params = typename ConvKernel::Params;
static_assert(ConvKernel::SharedStorageSize <= 232448, "shared storage exceeds the sm90 limit");
