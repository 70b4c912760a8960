// ================================================================================================
// level 5: kernel -- gemm::kernel::GemmUniversal (GEMM mode)
// ================================================================================================
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ThreadblockMma, Epilogue, ThreadblockSwizzle>;

// The composition above is exactly what CUTLASS's DefaultGemmUniversal builds from the same parameters.
using CutlassDefaultKernel = typename cutlass::gemm::kernel::DefaultGemmUniversal<
    ElementA, LayoutA, cutlass::ComplexTransform::kNone, kAlignmentA,
    ElementB, LayoutB, cutlass::ComplexTransform::kNone, kAlignmentB,
    ElementC, LayoutC, ElementAccumulator, OperatorClass, ArchTag,
    ThreadblockShape, WarpShape, InstructionShape, EpilogueOutputOp, ThreadblockSwizzle,
    kStages, MathOperator>::GemmKernel;
static_assert(std::is_base_of<GemmKernel, CutlassDefaultKernel>::value,
              "the level-by-level composition differs from cutlass::gemm::kernel::DefaultGemmUniversal");

static constexpr int kSharedMemoryLimit = 166912;  // bytes per block on sm_80
static_assert(int(sizeof(typename GemmKernel::SharedStorage)) <= kSharedMemoryLimit,
              "shared storage exceeds the per-block limit of the target");
