// ================================================================================================
// level 1: kernel -- CUTLASS's AttentionKernel (examples/41), instantiated for this instance
// ================================================================================================
using Element = cutlass::half_t;
static constexpr int kQueriesPerBlock = 32;
static constexpr int kKeysPerBlock = 128;
static constexpr int kMaxK = 128;          // max(head_dim, head_dim_v), 96 -> 128 (sm80.max_k)
static constexpr int kHeadDim = 128;
static constexpr int kHeadDimV = 128;
static constexpr bool kCausal = true;
static constexpr bool kBottomRight = true;
static constexpr bool kLse = true;
[[maybe_unused]] static constexpr bool kGqa = true;
static constexpr bool kVarlen = true;
[[maybe_unused]] static constexpr bool kPackedBHSD = false;   // the layout packed strides (0) take
[[maybe_unused]] static constexpr int kAlignment = 8;   // elements: every pointer and stride (16 bytes)

// isAligned = true (128-bit Q/K/V loads; the shim checks pointers and strides), no dropout (no curand, no
// RNG state in Params), no attention bias (emitter's problem has none; the scale is applied in the softmax).
using Attention = AttentionKernel<Element, cutlass::arch::Sm80, /*isAligned=*/true, kQueriesPerBlock, kKeysPerBlock,
                                  kMaxK, /*kSupportsDropout=*/false, /*kSupportsBias=*/false>;
using AttentionParams = typename Attention::Params;
using SharedStorage = typename Attention::SharedStorage;
static constexpr int kThreads = Attention::kNumThreads;
[[maybe_unused]] static constexpr int kWarps = Attention::kNumWarpsPerBlock;
// With kMaxK <= kKeysPerBlock the output stays in registers; otherwise the kernel keeps an f32 running output
// in global memory between key blocks (emitter's workspace, [rows, heads_q, head_dim_v]).
static constexpr bool kNeedsAccumulator = Attention::kNeedsOutputAccumulatorBuffer;
static_assert(kNeedsAccumulator == false,
              "emitter's model of AttentionKernel's output accumulator disagrees with CUTLASS");
static_assert(sizeof(SharedStorage) == 42496,
              "emitter's shared-memory model of AttentionKernel disagrees with CUTLASS (emitter/families/attention/sm80.py)");
static_assert(kThreads == 128, "thread count");
