// ================================================================================================
// level 3: collective mainloop -- implicit GEMM, im2col TMA loads, KernelImplicitTmaWarpSpecializedSm90; stages 6
// ================================================================================================
using KernelSchedule = cutlass::conv::KernelImplicitTmaWarpSpecializedSm90;   // the only sm90 conv schedule
using StageCount = cutlass::conv::collective::StageCount<6>;
using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kConvOp,
    ElementA, LayoutA, AlignmentA,
    ElementB, LayoutB, AlignmentB,
    ElementAccumulator,
    TileShape, ClusterShape,
    StageCount,
    KernelSchedule>::CollectiveOp;
static_assert(CollectiveMainloop::DispatchPolicy::NumSpatialDimensions == kSpatialDims, "spatial dims differ");
