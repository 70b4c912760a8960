// ================================================================================================
// level 5: device -- host half of ConvUniversalAdapter: emitter_conv_problem -> ConvProblemShape -> Arguments
// ================================================================================================
#if !defined(EMITTER_DEVICE)
struct Device {
  using Arguments = typename ConvKernel::Arguments;
  using StrideC = typename ConvKernel::StrideC;
  using StrideD = typename ConvKernel::StrideD;
  using TensorExtent = typename ProblemShape::TensorExtent;
  using TensorStride = typename ProblemShape::TensorStride;
  static constexpr int RankT = ProblemShape::RankT;

  static bool aligned(const void* ptr, int bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(bytes) == 0;
  }

  static int hardware(cutlass::KernelHardwareInfo& hw) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return EMITTER_CUDA_ERROR;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return EMITTER_CUDA_ERROR;
    hw.device_id = device;
    hw.sm_count = sms;
    return EMITTER_OK;
  }

  // Extents [outer..., C] and strides (elements, 0 = packed) of one NDHWC tensor, in the problem's rank.
  // `align`: elements the tensor's rows must be a multiple of (TMA moves 16-byte rows).
  static bool tensor(int n, int d, int h, int w, int c, const long long* given, int align, TensorExtent& shape,
                     TensorStride& stride) {
    if (d != 1) return false;
    long long const ext[4] = {n, h, w, c};
    long long const packed[3] = {(long long)h * w * c, (long long)w * c, c};
    long long const in[3] = {given[0], given[2], given[3]};   // N, H, W strides (the D stride is unused)
    for (int i = 0; i < 4; ++i) shape[i] = int(ext[i]);
    for (int i = 0; i < 3; ++i) {
      long long s = in[i] ? in[i] : packed[i];
      if (s < packed[i] || s % align) return false;
      stride[i] = s;
    }
    stride[3] = 1;
    return true;
  }

  static int arguments(const emitter_conv_problem* p, Arguments& args) {
    if (p == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (p->n < 1 || p->d < 1 || p->h < 1 || p->w < 1 || p->c < 1 || p->k < 1 || p->t < 1 || p->r < 1 || p->s < 1)
      return EMITTER_INVALID_ARGUMENT;
    for (int i = 0; i < 3; ++i)
      if (p->pad_front[i] < 0 || p->pad_back[i] < 0 || p->stride[i] < 1 || p->dilation[i] < 1) return EMITTER_INVALID_ARGUMENT;
    if (p->split_k_slices < 1) return EMITTER_INVALID_ARGUMENT;
    if (p->options != 0 || p->reserved != 0) return EMITTER_INVALID_ARGUMENT;
    if (p->groups != 1) return EMITTER_CANNOT_IMPLEMENT;        // grouped convolution: not in these kernels
    if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;  // no split-K in the sm90 conv kernel
    if (p->d != 1 || p->t != 1 || p->pad_front[0] != 0 || p->pad_back[0] != 0 || p->stride[0] != 1 || p->dilation[0] != 1)
      return EMITTER_CANNOT_IMPLEMENT;   // a 2D instance: no depth
    // output extents from the forward geometry
    int out[3];
    int const in_ext[3] = {p->d, p->h, p->w}, flt[3] = {p->t, p->r, p->s};
    for (int i = 0; i < 3; ++i) {
      long long span = (long long)in_ext[i] + p->pad_front[i] + p->pad_back[i] - (long long)p->dilation[i] * (flt[i] - 1) - 1;
      if (span < 0) return EMITTER_INVALID_ARGUMENT;
      out[i] = int(span / p->stride[i] + 1);
    }
    if ((p->z && p->z != out[0]) || (p->p && p->p != out[1]) || (p->q && p->q != out[2])) return EMITTER_INVALID_ARGUMENT;
    if (p->ptr_x == nullptr || p->ptr_w == nullptr || p->ptr_y == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (p->ptr_source == nullptr && p->beta != 0.0f) return EMITTER_INVALID_ARGUMENT;
    if (p->ptr_bias != nullptr) return EMITTER_CANNOT_IMPLEMENT;   // no bias epilogue in this instance

    TensorExtent shape_x{}, shape_w{}, shape_y{};
    TensorStride stride_x{}, stride_w{}, stride_y{};
    if (!tensor(p->n, p->d, p->h, p->w, p->c, p->stride_x, 8, shape_x, stride_x) ||
        !tensor(p->k, p->t, p->r, p->s, p->c, p->stride_w, 8, shape_w, stride_w) ||
        !tensor(p->n, out[0], out[1], out[2], p->k, p->stride_y, 8, shape_y, stride_y))
      return EMITTER_CANNOT_IMPLEMENT;   // rows (channels) not a multiple of the 16-byte TMA granule
    typename ProblemShape::ShapePadding lower{}, upper{};
    typename ProblemShape::TraversalStride tstride{};
    typename ProblemShape::ShapeDilation dilation{};
    for (int i = 0; i < kSpatialDims; ++i) {
      int const j = 3 - kSpatialDims + i;   // 2D: height, width
      lower[i] = p->pad_front[j];
      upper[i] = p->pad_back[j];
      tstride[i] = p->stride[j];
      dilation[i] = p->dilation[j];
    }
    // The activation / filter / output tensors in CUTLASS's forward terms; the op picks A, B and C from them.
    ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, shape_x, stride_x, shape_w, stride_w, stride_y,
                         lower, upper, tstride, dilation, 1);
    for (int i = 0; i < RankT; ++i)
      if (problem.shape_C[i] != (shape_y)[i]) return EMITTER_INVALID_ARGUMENT;   // output geometry disagrees

    void* out_ptr = const_cast<void*>(p->ptr_y);
    const void* src = p->ptr_source != nullptr ? p->ptr_source : out_ptr;   // beta == 0 never reads C
    if (!aligned(p->ptr_x, 16) || !aligned(p->ptr_w, 16) || !aligned(src, 16) ||
        !aligned(out_ptr, 16)) return EMITTER_CANNOT_IMPLEMENT;

    StrideC dC{};
    StrideD dD{};
    // the epilogue's C/D strides come from the problem (what ConvUniversalAdapter's callers fill in)
    cute::for_each(cute::make_seq<cute::rank<0>(StrideC{})>{}, [&](auto i) {
      cute::get<0, i>(dC) = problem.stride_C[RankT - 2 - i];
    });
    cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(dD) = problem.stride_C[RankT - 2 - i];
    });
    args = Arguments{};
    args.problem_shape = problem;
    args.mainloop = {static_cast<ElementA const*>(p->ptr_x), static_cast<ElementB const*>(p->ptr_w)};
    args.epilogue.thread.alpha = ElementCompute(p->alpha);
    args.epilogue.thread.beta = ElementCompute(p->beta);
    args.epilogue.ptr_C = static_cast<ElementC const*>(src);
    args.epilogue.dC = dC;
    args.epilogue.ptr_D = static_cast<ElementD*>(out_ptr);
    args.epilogue.dD = dD;
    return EMITTER_OK;
  }

  static int describe(Arguments const& args, emitter_launch* out) {
    out->grid[0] = out->grid[1] = out->grid[2] = 0;
    dim3 block = ConvKernel::get_block_shape();
    out->block[0] = static_cast<int>(block.x);
    out->block[1] = static_cast<int>(block.y);
    out->block[2] = static_cast<int>(block.z);
    out->cluster[0] = 1;
    out->cluster[1] = 1;
    out->cluster[2] = 1;
    out->shared_bytes = static_cast<int>(ConvKernel::SharedStorageSize);
    out->params_bytes = static_cast<int>(sizeof(Params));
    out->params_align = static_cast<int>(alignof(Params));
    out->workspace_bytes = static_cast<long long>(ConvKernel::get_workspace_size(args));
    return EMITTER_OK;
  }
};
#endif  // !EMITTER_DEVICE
