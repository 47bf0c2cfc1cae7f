// See fp8_gemm.h. Layouts as cuBLASLt's FP8 GEMMs require them on Hopper
// ("TN"): the weight w [m, k] row-major is a column-major k x m matrix used
// transposed, the activation x [n, k] a column-major k x n one, D column-major
// m x n = row-major [n, m] BF16.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "fp8_gemm.h"

namespace osprey::bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cublas status " + std::to_string(s));
}

constexpr float kE4M3Max = 448.0f;

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// E4M3 bytes of values uniform in +-0.9 * 448 (random weight bits), scales
// in [1e-4, 2e-4] (a +-0.05 weight's amax / 448).
__global__ void fill_fp8_kernel(__nv_fp8_e4m3* w, int64_t count, float* scale, int64_t rows, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    const float u = hash32(seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(i)) * (1.0f / 4294967296.0f);
    w[i] = __nv_fp8_e4m3((2.0f * u - 1.0f) * 0.9f * kE4M3Max);
    if (i < rows) scale[i] = 1e-4f * (1.0f + u);
  }
}

__global__ void fill_bf16_kernel(__nv_bfloat16* x, int64_t count, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    const float u = hash32(seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(i)) * (1.0f / 4294967296.0f);
    x[i] = __float2bfloat16(4.0f * u - 2.0f);
  }
}

// One block a row: amax over the row (16-byte loads), scale = amax / 448,
// then x / scale rounded to E4M3 (8 values a store). k % 8 == 0.
constexpr int kQuantThreads = 256;
__global__ void __launch_bounds__(kQuantThreads)
    quantize_rows_kernel(const __nv_bfloat16* __restrict__ x, int64_t k, __nv_fp8_e4m3* __restrict__ q,
                         float* __restrict__ scale) {
  __shared__ float red[kQuantThreads / 32];
  const int64_t r = blockIdx.x;
  const uint4* row = reinterpret_cast<const uint4*>(x + r * k);
  const int64_t groups = k / 8;
  float amax = 0.0f;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    const uint4 v = row[g];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, red[w]);
  const float s = amax > 0.0f ? amax / kE4M3Max : 1.0f;
  const float inv = 1.0f / s;
  if (threadIdx.x == 0) scale[r] = s;
  uint2* out = reinterpret_cast<uint2*>(q + r * k);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    const uint4 v = row[g];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
    __nv_fp8_e4m3 o[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      o[2 * e] = __nv_fp8_e4m3(f.x * inv);
      o[2 * e + 1] = __nv_fp8_e4m3(f.y * inv);
    }
    out[g] = *reinterpret_cast<const uint2*>(o);
  }
}

unsigned grid_for(int64_t count) { return static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535 * 4)); }

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// One FP8 GEMM's descriptor and layouts (see the file comment).
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  LtPlan(int64_t m, int64_t k, int64_t n, bool rowwise, bool fast_accum) {
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
    const int8_t fa = fast_accum ? 1 : 0;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)), "fast accum");
    if (rowwise) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)), "a mode");
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)), "b mode");
    }
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, m, k), "layout a");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, n, k), "layout b");
    check(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, m, n, m), "layout d");
  }
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;

  void set_scales(const float* sa, const float* sb) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  }
  // Up to `want` heuristic candidates; *status: the heuristic's status.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates(cublasLtHandle_t lt, size_t ws_bytes, int want,
                                                          cublasStatus_t* status) {
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "pref");
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(want));
    int got = 0;
    *status = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, want, res.data(), &got);
    cublasLtMatmulPreferenceDestroy(pref);
    res.resize(*status == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(got) : 0);
    return res;
  }
  cublasStatus_t run(cublasLtHandle_t lt, const cublasLtMatmulAlgo_t* algo, const void* wp, const void* xp, void* dp,
                     bool accumulate, void* ws, size_t ws_bytes, cudaStream_t stream) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, wp, a, xp, b, &beta, dp, d, dp, d, algo, ws, ws_bytes, stream);
  }
};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

void quantize_rows_e4m3(const void* x, int64_t n, int64_t k, void* q, float* scale, cudaStream_t stream) {
  if (n == 0) return;
  quantize_rows_kernel<<<static_cast<unsigned>(n), kQuantThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), k, static_cast<__nv_fp8_e4m3*>(q), scale);
}

