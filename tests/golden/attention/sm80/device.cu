// ================================================================================================
// level 4: device -- host side: emitter_attention_problem -> Params, can-implement, launch dims, workspace
// ================================================================================================
#ifndef EMITTER_DEVICE
inline bool aligned_pointer(void const* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % (uintptr_t(kAlignment) * sizeof(Element)) == 0;
}

inline bool fits_int32(long long v) { return v >= 0 && v <= 2147483647LL; }

// Fills Params from an ABI problem. need_pointers = false for a size-only query (pointers unchecked).
// workspace_bytes: the f32 output accumulator the kernel needs (0 when the output stays in registers).
inline int make_params(emitter_attention_problem const* p, bool need_pointers, Params* out,
                       long long* workspace_bytes, dim3* grid) {
  if (p == nullptr || out == nullptr) return EMITTER_INVALID_ARGUMENT;
  if (p->batch < 1 || p->heads_q < 1 || p->heads_kv < 1 || p->seq_q < 1 || p->seq_k < 0) return EMITTER_INVALID_ARGUMENT;
  if (!kVarlen && p->seq_k < 1) return EMITTER_INVALID_ARGUMENT;
  if (p->head_dim != kHeadDim || p->head_dim_v != kHeadDimV) return EMITTER_CANNOT_IMPLEMENT;
  if (p->flags != 0 || p->reserved0 != 0) return EMITTER_CANNOT_IMPLEMENT;
  if (p->heads_q % p->heads_kv != 0) return EMITTER_INVALID_ARGUMENT;
  if (!kGqa && p->heads_kv != p->heads_q) return EMITTER_CANNOT_IMPLEMENT;   // not a GQA instance
  if (!kLse && p->lse != nullptr) return EMITTER_CANNOT_IMPLEMENT;           // compiled without LSE
  if (!(std::isfinite(p->scale)) || p->scale < 0.f) return EMITTER_INVALID_ARGUMENT;
  bool const varlen = p->cu_seqlens_q != nullptr || p->cu_seqlens_k != nullptr || p->total_q != 0 || p->total_k != 0;
  if (varlen != kVarlen) return EMITTER_CANNOT_IMPLEMENT;                   // varlen instances take only cu_seqlens problems
  if (kVarlen && (p->total_q < 1 || p->total_k < 0)) return EMITTER_INVALID_ARGUMENT;

  long long const b = p->batch, hq = p->heads_q, hkv = p->heads_kv, sq = p->seq_q, sk = p->seq_k;
  long long const d = kHeadDim, dv = kHeadDimV;
  long long const rows_q = kVarlen ? (long long)p->total_q : sq;   // rows of one batch entry's tensor
  long long const rows_k = kVarlen ? (long long)p->total_k : sk;
  // packed strides (batch, seq, head) in the instance's layout; a stride of 0 takes the packed value
  auto pick = [](long long given, long long packed) { return given != 0 ? given : packed; };
  long long qs[3], ks[3], vs[3], os[3];
  long long const packed_q[3] = {kVarlen ? 0 : hq * rows_q * d, kPackedBHSD ? d : hq * d, kPackedBHSD ? rows_q * d : d};
  long long const packed_k[3] = {kVarlen ? 0 : hkv * rows_k * d, kPackedBHSD ? d : hkv * d, kPackedBHSD ? rows_k * d : d};
  long long const packed_v[3] = {kVarlen ? 0 : hkv * rows_k * dv, kPackedBHSD ? dv : hkv * dv, kPackedBHSD ? rows_k * dv : dv};
  long long const packed_o[3] = {kVarlen ? 0 : hq * rows_q * dv, kPackedBHSD ? dv : hq * dv, kPackedBHSD ? rows_q * dv : dv};
  for (int i = 0; i < 3; ++i) {
    qs[i] = pick(p->stride_q[i], packed_q[i]); ks[i] = pick(p->stride_k[i], packed_k[i]);
    vs[i] = pick(p->stride_v[i], packed_v[i]); os[i] = pick(p->stride_o[i], packed_o[i]);
    if (qs[i] < 0 || ks[i] < 0 || vs[i] < 0 || os[i] < 0) return EMITTER_INVALID_ARGUMENT;
    // 128-bit accesses: every stride a multiple of the vector width
    if (qs[i] % kAlignment || ks[i] % kAlignment || vs[i] % kAlignment || os[i] % kAlignment) return EMITTER_CANNOT_IMPLEMENT;
  }
  long long const lse_b = kVarlen ? 0 : pick(p->stride_lse[0], hq * sq);
  long long const lse_h = pick(p->stride_lse[1], kVarlen ? (long long)p->total_q : sq);
  if (p->stride_lse[0] < 0 || p->stride_lse[1] < 0) return EMITTER_INVALID_ARGUMENT;
  if (kVarlen && p->stride_lse[0] != 0) return EMITTER_INVALID_ARGUMENT;   // varlen LSE is [heads_q, total_q]
  // the kernel's row strides and row offsets (row * stride inside one sequence) are 32-bit
  if (!fits_int32(qs[1]) || !fits_int32(ks[1]) || !fits_int32(vs[1]) || !fits_int32(os[1])) return EMITTER_CANNOT_IMPLEMENT;
  if (!fits_int32(sq * qs[1]) || !fits_int32(sk * ks[1]) || !fits_int32(sk * vs[1]) || !fits_int32(sq * os[1]))
    return EMITTER_CANNOT_IMPLEMENT;
  long long const blocks_x = (sq + kQueriesPerBlock - 1) / kQueriesPerBlock;
  if (blocks_x > 2147483647LL || hq > 65535 || b > 65535) return EMITTER_CANNOT_IMPLEMENT;
  *grid = dim3(unsigned(blocks_x), unsigned(hq), unsigned(b));
  *workspace_bytes = kNeedsAccumulator ? (kVarlen ? (long long)p->total_q : b * sq) * hq * dv * (long long)sizeof(float) : 0;

  if (need_pointers) {
    if (p->q == nullptr || p->k == nullptr || p->v == nullptr || p->o == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (kVarlen && (p->cu_seqlens_q == nullptr || p->cu_seqlens_k == nullptr)) return EMITTER_INVALID_ARGUMENT;
    if (!aligned_pointer(p->q) || !aligned_pointer(p->k) || !aligned_pointer(p->v) || !aligned_pointer(p->o))
      return EMITTER_CANNOT_IMPLEMENT;
  }
  Params& P = *out;
  std::memset(&P, 0, sizeof(Params));
  P.q = static_cast<Element const*>(p->q); P.k = static_cast<Element const*>(p->k);
  P.v = static_cast<Element const*>(p->v); P.o = static_cast<Element*>(p->o);
  P.lse = p->lse;
  P.accumulator = nullptr;
  P.cu_seqlens_q = p->cu_seqlens_q; P.cu_seqlens_k = p->cu_seqlens_k;
  P.q_stride_b = qs[0]; P.q_stride_s = int32_t(qs[1]); P.q_stride_h = qs[2];
  P.k_stride_b = ks[0]; P.k_stride_s = int32_t(ks[1]); P.k_stride_h = ks[2];
  P.v_stride_b = vs[0]; P.v_stride_s = int32_t(vs[1]); P.v_stride_h = vs[2];
  P.o_stride_b = os[0]; P.o_stride_s = int32_t(os[1]); P.o_stride_h = os[2];
  P.lse_stride_b = lse_b; P.lse_stride_h = lse_h;
  P.seq_q = p->seq_q; P.seq_k = p->seq_k;
  P.heads_q = p->heads_q; P.group = p->heads_q / p->heads_kv;
  P.scale = p->scale != 0.f ? p->scale : float(1.0 / std::sqrt(double(kHeadDim)));
  return EMITTER_OK;
}

inline int describe_launch(dim3 grid, long long workspace_bytes, emitter_launch* out) {
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  out->grid[0] = int(grid.x); out->grid[1] = int(grid.y); out->grid[2] = int(grid.z);
  out->block[0] = Attention::kWarpSize; out->block[1] = kWarps; out->block[2] = 1;   // lane = x, warp = y
  out->cluster[0] = 1; out->cluster[1] = 1; out->cluster[2] = 1;
  out->shared_bytes = int(sizeof(SharedStorage));
  out->params_bytes = int(sizeof(Params));
  out->params_align = int(alignof(Params));
  out->workspace_bytes = workspace_bytes;
  return EMITTER_OK;
}
#endif  // !EMITTER_DEVICE
