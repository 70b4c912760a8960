// ================================================================================================
// level 6: device -- host-side Arguments -> Params, what device::GemmUniversalBase does
// ================================================================================================
#ifndef EMITTER_DEVICE
using Arguments = typename GemmKernel::Arguments;
using Params = typename GemmKernel::Params;
static constexpr cutlass::gemm::GemmUniversalMode kMode = cutlass::gemm::GemmUniversalMode::kGemm;

inline bool aligned_pointer(void const* ptr, int alignment_elements, int element_bits) {
  return ptr == nullptr ||
         reinterpret_cast<uintptr_t>(ptr) % (uintptr_t(alignment_elements) * uintptr_t(element_bits) / 8) == 0;
}

// Fills the kernel's Arguments from an ABI problem (user frame: A row-major M x K,
// B col-major K x N, C/D row-major M x N). need_pointers = false for a size-only query.
inline int make_arguments(emitter_gemm_problem const* p, bool need_pointers, Arguments* out) {
  if (p == nullptr || out == nullptr) return EMITTER_INVALID_ARGUMENT;
  if (p->m < 1 || p->n < 1 || p->k < 1 || p->batch_count < 1 || p->split_k_slices < 1) return EMITTER_INVALID_ARGUMENT;
  if (p->options != 0) return EMITTER_CANNOT_IMPLEMENT;   // run-time scheduler options are CUTLASS 3.x (sm90a) only
  if (p->batch_count != 1) return EMITTER_CANNOT_IMPLEMENT;  // not a batched instance
  if (p->split_k_slices != 1) return EMITTER_CANNOT_IMPLEMENT;  // not a split-K instance
  if (p->bias != nullptr) return EMITTER_CANNOT_IMPLEMENT;  // this instance has no bias epilogue

  long long const m = p->m, n = p->n, k = p->k;
  // leading dimensions (0 = packed) and their minimum
  long long const lda_min = k;
  long long const ldb_min = k;
  long long const ldc_min = n;
  long long const lda = p->lda ? p->lda : lda_min;
  long long const ldb = p->ldb ? p->ldb : ldb_min;
  long long const ldd = p->ldd ? p->ldd : ldc_min;
  long long const ldc = p->C ? (p->ldc ? p->ldc : ldc_min) : ldd;  // without C the kernel gets D's view (never read)
  if (lda < lda_min || ldb < ldb_min || ldc < ldc_min || ldd < ldc_min) return EMITTER_INVALID_ARGUMENT;
  // batch strides (0 = packed)
  long long const bsa = p->batch_stride_A ? p->batch_stride_A : lda * m;
  long long const bsb = p->batch_stride_B ? p->batch_stride_B : ldb * n;
  long long const bsd = p->batch_stride_D ? p->batch_stride_D : ldd * m;
  long long const bsc = p->C ? (p->batch_stride_C ? p->batch_stride_C : ldc * m) : bsd;
  if (bsa < 0 || bsb < 0 || bsc < 0 || bsd < 0) return EMITTER_INVALID_ARGUMENT;
  void const* ptr_c = p->C ? p->C : p->D;
  if (need_pointers) {
    if (p->A == nullptr || p->B == nullptr || p->D == nullptr) return EMITTER_INVALID_ARGUMENT;
    if (p->C == nullptr && p->beta != 0.0f) return EMITTER_INVALID_ARGUMENT;
  }

  // the kernel's frame
  int const km = p->m, kn = p->n;
  void const* ptr_a = p->A; void const* ptr_b = p->B;
  long long const kld_a = lda, kld_b = ldb, kbs_a = bsa, kbs_b = bsb;
  // vector accesses need aligned leading dimensions, batch strides and pointers
  if (kld_a % kAlignmentA || kld_b % kAlignmentB || ldc % kAlignmentC || ldd % kAlignmentC) return EMITTER_CANNOT_IMPLEMENT;
  if (!aligned_pointer(ptr_a, kAlignmentA, cutlass::sizeof_bits<ElementA>::value) ||
      !aligned_pointer(ptr_b, kAlignmentB, cutlass::sizeof_bits<ElementB>::value) ||
      !aligned_pointer(ptr_c, kAlignmentC, cutlass::sizeof_bits<ElementC>::value) ||
      !aligned_pointer(p->D, kAlignmentC, cutlass::sizeof_bits<ElementC>::value))
    return EMITTER_CANNOT_IMPLEMENT;

  typename EpilogueOutputOp::Params epilogue(ElementCompute(p->alpha), ElementCompute(p->beta));
  int const batch_count = 1;
  *out = Arguments(kMode, cutlass::gemm::GemmCoord(km, kn, p->k), batch_count, epilogue,
                   ptr_a, ptr_b, ptr_c, p->D, kbs_a, kbs_b, bsc, bsd,
                   typename LayoutA::Stride::LongIndex(kld_a), typename LayoutB::Stride::LongIndex(kld_b),
                   typename LayoutC::Stride::LongIndex(ldc), typename LayoutC::Stride::LongIndex(ldd));
  if (GemmKernel::can_implement(*out) != cutlass::Status::kSuccess) return EMITTER_CANNOT_IMPLEMENT;
  return EMITTER_OK;
}

// Grid, block, shared memory, Params size and workspace for these Params.
inline int describe_launch(Params const& params, emitter_launch* out) {
  if (out == nullptr) return EMITTER_INVALID_ARGUMENT;
  dim3 const grid = params.get_grid_dims();
  if (grid.x < 1 || grid.y > 65535 || grid.z > 65535) return EMITTER_CANNOT_IMPLEMENT;
  out->grid[0] = int(grid.x); out->grid[1] = int(grid.y); out->grid[2] = int(grid.z);
  out->block[0] = GemmKernel::kThreadCount; out->block[1] = 1; out->block[2] = 1;
  out->cluster[0] = 1; out->cluster[1] = 1; out->cluster[2] = 1;
  out->shared_bytes = int(sizeof(typename GemmKernel::SharedStorage));
  out->params_bytes = int(sizeof(Params));
  out->params_align = int(alignof(Params));
  out->workspace_bytes = (long long)params.get_workspace_size();  // serial split-K semaphores
  return EMITTER_OK;
}
#endif  // !EMITTER_DEVICE