struct Fp8GemmBench::Impl {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::unique_ptr<DevBuf> ws;
  int64_t m = 0, k = 0, max_n = 0;
  size_t wbytes = 0;
  std::vector<std::unique_ptr<DevBuf>> w, wscale;
  std::unique_ptr<DevBuf> x, xq, xscale, out;
  cudaEvent_t e0 = nullptr, e1 = nullptr;

  // Median microseconds per call of enqueue(i), i < calls, as one graph;
  // -1 when a call fails (eagerly or in the capture).
  template <class F>
  double graph_us(int calls, F enqueue) {
    if (!enqueue(0) || cudaStreamSynchronize(stream) != cudaSuccess) return -1;
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    bool ok = true;
    for (int i = 0; i < calls; ++i) ok = enqueue(i) && ok;
    const cudaError_t ce = cudaStreamEndCapture(stream, &g);
    if (!ok || ce != cudaSuccess) {
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();
      return -2;
    }
    cudaGraphExec_t ge = nullptr;
    check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    check(cudaGraphLaunch(ge, stream), "launch");
    check(cudaStreamSynchronize(stream), "sync");
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, stream);
      cudaGraphLaunch(ge, stream);
      cudaEventRecord(e1, stream);
      check(cudaEventSynchronize(e1), "replay");
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 1e3 / calls);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

Fp8GemmBench::Fp8GemmBench() : impl_(std::make_unique<Impl>()) {
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "stream");
  check(cublasLtCreate(&impl_->lt), "cublasLtCreate");
  impl_->ws = std::make_unique<DevBuf>(kWorkspaceBytes);
  check(cudaEventCreate(&impl_->e0), "event");
  check(cudaEventCreate(&impl_->e1), "event");
}

Fp8GemmBench::~Fp8GemmBench() {
  cudaEventDestroy(impl_->e0);
  cudaEventDestroy(impl_->e1);
  cublasLtDestroy(impl_->lt);
  cudaStreamDestroy(impl_->stream);
}

size_t Fp8GemmBench::weight_bytes() const { return impl_->wbytes; }

std::string Fp8GemmBench::check_scales() {
  Impl& s = *impl_;
  const int64_t m = 256, k = 256, n = 64;
  DevBuf a(m * k), b(n * k), d(m * n * 2), sa(m * 4), sb(n * 4);
  std::vector<uint8_t> ones(static_cast<size_t>(m * k), 0x38);  // E4M3 1.0: exponent 7 (bias 7), mantissa 0
  check(cudaMemcpy(a.p, ones.data(), ones.size(), cudaMemcpyHostToDevice), "h2d");
  check(cudaMemcpy(b.p, ones.data(), static_cast<size_t>(n * k), cudaMemcpyHostToDevice), "h2d");
  std::vector<float> va(m), vb(n);
  for (int64_t i = 0; i < m; ++i) va[i] = 0.5f * static_cast<float>(i % 4 + 1);
  for (int64_t j = 0; j < n; ++j) vb[j] = 0.25f * static_cast<float>(j % 3 + 1);
  check(cudaMemcpy(sa.p, va.data(), m * 4, cudaMemcpyHostToDevice), "h2d");
  check(cudaMemcpy(sb.p, vb.data(), n * 4, cudaMemcpyHostToDevice), "h2d");
  std::ostringstream err;
  for (bool rowwise : {false, true}) {
    LtPlan p(m, k, n, rowwise, false);
    p.set_scales(static_cast<float*>(sa.p), static_cast<float*>(sb.p));
    cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
    const auto c = p.candidates(s.lt, kWorkspaceBytes, 1, &hs);
    if (c.empty() || p.run(s.lt, &c[0].algo, a.p, b.p, d.p, false, s.ws->p, kWorkspaceBytes, s.stream) !=
                         CUBLAS_STATUS_SUCCESS) {
      err << (rowwise ? "rowwise" : "scalar") << ": no candidate ran (heuristic status " << hs << "); ";
      continue;
    }
    check(cudaStreamSynchronize(s.stream), "sync");
    std::vector<__nv_bfloat16> h(static_cast<size_t>(m * n));
    check(cudaMemcpy(h.data(), d.p, h.size() * 2, cudaMemcpyDeviceToHost), "d2h");
    int bad = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const float want = static_cast<float>(k) * (rowwise ? va[i] * vb[j] : va[0] * vb[0]);
        const float got = __bfloat162float(h[static_cast<size_t>(j * m + i)]);
        if (got != want && bad++ < 3) {
          err << (rowwise ? "rowwise" : "scalar") << " D[" << j << "," << i << "] = " << got << ", want " << want
              << "; ";
        }
      }
    }
  }
  return err.str();
}

