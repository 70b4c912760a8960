// emitter: an empty stand-in for <curand_kernel.h>, which the CUDA install emitter targets does not ship.
//
// CUTLASS's examples/41_fused_multi_head_attention/kernel_forward.h includes <curand_kernel.h> unconditionally,
// but uses curand (curandStatePhilox4_32_10_t, curand_init, skipahead, curand_uniform4) only inside
// `#ifdef HAS_PYTORCH` blocks (the dropout path). emitter never defines HAS_PYTORCH and instantiates the kernel
// with kSupportsDropout = false, so no curand declaration is needed; if anything ever did use one, the compile
// fails with an undeclared identifier (never a silent miscompile). The build puts this directory on the include
// path of attention sm80 instances only (emitter.families.attention.build_include_dirs).
#ifndef EMITTER_CURAND_KERNEL_STUB_H
#define EMITTER_CURAND_KERNEL_STUB_H
#ifdef HAS_PYTORCH
#error "emitter's <curand_kernel.h> stand-in has no curand: HAS_PYTORCH (the dropout path) is not supported"
#endif
#endif
