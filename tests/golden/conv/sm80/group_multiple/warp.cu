// ================================================================================================
// level 2: warp -- the warp tile; its warp-level MMA (gemm::warp::MmaTensorOp) is named and checked after the kernel level
// ================================================================================================
using WarpShape = cutlass::gemm::GemmShape<32, 32, 32>;
// 2x2x1 warps = 128 threads
