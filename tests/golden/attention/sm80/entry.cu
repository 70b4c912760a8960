// ================================================================================================
// level 5: entry -- extern "C" kernel entry (Params by value) and the host shim (attention_abi.h)
// ================================================================================================
#ifdef EMITTER_DEVICE
extern "C" __global__ void __launch_bounds__(emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen::kThreads, emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen::Attention::kMinBlocksPerSm)
emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen_kernel(emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen::Params const params) {
  using namespace emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen;
  extern __shared__ __align__(16) char emitter_shared_storage[];   // the kernel's SharedStorage (same bytes)
  BlockWork const w = map_block(params);
  write_empty_rows(params, w);
  if (w.row0 >= w.attend_rows) return;   // uniform over the block
  // AttentionKernel::attention_kernel mutates the Params it is given: a local copy, never the parameter
  AttentionParams p;
  make_kernel_params(params, w, p);
  Attention::attention_kernel(p);
  write_lse(params, w, *reinterpret_cast<SharedStorage*>(emitter_shared_storage));
}
#else
extern "C" __attribute__((visibility("default"))) int emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen_query(emitter_attention_problem const* problem, emitter_launch* out) {
  using namespace emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen;
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Params params;
  long long workspace = 0;
  dim3 grid;
  int status = make_params(problem, /*need_pointers=*/false, &params, &workspace, &grid);
  if (status != EMITTER_OK) return status;
  return describe_launch(grid, workspace, out);
}

extern "C" __attribute__((visibility("default"))) int emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen_initialize(emitter_attention_problem const* problem, void* workspace, void* stream,
                                      void* params_out, int params_capacity, emitter_launch* out) {
  using namespace emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen;
  (void)stream;   // nothing to initialize: the accumulator is written before it is read
  if (out == nullptr || params_out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Params params;
  long long workspace_bytes = 0;
  dim3 grid;
  int status = make_params(problem, /*need_pointers=*/true, &params, &workspace_bytes, &grid);
  if (status != EMITTER_OK) return status;
  status = describe_launch(grid, workspace_bytes, out);
  if (status != EMITTER_OK) return status;
  if (params_capacity < int(sizeof(Params))) return EMITTER_BUFFER_TOO_SMALL;
  if (workspace_bytes > 0) {
    if (workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (reinterpret_cast<uintptr_t>(workspace) % 16) return EMITTER_INVALID_ARGUMENT;
    params.accumulator = static_cast<float*>(workspace);
  }
  std::memcpy(params_out, &params, sizeof(Params));
  return EMITTER_OK;
}

extern "C" __attribute__((visibility("default"))) const char* emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen_name(void) {
  return "attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen";
}

extern "C" __attribute__((visibility("default"))) int emitter_attn_sm80_f16_d128_32x128_multistage_s4_causalbr_bshd_lse_gqa_varlen_abi_version(void) {
  return EMITTER_ATTENTION_ABI_VERSION;
}
#endif  // EMITTER_DEVICE
