// ================================================================================================
// level 4: epilogue -- D = alpha * acc + beta * C (thread functor; the threadblock epilogue comes with the kernel level)
// ================================================================================================
using EpilogueOutputOp = cutlass::epilogue::thread::LinearCombination<
    ElementC, kAlignmentC, ElementAccumulator, ElementCompute>;
