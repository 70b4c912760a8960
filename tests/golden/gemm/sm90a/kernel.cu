// ================================================================================================
// level 4: kernel -- GemmUniversal, persistent tile scheduler
// ================================================================================================
using ProblemShape = cute::Shape<int, int, int, int>;  // M, N, K, L (L = batch count)
using TileSchedulerTag = cutlass::gemm::PersistentScheduler;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    ProblemShape, CollectiveMainloop, CollectiveEpilogue, TileSchedulerTag>;
using Params = typename GemmKernel::Params;
static_assert(GemmKernel::SharedStorageSize <= 232448, "shared storage exceeds the sm90 limit");
