// ================================================================================================
// level 6: entry -- the kernel symbol (cubin) and the C ABI of templates/common/emitter_abi.h (host .so)
// ================================================================================================
#if defined(EMITTER_DEVICE)
// What cutlass::device_kernel does: Params by value in the constant bank (__grid_constant__; their TMA
// descriptors are 64-byte aligned, so launch with cuLaunchKernel's kernelParams array, not a packed
// buffer). Read through a pointer instead, each field is a register load, and some kernels spill.
extern "C" __global__ void
__launch_bounds__(emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity::GemmKernel::MaxThreadsPerBlock, emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity::GemmKernel::MinBlocksPerMultiprocessor)
__cluster_dims__(2, 1, 1)
emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity_kernel(__grid_constant__ emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity::Params const params) {
  extern __shared__ char smem[];
  emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity::GemmKernel op;
  op(params, smem);
}
#else
extern "C" __attribute__((visibility("default"))) int emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity_query(const emitter_gemm_problem* problem, emitter_launch* out) {
  using namespace emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity;
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  try {
    Device::Arguments args;
    int status = Device::arguments(problem, args);
    if (status != EMITTER_OK) return status;
    if (!GemmKernel::can_implement(args)) return EMITTER_CANNOT_IMPLEMENT;
    status = Device::hardware(args.hw_info);
    if (status != EMITTER_OK) return status;
    return Device::describe(args, out);
  } catch (...) {
    return EMITTER_INTERNAL_ERROR;
  }
}

extern "C" __attribute__((visibility("default"))) int emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity_initialize(const emitter_gemm_problem* problem, void* workspace, void* stream,
                                            void* params_out, int params_capacity, emitter_launch* out) {
  using namespace emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity;
  if (out == nullptr || params_out == nullptr) return EMITTER_INVALID_ARGUMENT;
  try {
    Device::Arguments args;
    int status = Device::arguments(problem, args);
    if (status != EMITTER_OK) return status;
    if (!GemmKernel::can_implement(args)) return EMITTER_CANNOT_IMPLEMENT;
    status = Device::hardware(args.hw_info);
    if (status != EMITTER_OK) return status;
    status = Device::describe(args, out);
    if (status != EMITTER_OK) return status;
    if (out->workspace_bytes > 0 && workspace == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (params_capacity < out->params_bytes) return EMITTER_BUFFER_TOO_SMALL;
    // Stream-K / split-K: zero the tile locks and partial sums on the caller's stream.
    if (GemmKernel::initialize_workspace(args, workspace, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess) {
      return EMITTER_CUDA_ERROR;
    }
    Params params = GemmKernel::to_underlying_arguments(args, workspace);
    std::memcpy(params_out, &params, sizeof(Params));
    dim3 grid = GemmKernel::get_grid_shape(params);
    out->grid[0] = static_cast<int>(grid.x);
    out->grid[1] = static_cast<int>(grid.y);
    out->grid[2] = static_cast<int>(grid.z);
    return EMITTER_OK;
  } catch (...) {
    return EMITTER_INTERNAL_ERROR;
  }
}

extern "C" __attribute__((visibility("default"))) const char* emitter_gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity_name(void) {
  return "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_128x256x64_c2x1x1_i64x256x16_sauto_coop_epitma_persistent_al8x8x8_identity";
}
#endif  // EMITTER_DEVICE
