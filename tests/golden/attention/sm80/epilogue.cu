// ================================================================================================
// level 3: epilogue -- emitter's row epilogue: LSE from the kernel's softmax state, rows without a visible key
// ================================================================================================
// Rows [row0, row0 + kQueriesPerBlock) of the leading empty rows: output 0, LSE -inf (log of an empty sum).
CUTLASS_DEVICE void write_empty_rows(Params const& P, BlockWork const& w) {
  int32_t const end = w.row0 + kQueriesPerBlock < w.empty_rows ? w.row0 + kQueriesPerBlock : w.empty_rows;
  if (w.row0 >= end) return;
  int const tid = int(threadIdx.x + threadIdx.y * blockDim.x);
  int64_t const qb = kVarlen ? 0 : int64_t(w.batch);
  int32_t const rows = end - w.row0;
  for (int i = tid; i < rows * kHeadDimV; i += kThreads) {
    int64_t const row = w.q_start + w.row0 + i / kHeadDimV;
    P.o[qb * P.o_stride_b + row * P.o_stride_s + int64_t(w.head) * P.o_stride_h + i % kHeadDimV] = Element(0.f);
  }
  if (kLse && P.lse != nullptr) {
    for (int i = tid; i < rows; i += kThreads) {
      P.lse[qb * P.lse_stride_b + int64_t(w.head) * P.lse_stride_h + w.q_start + w.row0 + i] =
          -cutlass::platform::numeric_limits<float>::infinity();
    }
  }
}

// After AttentionKernel::attention_kernel: its softmax state (row max `mi`, in log2 units of the scaled
// scores, and row sum `s_prime`) is still in shared memory; LSE = mi / log2(e) + ln(s_prime), written only for
// this block's rows (upstream pads each block to 32 rows with +inf, past the end of a row of LSE).
CUTLASS_DEVICE void write_lse(Params const& P, BlockWork const& w, SharedStorage& shared) {
  if (!kLse || P.lse == nullptr) return;
  __syncthreads();
  int const tid = int(threadIdx.x + threadIdx.y * blockDim.x);
  if (tid < kQueriesPerBlock && w.row0 + tid < w.attend_rows) {
    constexpr float kLog2e = 1.4426950408889634074f;
    int64_t const qb = kVarlen ? 0 : int64_t(w.batch);
    float const value = shared.mi[tid] / kLog2e + logf(shared.s_prime[tid]);
    P.lse[qb * P.lse_stride_b + int64_t(w.head) * P.lse_stride_h + w.q_start + w.empty_rows + w.row0 + tid] = value;
  }
}
