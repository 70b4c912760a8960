// A consumer of a library exported with `emitter library ... --name mykernels`: plain C++ and the CUDA
// runtime, no CUDA compiler. For every operation the library's kernels compute on this GPU it runs GEMMs
// through mykernels_gemm (dispatch), checks each result against a host reference in double precision,
// then runs every kernel once by name, checks that fp8 fast-accumulation kernels are picked only with the
// opt-in (problem.fast_accum), and checks the error paths.
//
//   consumer                 all checks
//   consumer --list          the kernels and whether this build has them
//   consumer MxNxK ...       only these shapes (plus the forced-kernel and error checks)
#include <mykernels/mykernels.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(3);                                                                           \
    }                                                                                         \
  } while (0)

// ---- element types on the host -------------------------------------------------------------------
uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

uint16_t to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);   // round to nearest even
}
float from_bf16(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

uint16_t to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return uint16_t(sign | half);
}
float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float f = std::ldexp(float(mant), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

size_t dtype_bytes(int t) {
  switch (t) {
    case MYKERNELS_DTYPE_F16: case MYKERNELS_DTYPE_BF16: return 2;
    case MYKERNELS_DTYPE_F32: case MYKERNELS_DTYPE_TF32: return 4;
    default: return 0;   // not exercised here
  }
}
const char* dtype_name(int t) {
  switch (t) {
    case MYKERNELS_DTYPE_F16: return "f16";
    case MYKERNELS_DTYPE_BF16: return "bf16";
    case MYKERNELS_DTYPE_F32: return "f32";
    case MYKERNELS_DTYPE_TF32: return "tf32";
    default: return "other";
  }
}

// A host matrix of values exactly representable in its type, and its device copy.
struct Matrix {
  int rows = 0, cols = 0, type = 0, layout = 0;
  long long ld = 0;
  std::vector<float> host;       // values as the device holds them
  void* dev = nullptr;

  float at(int i, int j) const { return host[layout == MYKERNELS_LAYOUT_ROW_MAJOR ? size_t(i) * ld + j : size_t(j) * ld + i]; }
  size_t elements() const { return size_t(layout == MYKERNELS_LAYOUT_ROW_MAJOR ? rows : cols) * size_t(ld); }
  size_t bytes() const { return elements() * dtype_bytes(type); }
};

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint32_t next_rand() {
  rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
  return uint32_t(rng_state >> 11);
}

void upload(Matrix& m) {
  std::vector<unsigned char> raw(m.bytes());
  for (size_t i = 0; i < m.elements(); ++i) {
    if (dtype_bytes(m.type) == 2) {
      const uint16_t h = m.type == MYKERNELS_DTYPE_BF16 ? to_bf16(m.host[i]) : to_f16(m.host[i]);
      std::memcpy(&raw[2 * i], &h, 2);
    } else {
      std::memcpy(&raw[4 * i], &m.host[i], 4);
    }
  }
  if (!m.dev) CUDA_CHECK(cudaMalloc(&m.dev, m.bytes()));
  CUDA_CHECK(cudaMemcpy(m.dev, raw.data(), raw.size(), cudaMemcpyHostToDevice));
}

void download(Matrix& m) {
  std::vector<unsigned char> raw(m.bytes());
  CUDA_CHECK(cudaMemcpy(raw.data(), m.dev, raw.size(), cudaMemcpyDeviceToHost));
  m.host.resize(m.elements());
  for (size_t i = 0; i < m.elements(); ++i) {
    if (dtype_bytes(m.type) == 2) {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      m.host[i] = m.type == MYKERNELS_DTYPE_BF16 ? from_bf16(h) : from_f16(h);
    } else {
      std::memcpy(&m.host[i], &raw[4 * i], 4);
    }
  }
}

// Random multiples of 1/4 in [-1, 1] (exact in every type here; many products and sums are exact too).
Matrix make(int rows, int cols, int type, int layout, bool random) {
  Matrix m;
  m.rows = rows; m.cols = cols; m.type = type; m.layout = layout;
  m.ld = layout == MYKERNELS_LAYOUT_ROW_MAJOR ? cols : rows;
  m.host.assign(m.elements(), 0.0f);
  if (random) for (float& v : m.host) v = float(int(next_rand() % 9) - 4) / 4.0f;
  return m;
}

void free_matrix(Matrix& m) {
  if (m.dev) cudaFree(m.dev);
  m.dev = nullptr;
}

double activation(int act, double x) {
  switch (act) {
    case MYKERNELS_ACTIVATION_RELU: return x > 0 ? x : 0;
    case MYKERNELS_ACTIVATION_GELU: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case MYKERNELS_ACTIVATION_SILU: return x / (1.0 + std::exp(-x));
    case MYKERNELS_ACTIVATION_SIGMOID: return 1.0 / (1.0 + std::exp(-x));
    default: return x;
  }
}

struct Op {
  int a, b, c, d, la, lb, lc, act, bias;
  bool operator==(const Op& o) const {
    return a == o.a && b == o.b && c == o.c && d == o.d && la == o.la && lb == o.lb && lc == o.lc && act == o.act && bias == o.bias;
  }
};

std::string op_text(const Op& op) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s*%s+%s->%s %s%s%s act=%d bias=%d", dtype_name(op.a), dtype_name(op.b), dtype_name(op.c),
                dtype_name(op.d), op.la == 1 ? "t" : "n", op.lb == 1 ? "t" : "n", op.lc == 1 ? "t" : "n", op.act, op.bias);
  return buf;
}

