// emitter convolution ABI (version 1): the C interface every emitted conv instance exports from its host
// shim. emitter/families/conv/abi.py mirrors these structs with ctypes (tests/test_conv_abi.py compares
// sizes and offsets with a C compiler); keep the layout stable and bump EMITTER_CONV_ABI_VERSION on any change.
// emitter_launch and the status codes are emitter_abi.h's (included before this file).
#ifndef EMITTER_CONV_ABI_H
#define EMITTER_CONV_ABI_H
#define EMITTER_CONV_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

// One convolution, always described by its forward geometry (cross-correlation; grouped: C and K split in groups):
//   x: activations N x D x H x W x C (NDHWC; 2D instances: D = T = Z = 1, pad/stride/dilation [0] = 0/1/1)
//   w: filters     K x T x R x S x C
//   y: output      N x Z x P x Q x K, Z/P/Q = (D/H/W + pad_front + pad_back - dilation*(T/R/S-1) - 1)/stride + 1
// The instance's operation decides what is read and what is written:
//   fprop: y = act(alpha * conv(x, w) + beta * source + bias)        reads x, w; writes y
//   dgrad: x = alpha * conv_input_grad(y, w) + beta * source          reads y (dy), w; writes x (dx)
//   wgrad: w = alpha * conv_weight_grad(y, x) + beta * source         reads y (dy), x; writes w (dw)
// `ptr_source` has the written tensor's shape and strides (may equal the output; null when beta == 0).
// Spatial arrays are indexed [0] = depth, [1] = height, [2] = width. Tensor strides are in elements for
// the four outer modes (N, D, H, W / K, T, R, S / N, Z, P, Q); the channel mode is contiguous; 0 = packed.
typedef struct emitter_conv_problem {
  int n, d, h, w, c;
  int k, t, r, s;
  int z, p, q;                  // output extents: must equal the formula above (0 = derive)
  int pad_front[3];             // padding before (top/left) per spatial dim
  int pad_back[3];              // padding after (bottom/right) per spatial dim
  int stride[3];
  int dilation[3];
  int groups;                   // >= 1, dividing c and k: w is K x T x R x S x C/groups (group_mode instances: > 1)
  int split_k_slices;           // >= 1; > 1 only for split-K instances
  int options;                  // reserved, 0
  int reserved;                 // 0
  long long stride_x[4];        // N, D, H, W strides of x (elements); 0 = packed
  long long stride_w[4];        // K, T, R, S strides of w
  long long stride_y[4];        // N, Z, P, Q strides of y
  const void* ptr_x;
  const void* ptr_w;
  const void* ptr_y;            // the written tensor's pointer is the output (the shim casts const away)
  const void* ptr_source;       // C (beta * source); may be null when beta == 0
  const void* ptr_bias;         // fprop only: K values of the output element type; null = none
  float alpha, beta;
} emitter_conv_problem;

#ifdef __cplusplus
}
#endif

// Symbols each conv instance <name> exports (host shim, compiled without EMITTER_DEVICE):
//   int emitter_<name>_query(const emitter_conv_problem*, emitter_launch* out);
//   int emitter_<name>_initialize(const emitter_conv_problem*, void* workspace, void* stream,
//                                  void* params_out, int params_capacity, emitter_launch* out);
//   const char* emitter_<name>_name(void);
//   int emitter_<name>_conv_abi(void);   // EMITTER_CONV_ABI_VERSION
// Device entry: extern "C" __global__ void emitter_<name>_kernel(Params params) (by value; __grid_constant__ on sm90a).
#endif  // EMITTER_CONV_ABI_H
