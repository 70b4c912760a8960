// ================================================================================================
// level 7: entry -- extern "C" kernel entry (Params by value) and the host shim (emitter_abi.h)
// ================================================================================================
#ifdef EMITTER_DEVICE
// What cutlass::Kernel2 does: Params by value (launched with cuLaunchKernel's kernelParams array).
extern "C" __global__ void __launch_bounds__(emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu::GemmKernel::kThreadCount)
emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu_kernel(typename emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu::GemmKernel::Params params) {
  using Kernel = emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu::GemmKernel;
  extern __shared__ int emitter_shared_storage[];
  Kernel::invoke(params, *reinterpret_cast<typename Kernel::SharedStorage*>(emitter_shared_storage));
}
#else
extern "C" __attribute__((visibility("default"))) int emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu_query(emitter_gemm_problem const* problem, emitter_launch* out) {
  using namespace emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu;
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Arguments args;
  int status = make_arguments(problem, /*need_pointers=*/false, &args);
  if (status != EMITTER_OK) return status;
  Params params(args, /*device_sms=*/0, /*sm_occupancy=*/0);
  return describe_launch(params, out);
}

extern "C" __attribute__((visibility("default"))) int emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu_initialize(emitter_gemm_problem const* problem, void* workspace, void* stream,
                                      void* params_out, int params_capacity, emitter_launch* out) {
  using namespace emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu;
  if (out == nullptr || params_out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Arguments args;
  int status = make_arguments(problem, /*need_pointers=*/true, &args);
  if (status != EMITTER_OK) return status;
  Params params(args, /*device_sms=*/0, /*sm_occupancy=*/0);
  status = describe_launch(params, out);
  if (status != EMITTER_OK) return status;
  if (params_capacity < int(sizeof(Params))) return EMITTER_BUFFER_TOO_SMALL;
  if (out->workspace_bytes > 0) {
    if (workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
    // serial split-K: zero the semaphores on the caller's stream before the launch
    if (params.init_workspace(workspace, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess)
      return EMITTER_CUDA_ERROR;
  }
  std::memcpy(params_out, &params, sizeof(Params));
  return EMITTER_OK;
}

extern "C" __attribute__((visibility("default"))) const char* emitter_gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu_name(void) {
  return "gemm_sm80_f16f16_f16f16_accf32_tnt_128x128x32_w64x64x32_i16x8x16_s4_swz8_al8x8x8_relu";
}
#endif  // EMITTER_DEVICE
