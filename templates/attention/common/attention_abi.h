// emitter attention runtime ABI (version 1): the C interface every emitted attention instance exports from
// its host shim. Include after templates/common/emitter_abi.h (emitter_status, emitter_launch).
// Python mirror: emitter/families/attention/abi.py (tests compare sizes and offsets); keep the layout
// stable and bump EMITTER_ATTENTION_ABI_VERSION on any change.
#ifndef EMITTER_ATTENTION_ABI_H
#define EMITTER_ATTENTION_ABI_H
#define EMITTER_ATTENTION_ABI_VERSION 1

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One forward attention problem: O = softmax(scale * Q K^T + mask) V, per (batch, query head), with the KV
// head h / (heads_q / heads_kv) (GQA / MQA when heads_kv < heads_q). Mask kind, dtype and head dims are the
// instance's; everything here is run time.
//
// Tensors (elements of the instance's dtype; the head dim is always contiguous, stride 1):
//   fixed lengths: Q [batch, seq_q, heads_q, head_dim] addressed as q + b*stride_q[0] + s*stride_q[1] + h*stride_q[2]
//                  (any order of batch/seq/head strides: BSHD, BHSD, ...); K, V likewise with seq_k and heads_kv;
//                  O with seq_q, heads_q and head_dim_v.
//   varlen (cu_seqlens_q and cu_seqlens_k both non-NULL): `batch` sequences packed along the seq axis:
//                  Q [total_q, heads_q, head_dim] addressed as q + (cu_seqlens_q[b] + s)*stride_q[1] + h*stride_q[2]
//                  (stride_*[0] unused, 0); sequence b has cu_seqlens_q[b+1] - cu_seqlens_q[b] queries and
//                  likewise keys; seq_q / seq_k are the largest of those lengths (grid size), total_q / total_k
//                  = cu_seqlens_*[batch]. cu_seqlens arrays are int32 device arrays of batch + 1 entries from 0.
//   LSE (f32, natural log of sum(exp(scale*s)) over the unmasked keys; -inf for a row without one):
//                  fixed: lse + b*stride_lse[0] + h*stride_lse[1] + s;  varlen: lse + h*stride_lse[1] + cu_seqlens_q[b] + s.
//                  NULL = no LSE (an instance compiled without LSE refuses a non-NULL lse).
// Strides are in elements; a stride of 0 where a tensor has more than one index there means "packed in the
// instance's layout" (bshd / bhsd), except stride_lse (packed [batch, heads, seq_q] or [heads, total_q]).
// Causal masks: top-left: query s sees keys j <= s; bottom-right: j <= s + (seq_k_b - seq_q_b) per sequence.
typedef struct emitter_attention_problem {
  int32_t batch;            // >= 1 (varlen: the number of sequences)
  int32_t heads_q;          // >= 1
  int32_t heads_kv;         // >= 1, divides heads_q; != heads_q only for GQA instances
  int32_t seq_q;            // >= 1 (varlen: the longest query sequence)
  int32_t seq_k;            // >= 1 (varlen: the longest key sequence)
  int32_t head_dim;         // must equal the instance's head_dim
  int32_t head_dim_v;       // must equal the instance's head_dim_v
  float scale;              // softmax scale; 0 = 1/sqrt(head_dim)
  int32_t flags;            // reserved, 0 (a nonzero value is EMITTER_CANNOT_IMPLEMENT)
  int32_t total_q;          // varlen: cu_seqlens_q[batch]; 0 otherwise
  int32_t total_k;          // varlen: cu_seqlens_k[batch]; 0 otherwise
  int32_t reserved0;        // 0
  int64_t stride_q[3];      // (batch, seq, head)
  int64_t stride_k[3];
  int64_t stride_v[3];
  int64_t stride_o[3];
  int64_t stride_lse[2];    // (batch, head); seq contiguous
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
} emitter_attention_problem;

#ifdef __cplusplus
}
#endif

// Symbols each attention instance <name> exports (host shim, compiled without EMITTER_DEVICE), the same
// shapes as the GEMM ABI's with the attention problem:
//   int  emitter_<name>_query(const emitter_attention_problem*, emitter_launch* out);
//        can-implement + launch dims + workspace size + Params size/alignment; EMITTER_OK or
//        EMITTER_CANNOT_IMPLEMENT (pointers are not needed and not checked).
//   int  emitter_<name>_initialize(const emitter_attention_problem*, void* workspace, void* stream,
//                                   void* params_out, int params_capacity, emitter_launch* out);
//        checks everything query checks plus pointers and their alignment, initializes the workspace on
//        `stream` when it has one, and writes the kernel Params bytes into params_out (host memory).
//   const char* emitter_<name>_name(void);
//   int  emitter_<name>_abi_version(void);   // EMITTER_ATTENTION_ABI_VERSION
// Device entry (compiled with -DEMITTER_DEVICE to a cubin):
//   extern "C" __global__ void emitter_<name>_kernel(Params params);   // by value, via kernelParams
#endif  // EMITTER_ATTENTION_ABI_H
