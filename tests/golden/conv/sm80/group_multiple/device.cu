// ================================================================================================
// level 6: device -- host side of device::ImplicitGemmConvolution: emitter_conv_problem -> Conv2dProblemSize -> Arguments -> Params
// ================================================================================================
#ifndef EMITTER_DEVICE
using Arguments = typename ConvKernel::Arguments;
using Device = cutlass::conv::device::ImplicitGemmConvolution<ConvKernel>;   // can_implement and workspace only

inline bool aligned_pointer(void const* ptr, int alignment_elements, int element_bits) {
  return ptr == nullptr ||
         reinterpret_cast<uintptr_t>(ptr) % (uintptr_t(alignment_elements) * uintptr_t(element_bits) / 8) == 0;
}

// The four outer strides (elements) of an NDHWC tensor: given (0 = packed) or packed; false if too small.
inline bool outer_strides(int d, int h, int w, int c, const long long* given, long long* out) {
  long long const packed[4] = {(long long)d * h * w * c, (long long)h * w * c, (long long)w * c, c};
  for (int i = 0; i < 4; ++i) {
    out[i] = given[i] ? given[i] : packed[i];
    if (out[i] < packed[i]) return false;
  }
  return true;
}

inline int make_arguments(emitter_conv_problem const* p, bool need_pointers, Arguments* out) {
  if (p == nullptr || out == nullptr) return EMITTER_INVALID_ARGUMENT;
  if (p->n < 1 || p->d < 1 || p->h < 1 || p->w < 1 || p->c < 1 || p->k < 1 || p->t < 1 || p->r < 1 || p->s < 1)
    return EMITTER_INVALID_ARGUMENT;
  for (int i = 0; i < 3; ++i)
    if (p->pad_front[i] < 0 || p->pad_back[i] < 0 || p->stride[i] < 1 || p->dilation[i] < 1) return EMITTER_INVALID_ARGUMENT;
  if (p->split_k_slices < 1 || p->options != 0 || p->reserved != 0) return EMITTER_INVALID_ARGUMENT;
  if (p->groups < 1) return EMITTER_INVALID_ARGUMENT;
  if (p->c % p->groups || p->k % p->groups) return EMITTER_INVALID_ARGUMENT;   // w is K x R x S x C/groups
  if (p->groups == 1) return EMITTER_CANNOT_IMPLEMENT;   // a grouped instance; ungrouped problems run elsewhere
  int const filter_c = p->c / p->groups;
  if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;  // not a split-K instance
  if (p->d != 1 || p->t != 1 || p->pad_front[0] != 0 || p->pad_back[0] != 0 || p->stride[0] != 1 || p->dilation[0] != 1)
    return EMITTER_CANNOT_IMPLEMENT;   // a 2D instance: no depth
  if (p->ptr_bias != nullptr) return EMITTER_CANNOT_IMPLEMENT;   // 2.x instances have no bias epilogue
  int o[3];
  int const in_ext[3] = {p->d, p->h, p->w}, flt[3] = {p->t, p->r, p->s};
  for (int i = 0; i < 3; ++i) {
    long long span = (long long)in_ext[i] + p->pad_front[i] + p->pad_back[i] - (long long)p->dilation[i] * (flt[i] - 1) - 1;
    if (span < 0) return EMITTER_INVALID_ARGUMENT;
    o[i] = int(span / p->stride[i] + 1);
  }
  if ((p->z && p->z != o[0]) || (p->p && p->p != o[1]) || (p->q && p->q != o[2])) return EMITTER_INVALID_ARGUMENT;
  if (need_pointers) {
    if (p->ptr_x == nullptr || p->ptr_w == nullptr || p->ptr_y == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (p->ptr_source == nullptr && p->beta != 0.0f) return EMITTER_INVALID_ARGUMENT;
  }
  long long sx[4], sw[4], sy[4];
  if (!outer_strides(p->d, p->h, p->w, p->c, p->stride_x, sx) || !outer_strides(p->t, p->r, p->s, filter_c, p->stride_w, sw) ||
      !outer_strides(o[0], o[1], o[2], p->k, p->stride_y, sy)) return EMITTER_INVALID_ARGUMENT;

  cutlass::conv::Conv2dProblemSize problem(p->n, p->h, p->w, p->c, p->k, p->r, p->s, o[1], o[2],
                                           p->pad_front[1], p->pad_front[2], p->stride[1], p->stride[2],
                                           p->dilation[1], p->dilation[2], cutlass::conv::Mode::kCrossCorrelation,
                                           p->split_k_slices, p->groups);
  // cutlass::layout::TensorNHWC strides: (W, H, N) in elements
  Layout lx{cutlass::make_Coord(int(sx[3]), int(sx[2]), int(sx[0]))};
  Layout lw{cutlass::make_Coord(int(sw[3]), int(sw[2]), int(sw[0]))};
  Layout ly{cutlass::make_Coord(int(sy[3]), int(sy[2]), int(sy[0]))};
  for (int i = 0; i < 4; ++i)   // 32-bit layout strides
    if (sx[i] > 0x7fffffffLL || sw[i] > 0x7fffffffLL || sy[i] > 0x7fffffffLL) return EMITTER_CANNOT_IMPLEMENT;
  // vector accesses need aligned channel rows
  if (sx[3] % 1 || sw[3] % 1 || sy[3] % 8) return EMITTER_CANNOT_IMPLEMENT;

  void* out_ptr = const_cast<void*>(p->ptr_y);
  void const* src = p->ptr_source != nullptr ? p->ptr_source : out_ptr;   // beta == 0 never reads C
  if (!aligned_pointer(p->ptr_x, kAlignmentA, cutlass::sizeof_bits<ElementA>::value) ||
      !aligned_pointer(p->ptr_w, kAlignmentB, cutlass::sizeof_bits<ElementB>::value) ||
      !aligned_pointer(src, kAlignmentC, cutlass::sizeof_bits<ElementC>::value) ||
      !aligned_pointer(out_ptr, kAlignmentC, cutlass::sizeof_bits<ElementC>::value))
    return EMITTER_CANNOT_IMPLEMENT;

  typename EpilogueOutputOp::Params epilogue(ElementCompute(p->alpha), ElementCompute(p->beta));
  *out = Arguments(problem,
                   {static_cast<ElementA*>(const_cast<void*>(p->ptr_x)), lx},
                   {static_cast<ElementB*>(const_cast<void*>(p->ptr_w)), lw},
                   {static_cast<ElementC*>(const_cast<void*>(src)), ly},
                   {static_cast<ElementC*>(out_ptr), ly},
                   epilogue, cutlass::conv::SplitKMode::kSerial);
  if (Device::can_implement(*out) != cutlass::Status::kSuccess) return EMITTER_CANNOT_IMPLEMENT;
  return EMITTER_OK;
}

inline int describe_launch(Arguments const& args, Params const& params, emitter_launch* out) {
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  ThreadblockSwizzle swizzle;
  dim3 const grid = swizzle.get_grid_shape(params.grid_tiled_shape);
  if (grid.x < 1 || grid.y > 65535 || grid.z > 65535) return EMITTER_CANNOT_IMPLEMENT;
  out->grid[0] = int(grid.x); out->grid[1] = int(grid.y); out->grid[2] = int(grid.z);
  out->block[0] = ConvKernel::kThreadCount; out->block[1] = 1; out->block[2] = 1;
  out->cluster[0] = 1; out->cluster[1] = 1; out->cluster[2] = 1;
  out->shared_bytes = int(sizeof(typename ConvKernel::SharedStorage));
  out->params_bytes = int(sizeof(Params));
  out->params_align = int(alignof(Params));
  out->workspace_bytes = (long long)Device::get_workspace_size(args);   // serial split-K semaphores
  return EMITTER_OK;
}
#endif  // !EMITTER_DEVICE
