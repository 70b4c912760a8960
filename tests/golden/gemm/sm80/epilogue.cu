// ================================================================================================
// level 4: epilogue -- D = relu(alpha * accumulators + beta * C) in epilogue::threadblock::DefaultEpilogueTensorOp
// ================================================================================================
using EpilogueOutputOp = cutlass::epilogue::thread::LinearCombinationRelu<
    ElementC, kAlignmentC, ElementAccumulator, ElementCompute>;

static constexpr int kPartitionsK = ThreadblockShape::kK / WarpShape::kK;  // sliced-K warps reduce in the epilogue
using Epilogue = typename cutlass::epilogue::threadblock::DefaultEpilogueTensorOp<
    ThreadblockShape, WarpMma, kPartitionsK, EpilogueOutputOp, EpilogueOutputOp::kCount>::Epilogue;
