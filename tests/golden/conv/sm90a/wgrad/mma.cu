// ================================================================================================
// level 1: MMA -- operands, tile and cluster of the warpgroup MMA (wgmma) the conv collective builder selects
// ================================================================================================
// wgrad: implicit GEMM M = K, N = T*R*S*C, K = N*Z*P*Q
static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kWgrad;
static constexpr int kSpatialDims = 2;
using ElementA = cutlass::bfloat16_t;   // output gradient dy (NZPQK)
using LayoutA = cutlass::layout::TensorNHWC;
constexpr int AlignmentA = 8;  // elements
using ElementB = cutlass::bfloat16_t;   // activations x (NDHWC)
using LayoutB = cutlass::layout::TensorNHWC;
constexpr int AlignmentB = 8;
using ElementAccumulator = float;
// The K mode of a conv tile is nested (the im2col reduction modes): Shape<_M, _N, Shape<_K>>; wgrad nests N too.
using TileShape = cute::Shape<cute::_128, cute::Shape<cute::_128>, cute::Shape<cute::_64>>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
