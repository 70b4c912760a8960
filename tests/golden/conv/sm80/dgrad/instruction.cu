// ================================================================================================
// level 1: instruction -- one mma.sync tensor-op instruction per InstructionShape
// ================================================================================================
// dgrad: implicit GEMM M = N*D*H*W, N = C, K = T*R*S*K
static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kDgrad;
using ElementA = cutlass::half_t;   // output gradient dy (NZPQK)
using ElementB = cutlass::half_t;   // filters w (KTRSC)
using ElementC = cutlass::half_t;   // input gradient dx (NDHWC) (output and beta source)
using Layout = cutlass::layout::TensorNHWC;     // every tensor, channels innermost
static constexpr int kAlignmentA = 8;  // elements per global-memory access
static constexpr int kAlignmentB = 8;
static constexpr int kAlignmentC = 8;
using ElementAccumulator = float;
using ElementCompute = float;  // alpha, beta and the activation
using OperatorClass = cutlass::arch::OpClassTensorOp;
using ArchTag = cutlass::arch::Sm80;  // built for sm_80
using MathOperator = cutlass::arch::OpMultiplyAdd;
using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;
