// ================================================================================================
// level 6: entry -- the kernel symbol (cubin) and the C ABI of templates/conv/common/conv_abi.h (host .so)
// ================================================================================================
#if defined(EMITTER_DEVICE)
// What cutlass::device_kernel does: Params by value in the constant bank (__grid_constant__; alignof(Params) is
// 128 here, so launch with cuLaunchKernel's kernelParams array, never a packed buffer).
extern "C" __global__ void
__launch_bounds__(emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity::ConvKernel::MaxThreadsPerBlock, emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity::ConvKernel::MinBlocksPerMultiprocessor)
__cluster_dims__(1, 1, 1)
emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_kernel(__grid_constant__ emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity::Params const params) {
  extern __shared__ char smem[];
  emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity::ConvKernel op;
  op(params, smem);
}
#else
extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_query(const emitter_conv_problem* problem, emitter_launch* out) {
  using namespace emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity;
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  try {
    Device::Arguments args;
    int status = Device::arguments(problem, args);
    if (status != EMITTER_OK) return status;
    if (!ConvKernel::can_implement(args)) return EMITTER_CANNOT_IMPLEMENT;
    status = Device::hardware(args.hw_info);
    if (status != EMITTER_OK) return status;
    return Device::describe(args, out);
  } catch (...) {
    return EMITTER_INTERNAL_ERROR;
  }
}

extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_initialize(const emitter_conv_problem* problem, void* workspace, void* stream,
                                            void* params_out, int params_capacity, emitter_launch* out) {
  using namespace emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity;
  if (out == nullptr || params_out == nullptr) return EMITTER_INVALID_ARGUMENT;
  try {
    Device::Arguments args;
    int status = Device::arguments(problem, args);
    if (status != EMITTER_OK) return status;
    if (!ConvKernel::can_implement(args)) return EMITTER_CANNOT_IMPLEMENT;
    status = Device::hardware(args.hw_info);
    if (status != EMITTER_OK) return status;
    status = Device::describe(args, out);
    if (status != EMITTER_OK) return status;
    if (out->workspace_bytes > 0 && workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (params_capacity < out->params_bytes) return EMITTER_BUFFER_TOO_SMALL;
    if (ConvKernel::initialize_workspace(args, workspace, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess)
      return EMITTER_CUDA_ERROR;
    Params params = ConvKernel::to_underlying_arguments(args, workspace);
    std::memcpy(params_out, &params, sizeof(Params));
    dim3 grid = ConvKernel::get_grid_shape(params);
    out->grid[0] = static_cast<int>(grid.x);
    out->grid[1] = static_cast<int>(grid.y);
    out->grid[2] = static_cast<int>(grid.z);
    return EMITTER_OK;
  } catch (...) {
    return EMITTER_INTERNAL_ERROR;
  }
}

extern "C" __attribute__((visibility("default"))) const char* emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_name(void) {
  return "conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity";
}

extern "C" __attribute__((visibility("default"))) int emitter_conv2d_fprop_sm90a_f16_f16_accf32_nhwc_128x128x64_c1x1x1_s6_strided_al8x8x8_identity_conv_abi(void) {
  return EMITTER_CONV_ABI_VERSION;
}
#endif  // EMITTER_DEVICE
