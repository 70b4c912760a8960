// ================================================================================================
// level 1: instruction -- one mma.sync tensor-op instruction per InstructionShape
// ================================================================================================
// Operands in the kernel's frame: A is M x K, B is K x N, C and D are M x N row-major.
using ElementA = cutlass::half_t;
using LayoutA = cutlass::layout::RowMajor;
static constexpr int kAlignmentA = 8;  // elements per global-memory access
using ElementB = cutlass::half_t;
using LayoutB = cutlass::layout::ColumnMajor;
static constexpr int kAlignmentB = 8;
using ElementC = cutlass::half_t;  // C and D
using LayoutC = cutlass::layout::RowMajor;
static constexpr int kAlignmentC = 8;
using ElementAccumulator = float;
using ElementCompute = float;  // alpha, beta and the activation

using OperatorClass = cutlass::arch::OpClassTensorOp;
using ArchTag = cutlass::arch::Sm80;  // built for sm_80
using MathOperator = cutlass::arch::OpMultiplyAdd;
using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;