int failures = 0, passes = 0;

struct Result {
  mykernels_status status;
  double rel_err;
  bool all_written;
  std::string kernel;
  std::string why;
  double ms;
};

// One GEMM through the library, checked against the host reference.
Result run_gemm(const Op& op, int m, int n, int k, float alpha, float beta, const char* force, cudaStream_t stream,
                bool auto_workspace, int timing_iters) {
  Result r{MYKERNELS_STATUS_SUCCESS, 0.0, true, "", "", 0.0};
  Matrix A = make(m, k, op.a, op.la, true), B = make(k, n, op.b, op.lb, true);
  Matrix C = make(m, n, op.c, op.lc, true), D = make(m, n, op.d, op.lc, false);
  Matrix bias = make(1, op.bias == MYKERNELS_BIAS_PER_ROW ? m : n, op.c, MYKERNELS_LAYOUT_ROW_MAJOR, true);
  upload(A); upload(B);
  if (beta != 0.0f) upload(C);
  if (op.bias) upload(bias);
  CUDA_CHECK(cudaMalloc(&D.dev, D.bytes()));
  CUDA_CHECK(cudaMemset(D.dev, 0xff, D.bytes()));   // poison: NaN in every type here

  mykernels_gemm_problem p;
  mykernels_gemm_problem_init(&p);
  p.m = m; p.n = n; p.k = k;
  p.a_type = op.a; p.b_type = op.b; p.c_type = op.c; p.d_type = op.d;
  p.a_layout = op.la; p.b_layout = op.lb; p.c_layout = op.lc;
  p.activation = op.act; p.bias_kind = op.bias;
  p.A = A.dev; p.B = B.dev; p.C = beta != 0.0f ? C.dev : nullptr; p.D = D.dev;
  p.bias = op.bias ? bias.dev : nullptr;
  p.alpha = alpha; p.beta = beta;
  p.kernel = force;

  mykernels_selection sel;
  std::memset(&sel, 0, sizeof sel);
  sel.struct_size = sizeof sel;
  r.status = mykernels_gemm_select(&p, &sel);
  if (r.status == MYKERNELS_STATUS_SUCCESS) {
    r.kernel = mykernels_kernel_name(sel.kernel);
    char why[128];
    if (sel.tuned == 1) std::snprintf(why, sizeof why, "tuned: won %dx%dx%d", sel.tuned_m, sel.tuned_n, sel.tuned_k);
    else std::snprintf(why, sizeof why, "%s", sel.tuned == 2 ? "forced" : "fallback order");
    r.why = why;
    if (sel.transposed) r.why += ", transposed";
    if (sel.tried) r.why += ", " + std::to_string(sel.tried) + " skipped";
  }
  size_t ws_bytes = 0;
  void* ws = nullptr;
  if (r.status == MYKERNELS_STATUS_SUCCESS && !auto_workspace) {
    r.status = mykernels_gemm_workspace_size(&p, &ws_bytes);
    if (r.status == MYKERNELS_STATUS_SUCCESS && ws_bytes) CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  }
  if (r.status == MYKERNELS_STATUS_SUCCESS) r.status = mykernels_gemm(&p, ws, ws_bytes, stream);
  if (r.status == MYKERNELS_STATUS_SUCCESS) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    download(D);
    for (float v : D.host) r.all_written = r.all_written && !std::isnan(v);
    // reference: every element for small problems, else a deterministic sample (corners included)
    const size_t total = size_t(m) * size_t(n);
    const size_t samples = total <= (1u << 18) ? total : 8192;
    double num = 0, den = 0;
    for (size_t s = 0; s < samples; ++s) {
      int i, j;
      if (samples == total) { i = int(s / n); j = int(s % n); }
      else if (s < 4) { i = (s & 1) ? m - 1 : 0; j = (s & 2) ? n - 1 : 0; }
      else { i = int(next_rand() % uint32_t(m)); j = int(next_rand() % uint32_t(n)); }
      double acc = 0;
      for (int kk = 0; kk < k; ++kk) acc += double(A.at(i, kk)) * double(B.at(kk, j));
      double x = alpha * acc + (beta != 0.0f ? beta * double(C.at(i, j)) : 0.0);
      if (op.bias) x += bias.host[op.bias == MYKERNELS_BIAS_PER_ROW ? i : j];
      const double ref = activation(op.act, x), got = D.at(i, j);
      num += (got - ref) * (got - ref);
      den += ref * ref;
    }
    r.rel_err = std::isnan(num) ? INFINITY : std::sqrt(num / (den > 0 ? den : 1.0));
    if (timing_iters > 0) {
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      // median over event pairs around 10 back-to-back calls each (the host side of a call overlaps
      // the previous kernel rather than being timed)
      std::vector<float> times;
      for (int w = 0; w < 3; ++w) mykernels_gemm(&p, ws, ws_bytes, stream);
      for (int it = 0; it < timing_iters; ++it) {
        CUDA_CHECK(cudaEventRecord(e0, stream));
        for (int rep = 0; rep < 10; ++rep) mykernels_gemm(&p, ws, ws_bytes, stream);
        CUDA_CHECK(cudaEventRecord(e1, stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        times.push_back(ms / 10.0f);
      }
      std::sort(times.begin(), times.end());
      r.ms = times[times.size() / 2];
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  }
  if (ws) cudaFree(ws);
  free_matrix(A); free_matrix(B); free_matrix(C); free_matrix(D); free_matrix(bias);
  return r;
}

double tolerance(const Op& op) {
  return (op.a == MYKERNELS_DTYPE_F32 || op.a == MYKERNELS_DTYPE_TF32) && op.d == MYKERNELS_DTYPE_F32 ? 5e-3 : 1e-2;
}

void report(const char* what, const Op& op, int m, int n, int k, float beta, const Result& r) {
  const bool ok = r.status == MYKERNELS_STATUS_SUCCESS && r.all_written && r.rel_err <= tolerance(op);
  (ok ? passes : failures)++;
  std::printf("%s %-9s %-38s %5dx%5dx%5d beta=%.1f ", ok ? "PASS" : "FAIL", what, op_text(op).c_str(), m, n, k, beta);
  if (r.status != MYKERNELS_STATUS_SUCCESS) {
    std::printf("status=%s: %s\n", mykernels_status_string(r.status), mykernels_last_error());
    return;
  }
  std::printf("rel_err=%.2e%s kernel=%s (%s)", r.rel_err, r.all_written ? "" : " UNWRITTEN", r.kernel.c_str(), r.why.c_str());
  if (r.ms > 0) std::printf(" %.3f ms %.1f TFLOP/s", r.ms, 2.0 * m * n * k / (r.ms * 1e9));
  std::printf("\n");
}

bool parse_shape(const char* s, int* m, int* n, int* k) { return std::sscanf(s, "%dx%dx%d", m, n, k) == 3; }

}  // namespace

int main(int argc, char** argv) {
  std::printf("%s\n", mykernels_version());
  const bool list_only = argc > 1 && std::strcmp(argv[1], "--list") == 0;
  int devices = 0, cc = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device%s\n", list_only ? "" : ": nothing to run");
    if (!list_only) return 2;
  } else {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cc = prop.major * 10 + prop.minor;
    std::printf("device: %s (sm_%d)\n", prop.name, cc);
  }

  std::vector<Op> ops;
  std::vector<std::string> names;
  std::vector<int> fast_kernels;
  for (int i = 0; i < mykernels_kernel_count(); ++i) {
    mykernels_kernel_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (mykernels_get_kernel_info(i, &info) != MYKERNELS_STATUS_SUCCESS) return 3;
    const bool runs = info.available && (info.arch_specific ? cc == info.arch : cc >= info.arch);
    std::printf("  kernel %2d %s %s%s%s\n", i, runs ? "runs   " : (info.available ? "no-arch" : "not-built"), info.name,
                info.tuned_shapes ? (" (tuned for " + std::to_string(info.tuned_shapes) + " shapes)").c_str() : "",
                info.fast_accum ? " [fp8 fast accumulation: opt-in]" : "");
    if (runs && info.fast_accum) fast_kernels.push_back(i);
    if (!runs || !dtype_bytes(info.a_type) || !dtype_bytes(info.b_type) || !dtype_bytes(info.c_type) ||
        !dtype_bytes(info.d_type) || info.activation == MYKERNELS_ACTIVATION_CLAMP || info.batched || info.split_k)
      continue;
    names.push_back(info.name);
    Op op{info.a_type, info.b_type, info.c_type, info.d_type, info.a_layout, info.b_layout, info.c_layout,
          info.activation, info.bias_kind};
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  if (list_only) return 0;

  std::vector<std::vector<int>> shapes;
  for (int i = 1; i < argc; ++i) {
    int m, n, k;
    if (parse_shape(argv[i], &m, &n, &k)) shapes.push_back({m, n, k});
  }
  const bool custom = !shapes.empty();
  // not tile multiples, but leading dimensions multiples of 8 in every layout (16-byte aligned rows)
  if (!custom) shapes = {{128, 128, 64}, {264, 520, 392}, {1000, 1000, 1000}, {64, 4096, 4096}, {4096, 4096, 4096}};

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  for (const Op& op : ops) {
    for (const auto& s : shapes) {
      const bool big = double(s[0]) * s[1] * s[2] >= 1e10;
      for (float beta : {0.0f, 0.5f}) {
        Result r = run_gemm(op, s[0], s[1], s[2], 1.0f, beta, nullptr, stream, beta != 0.0f, big && beta == 0.0f ? 7 : 0);
        report("dispatch", op, s[0], s[1], s[2], beta, r);
      }
    }
    // the same operation with D stored the other way: the library runs D^T = B^T A^T
    Op t = op;
    t.a = op.b; t.b = op.a;
    t.la = op.lb == 1 ? 2 : 1; t.lb = op.la == 1 ? 2 : 1; t.lc = op.lc == 1 ? 2 : 1;
    t.bias = op.bias == 1 ? 2 : op.bias == 2 ? 1 : 0;
    if (std::find(ops.begin(), ops.end(), t) == ops.end()) {
      report("transpose", t, 320, 192, 256, 0.5f, run_gemm(t, 320, 192, 256, 1.0f, 0.5f, nullptr, stream, false, 0));
    }
    // k not a multiple of any kernel's alignment: NOT_SUPPORTED, with the reason, and nothing launched
    Result r = run_gemm(op, 128, 128, 1001, 1.0f, 0.0f, nullptr, stream, false, 0);
    if (r.status == MYKERNELS_STATUS_NOT_SUPPORTED) {
      ++passes;
      std::printf("PASS %-9s %-38s   128x  128x 1001 -> not supported, as expected: %s\n", "misalign", op_text(op).c_str(),
                  mykernels_last_error());
    } else {
      report("misalign", op, 128, 128, 1001, 0.0f, r);   // a kernel with alignment 1 ran it: it must be right
    }
  }
  // fp8 fast accumulation is opt-in: for each fast-accum kernel's operation, dispatch without problem.fast_accum
  // never selects a fast-accum kernel (a full-precision one, or NOT_SUPPORTED); with it, something runs
  for (int index : fast_kernels) {
    mykernels_kernel_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    mykernels_get_kernel_info(index, &info);
    mykernels_gemm_problem p;
    mykernels_gemm_problem_init(&p);
    p.m = p.n = p.k = 1024;
    p.a_type = info.a_type; p.b_type = info.b_type; p.c_type = info.c_type; p.d_type = info.d_type;
    p.a_layout = info.a_layout; p.b_layout = info.b_layout; p.c_layout = info.c_layout;
    p.activation = info.activation; p.bias_kind = info.bias_kind;
    p.clamp_min = -1.0f; p.clamp_max = 1.0f;
    if (info.activation == MYKERNELS_ACTIVATION_CLAMP) continue;   // the bounds are the kernel's: not in kernel_info
    for (int allow = 0; allow <= 1; ++allow) {
      p.fast_accum = allow;
      mykernels_selection sel;
      std::memset(&sel, 0, sizeof sel);
      sel.struct_size = sizeof sel;
      const mykernels_status s = mykernels_gemm_select(&p, &sel);
      mykernels_kernel_info chosen;
      std::memset(&chosen, 0, sizeof chosen);
      chosen.struct_size = sizeof chosen;
      if (s == MYKERNELS_STATUS_SUCCESS) mykernels_get_kernel_info(sel.kernel, &chosen);
      const bool ok = allow ? s == MYKERNELS_STATUS_SUCCESS
                            : (s == MYKERNELS_STATUS_SUCCESS ? !chosen.fast_accum : s == MYKERNELS_STATUS_NOT_SUPPORTED);
      (ok ? passes : failures)++;
      std::printf("%s fastacc   %s fast_accum=%d -> %s\n", ok ? "PASS" : "FAIL", info.name, allow,
                  s == MYKERNELS_STATUS_SUCCESS ? chosen.name : mykernels_last_error());
    }
  }
  // every kernel once, by name
  for (const std::string& name : names) {
    mykernels_kernel_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    mykernels_get_kernel_info(mykernels_kernel_index(name.c_str()), &info);
    Op op{info.a_type, info.b_type, info.c_type, info.d_type, info.a_layout, info.b_layout, info.c_layout, info.activation,
          info.bias_kind};
    const int m = custom ? shapes[0][0] : 384, n = custom ? shapes[0][1] : 256, k = custom ? shapes[0][2] : 512;
    report("forced", op, m, n, k, 0.5f, run_gemm(op, m, n, k, 1.0f, 0.5f, name.c_str(), stream, false, 0));
  }
  // error paths
  {
    mykernels_gemm_problem p;
    mykernels_gemm_problem_init(&p);
    p.kernel = "no_such_kernel";
    p.m = p.n = p.k = 64;
    p.a_type = p.b_type = p.c_type = p.d_type = MYKERNELS_DTYPE_F16;
    p.a_layout = p.b_layout = p.c_layout = MYKERNELS_LAYOUT_ROW_MAJOR;
    const mykernels_status s = mykernels_gemm(&p, nullptr, 0, stream);
    const bool ok = s == MYKERNELS_STATUS_KERNEL_NOT_FOUND;
    (ok ? passes : failures)++;
    std::printf("%s errors    unknown kernel name -> %s: %s\n", ok ? "PASS" : "FAIL", mykernels_status_string(s), mykernels_last_error());
    p.kernel = nullptr;
    p.struct_size = 8;
    const mykernels_status s2 = mykernels_gemm(&p, nullptr, 0, stream);
    const bool ok2 = s2 == MYKERNELS_STATUS_INVALID_ARGUMENT;
    (ok2 ? passes : failures)++;
    std::printf("%s errors    wrong struct_size -> %s: %s\n", ok2 ? "PASS" : "FAIL", mykernels_status_string(s2), mykernels_last_error());
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
