// ================================================================================================
// level 1: MMA -- operands and the warpgroup MMA (wgmma) the collective builder selects
// ================================================================================================
// bf16 x bf16 -> f32, A K-major, B K-major; tile 128x256x64, cluster 2x1x1
using ElementA = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
constexpr int AlignmentA = 8;  // elements
using ElementB = cutlass::bfloat16_t;
using LayoutB = cutlass::layout::ColumnMajor;
constexpr int AlignmentB = 8;
using ElementAccumulator = float;
using TileShape = cute::Shape<cute::Int<128>, cute::Int<256>, cute::Int<64>>;
using ClusterShape = cute::Shape<cute::Int<2>, cute::Int<1>, cute::Int<1>>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
// One wgmma.mma_async per 64x256x16 block (checked against the builder's TiledMma below).
using MmaInstructionShape = cute::Shape<cute::Int<64>, cute::Int<256>, cute::Int<16>>;
