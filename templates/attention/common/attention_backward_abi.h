// emitter attention backward runtime ABI (version 1): the C interface every emitted attention backward
// instance exports from its host shim. Include after templates/common/emitter_abi.h (emitter_status,
// emitter_launch). Python mirror: emitter/families/attention/backward_abi.py (tests compare sizes and offsets);
// keep the layout stable and bump EMITTER_ATTENTION_BACKWARD_ABI_VERSION on any change.
#ifndef EMITTER_ATTENTION_BACKWARD_ABI_H
#define EMITTER_ATTENTION_BACKWARD_ABI_H
#define EMITTER_ATTENTION_BACKWARD_ABI_VERSION 1

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The gradients of one forward attention problem (attention_abi.h: O = softmax(scale * Q K^T + mask) V, query
// head h reads KV head h / (heads_q / heads_kv)) from dO, O and the forward's LSE:
//   dQ = scale * dS K,  dK = scale * sum over the group's query heads of dS^T Q,  dV = same sum of P^T dO,
//   P = exp(scale * Q K^T - LSE) on the visible keys, dS = P * (dO V^T - rowsum(dO * O)).
// The rowsum preprocessing, the group sum of dK / dV (GQA) and the rows that see no key (dQ = 0) are part of
// the one call. Sizes, varlen, masks and LSE addressing are the forward's (attention_abi.h); d_o is laid out
// like o, dq like q, dk like k, dv like v. LSE is the forward's (natural log; -inf on a row without a key).
// Inputs take any (batch, seq, head) strides with the head dim contiguous; the gradients dq, dk, dv must have
// row (seq) strides n * head_dim (dq, dk) and n * head_dim_v (dv) for one n (packed bshd: n = heads; packed
// bhsd: n = 1): the kernel's output tiles derive their row strides from one head count.
typedef struct emitter_attention_backward_problem {
  int32_t batch;            // >= 1 (varlen: the number of sequences)
  int32_t heads_q;          // >= 1
  int32_t heads_kv;         // >= 1, divides heads_q; != heads_q only for GQA instances
  int32_t seq_q;            // >= 1 (varlen: the longest query sequence)
  int32_t seq_k;            // >= 1 (varlen: the longest key sequence)
  int32_t head_dim;         // must equal the instance's head_dim
  int32_t head_dim_v;       // must equal the instance's head_dim_v
  float scale;              // softmax scale of the forward; 0 = 1/sqrt(head_dim)
  int32_t flags;            // reserved, 0
  int32_t total_q;          // varlen: cu_seqlens_q[batch]; 0 otherwise
  int32_t total_k;          // varlen: cu_seqlens_k[batch]; 0 otherwise
  int32_t reserved0;        // 0
  int64_t stride_q[3];      // (batch, seq, head); 0 = packed in the instance's layout
  int64_t stride_k[3];
  int64_t stride_v[3];
  int64_t stride_o[3];
  int64_t stride_do[3];
  int64_t stride_dq[3];
  int64_t stride_dk[3];
  int64_t stride_dv[3];
  int64_t stride_lse[2];    // (batch, head); seq contiguous
  const void* q;
  const void* k;
  const void* v;
  const void* o;            // the forward's output
  const void* d_o;          // the gradient of the loss with respect to o
  const float* lse;         // the forward's LSE (required)
  void* dq;
  void* dk;
  void* dv;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
} emitter_attention_backward_problem;

#ifdef __cplusplus
}
#endif

// Symbols each attention backward instance <name> exports, the same shapes as the forward's:
//   int  emitter_<name>_query(const emitter_attention_backward_problem*, emitter_launch* out);
//   int  emitter_<name>_initialize(const emitter_attention_backward_problem*, void* workspace, void* stream,
//                                   void* params_out, int params_capacity, emitter_launch* out);
//        zeroes the workspace on `stream` where the kernel needs zeros (key splits, GQA arrival counters)
//   const char* emitter_<name>_name(void);
//   int  emitter_<name>_abi_version(void);   // EMITTER_ATTENTION_BACKWARD_ABI_VERSION
//   extern "C" __global__ void emitter_<name>_kernel(Params params);   // one launch: everything above
#endif  // EMITTER_ATTENTION_BACKWARD_ABI_H
