// ================================================================================================
// level 7: entry -- extern "C" kernel entry (Params by value) and the host shim (conv_abi.h)
// ================================================================================================
#ifdef EMITTER_DEVICE
// What cutlass::Kernel does: Params by value (launched with cuLaunchKernel's kernelParams array).
extern "C" __global__ void __launch_bounds__(emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple::ConvKernel::kThreadCount)
emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple_kernel(typename emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple::ConvKernel::Params params) {
  using Kernel = emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple::ConvKernel;
  extern __shared__ int emitter_shared_storage[];
  Kernel op;
  op(params, *reinterpret_cast<typename Kernel::SharedStorage*>(emitter_shared_storage));
}
#else
extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple_query(emitter_conv_problem const* problem, emitter_launch* out) {
  using namespace emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple;
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Arguments args;
  int status = make_arguments(problem, /*need_pointers=*/false, &args);
  if (status != EMITTER_OK) return status;
  Params params(args, nullptr);
  return describe_launch(args, params, out);
}

extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple_initialize(emitter_conv_problem const* problem, void* workspace, void* stream,
                                      void* params_out, int params_capacity, emitter_launch* out) {
  using namespace emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple;
  if (out == nullptr || params_out == nullptr) return EMITTER_INVALID_ARGUMENT;
  Arguments args;
  int status = make_arguments(problem, /*need_pointers=*/true, &args);
  if (status != EMITTER_OK) return status;
  Params params(args, static_cast<int*>(workspace));
  status = describe_launch(args, params, out);
  if (status != EMITTER_OK) return status;
  if (params_capacity < int(sizeof(Params))) return EMITTER_BUFFER_TOO_SMALL;
  if (out->workspace_bytes > 0) {
    if (workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
    // serial split-K: zero the semaphores on the caller's stream before the launch
    if (cudaMemsetAsync(workspace, 0, size_t(out->workspace_bytes), static_cast<cudaStream_t>(stream)) != cudaSuccess)
      return EMITTER_CUDA_ERROR;
  }
  std::memcpy(params_out, &params, sizeof(Params));
  return EMITTER_OK;
}

extern "C" __attribute__((visibility("default"))) const char* emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple_name(void) {
  return "conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple";
}

extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm80_f16_f16_accf32_nhwc_64x64x32_w32x32x32_i16x8x16_s2_analytic_strided_swz1_al1x1x8_identity_groupmultiple_conv_abi(void) {
  return EMITTER_CONV_ABI_VERSION;
}
#endif  // EMITTER_DEVICE
