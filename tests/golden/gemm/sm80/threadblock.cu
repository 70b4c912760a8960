// ================================================================================================
// level 3: threadblock -- multistage (cp.async) mainloop: threadblock::MmaMultistage, swizzle
// ================================================================================================
using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 32>;
static constexpr int kStages = 4;
static_assert(std::is_same<ThreadblockShape, typename MmaCore::Shape>::value, "warp level built for another tile");
// 2x2x1 warps = 128 threads

// Global -> shared memory: predicated cp.async of kAlignment elements per access.
using IteratorA = cutlass::transform::threadblock::PredicatedTileAccessIterator<
    cutlass::MatrixShape<ThreadblockShape::kM, ThreadblockShape::kK>, ElementA, LayoutA, 1,
    typename MmaCore::IteratorThreadMapA, cutlass::Array<ElementA, kAlignmentA>>;
using IteratorB = cutlass::transform::threadblock::PredicatedTileAccessIterator<
    cutlass::MatrixShape<ThreadblockShape::kK, ThreadblockShape::kN>, ElementB, LayoutB, 0,
    typename MmaCore::IteratorThreadMapB, cutlass::Array<ElementB, kAlignmentB>>;

using ThreadblockMma = cutlass::gemm::threadblock::MmaMultistage<
    ThreadblockShape,
    IteratorA, typename MmaCore::SmemIteratorA, MmaCore::kCacheOpA,
    IteratorB, typename MmaCore::SmemIteratorB, MmaCore::kCacheOpB,
    ElementAccumulator, LayoutC, WarpMmaPolicy, kStages, cutlass::gemm::SharedMemoryClearOption::kNone>;

// Thread block -> output tile order: 8 tiles along N rasterized together for L2 reuse.
using ThreadblockSwizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>;