void Fp8GemmBench::set_shape(int64_t m, int64_t k, int64_t max_n) {
  Impl& s = *impl_;
  s.m = m;
  s.k = k;
  s.max_n = max_n;
  s.wbytes = static_cast<size_t>(m * k);
  s.w.clear();
  s.wscale.clear();
  const int copies = static_cast<int>(std::clamp<size_t>(((size_t{256} << 20) + s.wbytes - 1) / s.wbytes, 1, 16));
  for (int c = 0; c < copies; ++c) {
    s.w.push_back(std::make_unique<DevBuf>(s.wbytes));
    s.wscale.push_back(std::make_unique<DevBuf>(static_cast<size_t>(m) * 4));
    fill_fp8_kernel<<<grid_for(m * k), 256, 0, s.stream>>>(static_cast<__nv_fp8_e4m3*>(s.w.back()->p), m * k,
                                                           static_cast<float*>(s.wscale.back()->p), m, 100 + c);
  }
  s.x = std::make_unique<DevBuf>(static_cast<size_t>(max_n * k) * 2);
  s.xq = std::make_unique<DevBuf>(static_cast<size_t>(max_n * k));
  s.xscale = std::make_unique<DevBuf>(static_cast<size_t>(max_n) * 4);
  s.out = std::make_unique<DevBuf>(static_cast<size_t>(max_n * m) * 2);
  fill_bf16_kernel<<<grid_for(max_n * k), 256, 0, s.stream>>>(static_cast<__nv_bfloat16*>(s.x->p), max_n * k, 7);
  quantize_rows_e4m3(s.x->p, max_n, k, s.xq->p, static_cast<float*>(s.xscale->p), s.stream);
  check(cudaStreamSynchronize(s.stream), "set_shape");
}

double Fp8GemmBench::gemm_us(int64_t n, bool rowwise, bool fast_accum, int* algos, std::string* why) {
  Impl& s = *impl_;
  *algos = 0;
  why->clear();
  LtPlan p(s.m, s.k, n, rowwise, fast_accum);
  const size_t copies = s.w.size();
  const int calls = static_cast<int>(copies) * std::max(1, static_cast<int>((8 + copies - 1) / copies));
  double best = -1;
  cublasStatus_t hs = CUBLAS_STATUS_SUCCESS, last = CUBLAS_STATUS_SUCCESS;
  // The heuristic wants the scale pointers set (OUTER_VEC_32F with none is invalid).
  p.set_scales(static_cast<const float*>(s.wscale[0]->p), static_cast<const float*>(s.xscale->p));
  const auto cands = p.candidates(s.lt, kWorkspaceBytes, 8, &hs);
  int capture_failed = 0;
  for (const auto& c : cands) {
    const double us = s.graph_us(calls, [&](int i) {
      const size_t j = static_cast<size_t>(i) % copies;
      p.set_scales(static_cast<const float*>(s.wscale[j]->p), static_cast<const float*>(s.xscale->p));
      last = p.run(s.lt, &c.algo, s.w[j]->p, s.xq->p, s.out->p, false, s.ws->p, kWorkspaceBytes, s.stream);
      return last == CUBLAS_STATUS_SUCCESS;
    });
    if (us == -2) ++capture_failed;
    if (us <= 0) continue;
    ++*algos;
    if (best < 0 || us < best) best = us;
  }
  cudaGetLastError();
  if (best < 0) {
    std::ostringstream w;
    w << "heuristic status " << hs << ", " << cands.size() << " candidates, last matmul status " << last << ", "
      << capture_failed << " failed in capture";
    *why = w.str();
  }
  return best;
}

double Fp8GemmBench::quantize_us(int64_t n) {
  Impl& s = *impl_;
  return s.graph_us(8, [&](int) {
    quantize_rows_e4m3(s.x->p, n, s.k, s.xq->p, static_cast<float*>(s.xscale->p), s.stream);
    return cudaPeekAtLastError() == cudaSuccess;
  });
}

}  // namespace osprey::bench
