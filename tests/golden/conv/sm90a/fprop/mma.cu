// ================================================================================================
// level 1: MMA -- operands, tile and cluster of the warpgroup MMA (wgmma) the conv collective builder selects
// ================================================================================================
// fprop: implicit GEMM M = N*Z*P*Q, N = K, K = T*R*S*C
static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kFprop;
static constexpr int kSpatialDims = 2;
using ElementA = cutlass::half_t;   // activations x (NDHWC)
using LayoutA = cutlass::layout::TensorNHWC;
constexpr int AlignmentA = 8;  // elements
using ElementB = cutlass::half_t;   // filters w (KTRSC)
using LayoutB = cutlass::layout::TensorNHWC;
constexpr int AlignmentB = 8;
using ElementAccumulator = float;
// The K mode of a conv tile is nested (the im2col reduction modes): Shape<_M, _N, Shape<_K>>.
using TileShape = cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
