// ================================================================================================
// level 2: warp -- the warp tile and the warp-level MMA (gemm::warp::MmaTensorOp)
// ================================================================================================
using WarpShape = cutlass::gemm::GemmShape<64, 64, 32>;

// CUTLASS 2.x chooses the warp-level MMA together with the shared-memory layouts it reads
// (threadblock::DefaultMmaCore); both depend on the threadblock tile and the pipeline depth, so the
// core is instantiated for tile 128x128x32 and 4 stages (checked against the next level).
static constexpr cutlass::arch::CacheOperation::Kind kCacheOpA = cutlass::arch::CacheOperation::Global;
static constexpr cutlass::arch::CacheOperation::Kind kCacheOpB = cutlass::arch::CacheOperation::Global;
using MmaCore = cutlass::gemm::threadblock::DefaultMmaCore<
    cutlass::gemm::GemmShape<128, 128, 32>, WarpShape, InstructionShape,
    ElementA, LayoutA, ElementB, LayoutB, ElementAccumulator, LayoutC,
    OperatorClass, 4, MathOperator, false, kCacheOpA, kCacheOpB>;

using WarpMmaPolicy = typename MmaCore::MmaPolicy;  // threadblock::MmaPolicy<WarpMma, smem padding, partitions K>
using WarpMma = typename WarpMmaPolicy::Operator;
static_assert(std::is_same<typename WarpMma::Shape, WarpShape>::value, "warp-level MMA has another warp shape");
static_assert(std::is_same<typename WarpMma::ArchMmaOperator::Shape, InstructionShape>::value,
              "warp-level MMA is not built from InstructionShape");
