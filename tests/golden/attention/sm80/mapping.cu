// ================================================================================================
// level 2: mapping -- emitter's problem mapping: block -> (batch, query head, KV head, rows); GQA, strides, varlen, causal alignment
// ================================================================================================
// The kernel Params by value: CUTLASS's AttentionKernel::Params are built per block from these (upstream's
// advance_to_block is replaced: it has one head stride for Q/K/V, no KV head grouping, O's head stride fixed to
// head_dim_v, and an unsigned causal offset that cannot express seq_q > seq_k from the bottom right).
struct Params {
  Element const* q; Element const* k; Element const* v; Element* o;
  float* lse;                    // null: no LSE
  float* accumulator;            // [rows, heads_q, head_dim_v] f32 workspace (kNeedsAccumulator only)
  int32_t const* cu_seqlens_q;   // varlen only
  int32_t const* cu_seqlens_k;
  int64_t q_stride_b, q_stride_h, k_stride_b, k_stride_h, v_stride_b, v_stride_h, o_stride_b, o_stride_h;
  int64_t lse_stride_b, lse_stride_h;
  int32_t q_stride_s, k_stride_s, v_stride_s, o_stride_s;   // the kernel's row strides are int32
  int32_t seq_q, seq_k;          // fixed lengths (varlen: from cu_seqlens per sequence)
  int32_t heads_q, group;        // group = heads_q / heads_kv: query head h reads KV head h / group
  float scale;
};

// One block's work: rows [row0, row0 + kQueriesPerBlock) of both its row ranges.
struct BlockWork {
  int64_t q_start, k_start;      // first packed row of this sequence (varlen), 0 otherwise
  int32_t seq_q, seq_k;          // this sequence's lengths
  int32_t empty_rows;            // leading query rows that see no key (output 0, LSE -inf)
  int32_t attend_rows;           // rows after them, an attention problem with offset `diagonal`
  int32_t diagonal;              // key j is visible from attending row r when j <= r + diagonal (causal)
  int32_t batch, head, kv_head, row0;
};

CUTLASS_DEVICE BlockWork map_block(Params const& P) {
  BlockWork w;
  w.batch = int32_t(blockIdx.z);
  w.head = int32_t(blockIdx.y);
  w.kv_head = w.head / P.group;
  w.row0 = int32_t(blockIdx.x) * kQueriesPerBlock;
  if (kVarlen) {
    w.q_start = P.cu_seqlens_q[w.batch];
    w.k_start = P.cu_seqlens_k[w.batch];
    w.seq_q = int32_t(P.cu_seqlens_q[w.batch + 1] - w.q_start);
    w.seq_k = int32_t(P.cu_seqlens_k[w.batch + 1] - w.k_start);
  } else {
    w.q_start = 0; w.k_start = 0; w.seq_q = P.seq_q; w.seq_k = P.seq_k;
  }
  // Rows without a visible key: all of them when there is no key; from the bottom right, the first
  // seq_q - seq_k rows. The rest is one problem whose row r sees keys j <= r + diagonal.
  if (w.seq_k <= 0) {
    w.empty_rows = w.seq_q > 0 ? w.seq_q : 0;
    w.diagonal = 0;
  } else if (kBottomRight) {
    w.empty_rows = w.seq_q > w.seq_k ? w.seq_q - w.seq_k : 0;
    w.diagonal = w.seq_k > w.seq_q ? w.seq_k - w.seq_q : 0;
  } else {
    w.empty_rows = 0;
    w.diagonal = 0;
  }
  int32_t const seq_q = w.seq_q > 0 ? w.seq_q : 0;
  w.attend_rows = seq_q - w.empty_rows;
  return w;
}

// CUTLASS's Params for the attending rows of this block (pointers advanced, lengths set): what
// advance_to_block would produce, with the KV head of a GQA group and emitter's strides.
CUTLASS_DEVICE void make_kernel_params(Params const& P, BlockWork const& w, AttentionParams& p) {
  int64_t const row = w.q_start + w.empty_rows + w.row0;     // first query row (packed index when varlen)
  int64_t const qb = kVarlen ? 0 : int64_t(w.batch);
  p.query_ptr = const_cast<Element*>(P.q) + qb * P.q_stride_b + row * P.q_stride_s + int64_t(w.head) * P.q_stride_h;
  p.key_ptr = const_cast<Element*>(P.k) + qb * P.k_stride_b + w.k_start * P.k_stride_s + int64_t(w.kv_head) * P.k_stride_h;
  p.value_ptr = const_cast<Element*>(P.v) + qb * P.v_stride_b + w.k_start * P.v_stride_s + int64_t(w.kv_head) * P.v_stride_h;
  p.output_ptr = P.o + qb * P.o_stride_b + row * P.o_stride_s + int64_t(w.head) * P.o_stride_h;
  if (kNeedsAccumulator) {
    // [rows, heads_q, head_dim_v]: the kernel's accumulator iterator strides rows by head_dim_v * num_heads
    int64_t const arow = (kVarlen ? 0 : qb * int64_t(P.seq_q)) + row;
    p.output_accum_ptr = P.accumulator + (arow * P.heads_q + w.head) * int64_t(kHeadDimV);
  } else {
    p.output_accum_ptr = reinterpret_cast<float*>(p.output_ptr);   // unused (output kept in registers)
  }
  p.logsumexp_ptr = nullptr;     // emitter's epilogue level writes the LSE (upstream pads rows with +inf)
  p.attn_bias_ptr = nullptr;
  p.seqstart_q_ptr = nullptr;
  p.seqstart_k_ptr = nullptr;
  p.seqlen_k_ptr = nullptr;
  p.scale = P.scale;
  p.head_dim = kHeadDim;
  p.head_dim_value = kHeadDimV;
  p.num_queries = w.attend_rows - w.row0;                     // rows from this block's first one
  p.num_keys = w.seq_k;
  p.num_keys_absolute = w.seq_k;
  p.num_heads = P.heads_q;
  p.num_batches = 0;
  p.q_strideM = P.q_stride_s;
  p.k_strideM = P.k_stride_s;
  p.v_strideM = P.v_stride_s;
  p.o_strideM = P.o_stride_s;
  p.bias_strideM = 0;
  if (kCausal) {
    p.custom_mask_type = kBottomRight ? Attention::CausalFromBottomRight : Attention::CausalFromTopLeft;
    p.causal_diagonal_offset = uint32_t(w.diagonal);          // >= 0 by construction
    // keys past the block's last row + diagonal are masked for every row: not loaded at all
    int32_t const last = w.row0 + kQueriesPerBlock + w.diagonal;
    p.num_keys = last < w.seq_k ? last : w.seq_k;
  } else {
    p.custom_mask_type = Attention::NoCustomMask;
    p.causal_diagonal_offset = 0;
  }
}
