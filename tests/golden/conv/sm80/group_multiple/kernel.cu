// ================================================================================================
// level 5: kernel -- conv::kernel::DefaultConv2dGroupFprop -> ImplicitGemmConvolution (groups: multiple a CTA)
// ================================================================================================
// grouped fprop: each output channel k reads the C/groups input channels of its group; the kernel offsets a CTA's
// activation columns by its group (whole groups a CTA: tile n a multiple of K/groups)
static constexpr cutlass::conv::GroupMode kGroupMode = cutlass::conv::GroupMode::kMultipleGroup;
using ConvKernel = typename cutlass::conv::kernel::DefaultConv2dGroupFprop<
    ElementA, Layout, ElementB, Layout, ElementC, Layout, ElementAccumulator,
    OperatorClass, ArchTag, ThreadblockShape, WarpShape, InstructionShape,
    EpilogueOutputOp, ThreadblockSwizzle, kStages, MathOperator, kGroupMode,
    kIteratorAlgorithm, kStrideSupport, kAlignmentA, kAlignmentB>::Kernel;

// The levels CUTLASS composed, by name (what a reader or an override would replace):
using ThreadblockMma = typename ConvKernel::Mma;            // conv::threadblock::ImplicitGemmMultistage
using IteratorA = typename ThreadblockMma::IteratorA;       // activation / output-gradient tile gatherer
using IteratorB = typename ThreadblockMma::IteratorB;       // filter / activation tile gatherer
using WarpMma = typename ThreadblockMma::Policy::Operator;   // gemm::warp::MmaTensorOp
using Epilogue = typename ConvKernel::Epilogue;             // epilogue::threadblock::Epilogue (TensorOp)
static_assert(std::is_same<typename WarpMma::Shape, WarpShape>::value, "warp-level MMA has another warp shape");
static_assert(std::is_same<typename WarpMma::ArchMmaOperator::Shape, InstructionShape>::value,
              "warp-level MMA is not built from InstructionShape");
static_assert(std::is_same<typename ThreadblockMma::Shape, ThreadblockShape>::value, "threadblock shape differs");
static_assert(IteratorA::kIteratorAlgorithm == kIteratorAlgorithm, "iterator algorithm differs");
static_assert(ConvKernel::kConvolutionalOperator == kConvOp, "operator differs");
static_assert(ConvKernel::kStages == kStages, "stage count differs");
static_assert(ConvKernel::kGroupMode == kGroupMode, "group mode differs");

using Params = typename ConvKernel::Params;
static constexpr int kSharedMemoryLimit = 166912;  // bytes per block on sm_80
static_assert(int(sizeof(typename ConvKernel::SharedStorage)) <= kSharedMemoryLimit,
              "shared storage exceeds the per-block limit of the target");
