// ================================================================================================
// level 3: threadblock -- multistage (cp.async) mainloop over the implicit-GEMM iterators (analytic, strided stride), swizzle
// ================================================================================================
using ThreadblockShape = cutlass::gemm::GemmShape<64, 64, 32>;
static constexpr int kStages = 2;
// How A and B tiles are gathered from the NHWC tensors without materializing im2col:
static constexpr cutlass::conv::IteratorAlgorithm kIteratorAlgorithm = cutlass::conv::IteratorAlgorithm::kAnalytic;
static constexpr cutlass::conv::StrideSupport kStrideSupport = cutlass::conv::StrideSupport::kStrided;
using ThreadblockSwizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>;
