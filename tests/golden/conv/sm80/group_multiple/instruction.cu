// ================================================================================================
// level 1: instruction -- one mma.sync tensor-op instruction per InstructionShape
// ================================================================================================
// fprop: implicit GEMM M = N*Z*P*Q, N = K, K = T*R*S*C
static constexpr cutlass::conv::Operator kConvOp = cutlass::conv::Operator::kFprop;
using ElementA = cutlass::half_t;   // activations x (NDHWC)
using ElementB = cutlass::half_t;   // filters w (KTRSC)
using ElementC = cutlass::half_t;   // output y (NZPQK) (output and beta source)
using Layout = cutlass::layout::TensorNHWC;     // every tensor, channels innermost
static constexpr int kAlignmentA = 1;  // elements per global-memory access
static constexpr int kAlignmentB = 1;
static constexpr int kAlignmentC = 8;
using ElementAccumulator = float;
using ElementCompute = float;  // alpha, beta and the activation
using OperatorClass = cutlass::arch::OpClassTensorOp;
using ArchTag = cutlass::arch::Sm80;  // built for sm_80
using MathOperator = cutlass::arch::OpMultiplyAdd;
using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;
