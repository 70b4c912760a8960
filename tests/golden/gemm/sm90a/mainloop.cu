// ================================================================================================
// level 3: collective mainloop -- TMA; stages auto (about 4 with this epilogue)
// ================================================================================================
using StageCount = cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, LayoutA, AlignmentA,
    ElementB, LayoutB, AlignmentB,
    ElementAccumulator,
    TileShape, ClusterShape,
    StageCount,
    KernelSchedule>::CollectiveOp;
static_assert(cute::size<0>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}) == cute::size<0>(MmaInstructionShape{}) &&
              cute::size<1>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}) == cute::size<1>(MmaInstructionShape{}) &&
              cute::size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{}) == cute::size<2>(MmaInstructionShape{}),
              "emitter derived a different wgmma shape than the CUTLASS builder selected");
