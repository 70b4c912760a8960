// emitter runtime ABI (version 3: emitter_gemm_problem.options; version 2: kernel entries take Params by value;
// version 1 took a pointer): the C interface every emitted GEMM instance exports from its host shim.
// Python (ctypes) and exported libraries use these structs; keep the layout stable and bump
// EMITTER_ABI_VERSION on any change.
#ifndef EMITTER_ABI_H
#define EMITTER_ABI_H
#define EMITTER_ABI_VERSION 3

#ifdef __cplusplus
extern "C" {
#endif

enum emitter_status {
  EMITTER_OK = 0,
  EMITTER_CANNOT_IMPLEMENT = 1,   // alignment, shape or mode the instance does not support
  EMITTER_INVALID_ARGUMENT = 2,   // null pointer, negative size, missing workspace
  EMITTER_BUFFER_TOO_SMALL = 3,   // params_capacity smaller than launch->params_bytes
  EMITTER_CUDA_ERROR = 4,         // a CUDA runtime call inside the shim failed
  EMITTER_INTERNAL_ERROR = 5
};

// One GEMM problem: D = act(alpha * op(A) @ op(B) + beta * C + bias), layouts fixed by the instance.
// Leading dimensions and batch strides are in elements; 0 means "packed" (derived from m, n, k).
typedef struct emitter_gemm_problem {
  int m, n, k;
  int batch_count;        // >= 1; > 1 only for batched instances
  int split_k_slices;     // >= 1; > 1 only for split-K instances
  // Run-time tile-scheduler options (sm90a; was reserved0, always 0, in version 2); 0 = the choices the
  // instance was compiled with. Bits 0-3 swizzle (k > 0: max_swizzle_size 1 << (k - 1)), 4-5 raster
  // (1 heuristic, 2 along M, 3 along N, in the caller's terms), 6-7 stream-K reduction (1 deterministic,
  // 2 nondeterministic), 8-15 fp8 promotion interval in wgmma k-steps; other bits 0. A choice the kernel
  // does not have is EMITTER_CANNOT_IMPLEMENT (2.x instances: any nonzero value). emitter/runtime/options.py.
  int options;
  const void* A;
  const void* B;
  const void* C;          // may equal D; may be null when beta == 0
  void* D;
  const void* bias;       // element type = C's; length M (bias: row) or N (bias: column); null otherwise
  long long lda, ldb, ldc, ldd;
  long long batch_stride_A, batch_stride_B, batch_stride_C, batch_stride_D;
  float alpha, beta;
} emitter_gemm_problem;

// Everything a launcher needs, filled by the shim.
typedef struct emitter_launch {
  int grid[3];
  int block[3];
  int cluster[3];               // 1,1,1 when the instance uses no cluster
  int shared_bytes;             // dynamic shared memory per CTA
  int params_bytes;             // size of the kernel Params struct
  int params_align;             // alignof(Params)
  long long workspace_bytes;    // device workspace the kernel needs (0 = none)
} emitter_launch;

#ifdef __cplusplus
}
#endif

// Symbols each instance <name> exports (host shim, compiled without EMITTER_DEVICE):
//   int  emitter_<name>_query(const emitter_gemm_problem*, emitter_launch* out);
//        can_implement + workspace size + params size; EMITTER_OK or EMITTER_CANNOT_IMPLEMENT.
//   int  emitter_<name>_initialize(const emitter_gemm_problem*, void* workspace, void* stream,
//                                   void* params_out, int params_capacity, emitter_launch* out);
//        initializes the workspace on `stream` (CUstream / cudaStream_t; may zero it) and writes the
//        kernel Params bytes into params_out (host memory) and the grid/block/cluster/shared size.
//   const char* emitter_<name>_name(void);
// Device entry (compiled with -DEMITTER_DEVICE to a cubin):
//   extern "C" __global__ void emitter_<name>_kernel(Params params);  // by value (__grid_constant__ on sm90a);
//   launch with cuLaunchKernel's kernelParams array (void* args[] = {&params}), which keeps the Params'
//   64-byte alignment; CU_LAUNCH_PARAM_BUFFER_POINTER (PyCUDA's packed buffer) does not.
#endif  // EMITTER_ABI_H
