// ================================================================================================
// level 5: device -- host half of GemmUniversalAdapter: emitter_gemm_problem -> Arguments
// ================================================================================================
#if !defined(EMITTER_DEVICE)
struct Device {
  using Arguments = typename GemmKernel::Arguments;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::StrideD;

  static bool aligned(const void* ptr, int bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0;
  }

  // Leading dimension: 0 = packed; otherwise at least the extent it spans.
  static bool leading(long long given, long long packed, long long& out) {
    out = given == 0 ? packed : given;
    return given >= 0 && out >= packed;
  }

  // SM count for the persistent / stream-K grid (the shim runs in-process with the caller's context).
  // Called after can_implement, which needs no device: a problem the kernel cannot run is refused as
  // such (EMITTER_CANNOT_IMPLEMENT) on any machine, a GPU or none, and CI can check that.
  static int hardware(cutlass::KernelHardwareInfo& hw) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return EMITTER_CUDA_ERROR;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return EMITTER_CUDA_ERROR;
    hw.device_id = device;
    hw.sm_count = sms;
    return EMITTER_OK;
  }

  static int arguments(const emitter_gemm_problem* caller, Arguments& args) {
    if (caller == nullptr) return EMITTER_INVALID_ARGUMENT;
    const emitter_gemm_problem* p = caller;
    if (p->m < 1 || p->n < 1 || p->k < 1 || p->batch_count < 1 || p->split_k_slices < 1) return EMITTER_INVALID_ARGUMENT;
    if (p->A == nullptr || p->B == nullptr || p->D == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (p->C == nullptr && p->beta != 0.0f) return EMITTER_INVALID_ARGUMENT;
    if (p->batch_count != 1) return EMITTER_CANNOT_IMPLEMENT;  // not a batched instance
    if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;  // not a split-K instance
    // Beta == 0 never reads C; the epilogue still wants a valid address, so point it at D.
    const void* C = p->C != nullptr ? p->C : p->D;
    if (!aligned(p->A, 16) || !aligned(p->B, 16) ||
        !aligned(C, 16) ||
        !aligned(p->D, 16)) return EMITTER_CANNOT_IMPLEMENT;

    const long long M = p->m, N = p->n, K = p->k;
    long long lda, ldb, ldc, ldd;
    if (!leading(p->lda, K, lda) || !leading(p->ldb, K, ldb) ||
        !leading(p->ldc, N, ldc) || !leading(p->ldd, N, ldd)) return EMITTER_INVALID_ARGUMENT;
    if (p->batch_stride_A < 0 || p->batch_stride_B < 0 || p->batch_stride_C < 0 || p->batch_stride_D < 0) return EMITTER_INVALID_ARGUMENT;
    const long long bsA = p->batch_stride_A ? p->batch_stride_A : lda * M;
    const long long bsB = p->batch_stride_B ? p->batch_stride_B : ldb * N;
    const long long bsC = p->batch_stride_C ? p->batch_stride_C : ldc * M;
    const long long bsD = p->batch_stride_D ? p->batch_stride_D : ldd * M;

    StrideA dA{};
    cute::get<0>(dA) = lda;
    cute::get<2>(dA) = bsA;
    StrideB dB{};
    cute::get<0>(dB) = ldb;
    cute::get<2>(dB) = bsB;
    StrideC dC{};
    cute::get<0>(dC) = ldc;
    cute::get<2>(dC) = bsC;
    StrideD dD{};
    cute::get<0>(dD) = ldd;
    cute::get<2>(dD) = bsD;

    args = Arguments{};
    args.mode = p->batch_count > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = ProblemShape{p->m, p->n, p->k, p->batch_count};
    args.mainloop = {static_cast<ElementA const*>(p->A), dA, static_cast<ElementB const*>(p->B), dB};
    args.epilogue.thread.alpha = ElementCompute(p->alpha);
    args.epilogue.thread.beta = ElementCompute(p->beta);
    args.epilogue.ptr_C = static_cast<ElementC const*>(C);
    args.epilogue.dC = dC;
    args.epilogue.ptr_D = static_cast<ElementD*>(p->D);
    args.epilogue.dD = dD;
    // Run-time scheduler options (emitter_gemm_problem.options; 0 = the choices compiled in above): each set
    // field overrides one argument of this same kernel, in the caller's terms (emitter/runtime/options.py).
    const int options = caller->options;
    if (options != 0) {
      if (options & ~0xFFFF) return EMITTER_INVALID_ARGUMENT;
      const int swizzle = options & 0xF, raster = (options >> 4) & 0x3, reduction = (options >> 6) & 0x3;
      const int promotion = (options >> 8) & 0xFF;
      if (swizzle > 4 || reduction == 3) return EMITTER_INVALID_ARGUMENT;
      if (swizzle) args.scheduler.max_swizzle_size = 1 << (swizzle - 1);
      using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
      if (raster == 1) args.scheduler.raster_order = Raster::Heuristic;
      if (raster == 2) args.scheduler.raster_order = Raster::AlongM;
      if (raster == 3) args.scheduler.raster_order = Raster::AlongN;
      if (reduction == 2) return EMITTER_CANNOT_IMPLEMENT;   // nothing to reduce: no stream-K / split-K here
      if (promotion) return EMITTER_CANNOT_IMPLEMENT;   // no fp8 promotion in this mainloop
    }
    return EMITTER_OK;   // hw_info (SM count) comes after can_implement: hardware()
  }

  // Everything but the grid, which needs Params (initialize).
  static int describe(Arguments const& args, emitter_launch* out) {
    out->grid[0] = out->grid[1] = out->grid[2] = 0;
    dim3 block = GemmKernel::get_block_shape();
    out->block[0] = static_cast<int>(block.x);
    out->block[1] = static_cast<int>(block.y);
    out->block[2] = static_cast<int>(block.z);
    out->cluster[0] = 2;
    out->cluster[1] = 1;
    out->cluster[2] = 1;
    out->shared_bytes = static_cast<int>(GemmKernel::SharedStorageSize);
    out->params_bytes = static_cast<int>(sizeof(Params));
    out->params_align = static_cast<int>(alignof(Params));
    out->workspace_bytes = static_cast<long long>(GemmKernel::get_workspace_size(args));
    return EMITTER_OK;
  }
};
#endif  // !EMITTER_DEVICE
