// CudaBackend::matmul: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), any weight
// dtype; activations F32 (out F32) or 16-bit BF16/F16 (out the activation
// dtype, or F32 for logits). CudaBackend::matmul_add: residual[n, m] +=
// x @ w^T through the same paths, the add folded into each: the GEMV's
// epilogue reads the old value (accumulate), cuBLASLt and cuBLAS run with
// beta = 1 and C = D = residual (in place: same layout and type), the
// quantised panels accumulate into their columns. One rounding of the fp32
// sum (residual + product) to the activation dtype.
// CudaBackend::rms_norm_matmul(_silu_mul): at GEMV batch sizes on 16-bit
// weights the GEMV reads x itself and folds its RMSNorm in (no normed
// buffer, one kernel fewer; launch_gemv_rms_norm*), else rms_norm + matmul.
//
// Paths (the row thresholds are where a GEMM starts to beat the GEMV):
//   BF16/F16 activations on weights of the same dtype, n <= gemv_max_rows16()
//     (CudaBackendOptions::gemv_max_rows, default 1: cuBLASLt is faster from
//     2 rows), F32 activations or other float weights n <= kDenseGemvMaxRows,
//     quantised weights n <= 4 (kQuantGemvDefaultRows): own GEMV kernels
//     (gemm/gemv.cu), fp32 accumulation;
//   BF16/F16 activations: weights of the activation dtype straight into
//     cuBLASLt (16-bit in, fp32 accumulate, 16-bit/F32 out, plans cached per
//     shape and dtypes); other weight dtypes in panels dequantised to the
//     activation dtype in scratch, then cuBLASLt per panel;
//   F32 activations (the exact fp32 mode):
//     F32 weights: cuBLAS SGEMM (fp32 compute, no TF32);
//     F16/BF16 weights: activations converted to the weight dtype, cuBLAS with
//       fp32 accumulation and fp32 output (tensor cores); with
//       exact_fp32_matmul, like the quantised path instead;
//     quantised weights: panels of weight rows dequantised to fp32 scratch,
//       then SGEMM per panel.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace osprey::cuda {
namespace {

constexpr int64_t kDenseGemvMaxRows = 8;
constexpr int64_t kQuantGemvMaxRows = 4 * kGemvRowsPerPass;  // the most OSPREY_QGEMV_MAX_ROWS allows
// The quantised GEMV's default row limit: it does the n dot products per
// weight block on CUDA cores and its time grows with n (H200, Llama-3-8B
// shapes, BF16 activations, gpu_op_bench gemm-small-quant: Q8_0 gate_up
// 94.8 / 153.5 / 274 / 1097 us at n = 2 / 4 / 8 / 32), while the
// dequantised BF16 panels + cuBLASLt cost the same at every n (162 us), so
// the two meet at ~4 rows for every shape and quantised dtype measured.
constexpr int64_t kQuantGemvDefaultRows = 4;
// fp32 elements of one dequantised weight panel (64 MiB).
constexpr int64_t kPanelElems = int64_t{16} << 20;
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // == the cuBLAS workspace the backend reserves
// Autotuning (lt_gemm): the first call of a shape with at least
// kLtTuneMinRows rows times the heuristic's first kLtCandidates algorithms,
// and the picks of neighbouring buckets (add_neighbour_picks), on the call's
// own operands (kLtTuneReps runs each after one warm-up) and keeps the
// fastest. The winner is remembered per bucket of n and reused,
// after cublasLtMatmulAlgoCheck, for the other n of that bucket, so a server
// that sees many token counts times each weight shape a few times, not once
// per count. Buckets: each n up to 8 (small-batch decode steps), then n
// rounded up to a multiple of 8 up to
// kLtFineTuneMaxRows (the decode graphs' batch sizes are such multiples),
// to a power of two above. An algorithm timed at one n can be far off at
// another n of the same power-of-two bucket (H100, gpu_op_bench gemm-small,
// 2026-11-26, Llama-3-8B shapes, BF16): with power-of-two buckets, n = 96's
// pick run at n = 100-128 took 92-94 us for down (4096x14336) against
// 44-45 us when tuned per multiple of 8, 564-614 us for lm_head against
// 384 us, 27-34 us for o against 15-16 us; the online 100-stream run's ITL
// p50 went from 9.76 to 8.10 ms (docs/PERF.md). The same at n = 257-512
// (H100, 2026-11-26, model_bench --batch 264 --batch 504, Llama-3-8B BF16):
// with the fine buckets ending at 256, n = 504 ran 264's picks and a decode
// step at 504 sequences x 320 tokens took 21.5 ms (graph replay) against
// 19.2 ms with 504's own; offline 128/128 went from 15,962 to 16,808
// output tok/s. Hence multiples of 8 up to 512 (--max-num-seqs 512 graphs).
// Above, multiples of 64 up to kLtMidTuneMaxRows, then powers of two: the
// engine tunes every bucket at its top before serving (matmul_tuning_rows),
// and with power-of-two buckets from 513 the online run's mixed steps of
// 512-575 tokens ran 1024's picks and took 20.6 ms against 13.7 at 448-511
// (H200, 2026-11-26).
// Not timed: calls inside
// graph capture (the engine runs every graph's shape eagerly first, so the
// plan is settled before it is captured). Accumulating calls (beta = 1: a
// pre-filled bias, matmul_add's residual) are timed with C = out and D a
// scratch buffer (tune_out_), so out is written once, by the call itself;
// their plans are keyed and tuned apart from beta = 0 ones.
constexpr int kLtCandidates = 8;
constexpr int64_t kLtTuneMinRows = 2;
constexpr int64_t kLtFineTuneMaxRows = 512;
constexpr int64_t kLtMidTuneMaxRows = 2048;
constexpr int kLtTuneReps = 3;

// OSPREY_LT_FINE_MAX (8..8192, default kLtFineTuneMaxRows): the multiple-of-8
// buckets end at this n (256 = the earlier policy), for A/B runs. Timing 32
// candidates instead of 8, and flushing L2 before each timed run, were tried
// at n = 96-504 on an H100 and changed nothing beyond 0.5% (docs/PERF.md).
int64_t lt_fine_max_rows() {
  static const int64_t n = env_int("OSPREY_LT_FINE_MAX", 8, 8192, kLtFineTuneMaxRows);
  return n;
}

// OSPREY_LT_AUTOTUNE=0: no timing, the heuristic's first choice (for A/B
// runs); =log: also print each timed shape (stderr); =pow2: power-of-two
// buckets for every n (the policy before the multiple-of-8 buckets, for A/B).
enum class TuneMode { kOff, kOn, kLog, kPow2 };
TuneMode tune_mode() {
  static const TuneMode mode = [] {
    if (env_equals("OSPREY_LT_AUTOTUNE", "0")) return TuneMode::kOff;
    if (env_equals("OSPREY_LT_AUTOTUNE", "log")) return TuneMode::kLog;
    if (env_equals("OSPREY_LT_AUTOTUNE", "pow2")) return TuneMode::kPow2;
    return TuneMode::kOn;
  }();
  return mode;
}

int algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int v = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return v;
}

int64_t tune_bucket(int64_t n) {
  if (n <= 8) return n;  // small-batch decode: each n its own pick
  if (n <= lt_fine_max_rows() && tune_mode() != TuneMode::kPow2) return (n + 7) / 8 * 8;
  if (n <= kLtMidTuneMaxRows && tune_mode() != TuneMode::kPow2) return (n + 63) / 64 * 64;
  int64_t b = 16;  // the first power-of-two bucket above the per-n ones
  while (b < n) b <<= 1;
  return b;
}

// OSPREY_GEMV_MAX_ROWS (1..8, read once; 0 or unset: the option).
int64_t env_gemv_max_rows() {
  static const int64_t n = env_int("OSPREY_GEMV_MAX_ROWS", 0, kDenseGemvMaxRows, 0);
  return n;
}

// OSPREY_QGEMV_MAX_ROWS (1..kQuantGemvMaxRows, read once): the quantised
// GEMV's row limit, for A/B runs against the dequantised panels + cuBLASLt
// (gpu_op_bench gemm-small-quant); default kQuantGemvDefaultRows.
int64_t quant_gemv_max_rows() {
  static const int64_t n = env_int("OSPREY_QGEMV_MAX_ROWS", 1, kQuantGemvMaxRows, kQuantGemvDefaultRows);
  return n;
}

bool is_16bit(DType t) {
  return t == DType::kBF16 || t == DType::kF16;
}

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume.
uint64_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint64_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

bool is_weight_dtype(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kF8E4M3:
      return true;
    default:
      return false;
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    default:
      OSP_CHECK_MSG(false, "no cuBLAS type for " << dtype_name(t));
  }
  return CUDA_R_32F;
}

}  // namespace

void CudaBackend::gemm(const void* w, cudaDataType_t w_type, const void* x, cudaDataType_t x_type, int64_t n, int64_t m,
                       int64_t k, float* out, int64_t ldo, bool accumulate) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  OSP_CHECK(n <= kMaxInt && m <= kMaxInt && k <= kMaxInt && ldo <= kMaxInt);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  // Column-major view: out^T [m, n] (ld ldo) = w [k, m]^T * x^T [k, n].
  OSP_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                                static_cast<int>(k), &alpha, w, w_type, static_cast<int>(k), x, x_type,
                                static_cast<int>(k), &beta, out, CUDA_R_32F, static_cast<int>(ldo), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

CudaBackend::LtPlan& CudaBackend::lt_plan(const LtKey& key) {
  auto it = lt_plans_.find(key);
  if (it != lt_plans_.end()) return it->second;
  const auto [n, m, k, ldo, out_type, accumulate, align, in_type] = key;
  (void)accumulate;
  const cudaDataType_t ab_type = cuda_type(static_cast<DType>(in_type));
  LtPlan plan;
  OSP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  OSP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  OSP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  // Column-major view: out^T [m, n] (ld ldo) = (w as [k, m])^T * (x as [k, n]).
  OSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
  OSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  OSP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, cuda_type(static_cast<DType>(out_type)),
                                              static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldo));
  const auto cands = lt_candidates(lt_, plan.desc, plan.a, plan.b, plan.c, align, 1);
  if (!cands.empty()) {
    plan.algo = cands[0].algo;
    plan.ok = true;
  }
  return lt_plans_.emplace(key, plan).first->second;
}

// Up to max_count algorithms the heuristic offers for the layouts, its best
// guess first (empty when it offers none).
std::vector<cublasLtMatmulHeuristicResult_t> CudaBackend::lt_candidates(cublasLtHandle_t lt,
                                                                        cublasLtMatmulDesc_t desc,
                                                                        cublasLtMatrixLayout_t la,
                                                                        cublasLtMatrixLayout_t lb,
                                                                        cublasLtMatrixLayout_t lc, uint64_t align,
                                                                        int max_count) {
  cublasLtMatmulPreference_t pref = nullptr;
  OSP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kLtWorkspaceBytes;
  OSP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = static_cast<uint32_t>(align & 0xffff), al_b = static_cast<uint32_t>((align >> 16) & 0xffff),
                 al_c = static_cast<uint32_t>((align >> 32) & 0xffff);
  OSP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  OSP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  OSP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  OSP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_count));
  int count = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, max_count, results.data(), &count);
  OSP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_SUCCESS) count = 0;
  results.resize(static_cast<size_t>(std::max(count, 0)));
  std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) {
    return r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kLtWorkspaceBytes;
  });
  return results;
}

int64_t matmul_tuning_runs(const ops::Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda ? cuda->matmul_tuning_runs() : -1;
}

std::vector<int64_t> CudaBackend::matmul_tuning_rows(int64_t max_rows) const {
  // One row count per tuning bucket: the bucket's top, or max_rows in the last.
  std::vector<int64_t> rows;
  if (tune_mode() == TuneMode::kOff) return rows;
  // Rows the GEMV takes need no plan.
  for (int64_t n = std::max(kLtTuneMinRows, gemv_max_rows16() + 1); n <= max_rows;) {
    const int64_t b = tune_bucket(n);
    rows.push_back(std::min(b, max_rows));
    n = b + 1;
  }
  return rows;
}

// The algorithms already picked for the same weight shape, dtypes and beta
// at other buckets of n join the heuristic's candidates when they can run
// this call (cublasLtMatmulAlgoCheck) and are not among them already. The
// heuristic's list changes with n, and at some n none of its first
// kLtCandidates is close to what a neighbouring n runs at: down (4096 x
// 14336, BF16) at n = 96 took 48.8-49.8 us against 43.7-44.7 us at n = 88,
// 100, 104 and 120 (H100, gpu_op_bench gemm-small-add, 2026-11-27). Only
// buckets within a factor of two of this one count, each algorithm once.
void CudaBackend::add_neighbour_picks(const LtKey& key, const LtPlan& plan,
                                      std::vector<cublasLtMatmulHeuristicResult_t>& cands) {
  static const bool off = env_equals("OSPREY_LT_NEIGHBOURS", "0");  // A/B: the heuristic's candidates only
  if (off) return;
  // Buckets within a factor of two of this one: the tile shapes that fit.
  const int64_t n = tune_bucket(std::get<0>(key));
  auto same_but_n = [&](const LtKey& other) {
    LtKey a = key, b = other;
    std::get<0>(a) = std::get<0>(b) = 0;
    const int64_t on = std::get<0>(other);
    return a == b && 2 * on >= n && on <= 2 * n;
  };
  auto known = [&](const cublasLtMatmulAlgo_t& algo) {
    return std::any_of(cands.begin(), cands.end(), [&](const cublasLtMatmulHeuristicResult_t& c) {
      return std::memcmp(&c.algo, &algo, sizeof(algo)) == 0;
    });
  };
  for (const auto& [other, algo] : lt_best_) {
    if (!same_but_n(other) || known(algo)) continue;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, &algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kLtWorkspaceBytes) {
      continue;
    }
    check.algo = algo;
    cands.push_back(check);
  }
}

void CudaBackend::lt_tune(const LtKey& key, LtPlan& plan, const void* w, const void* x, void* out) {
  plan.tuned = true;  // settled now, whatever happens below: graph and eager calls of a shape agree
  const int64_t n = std::get<0>(key);
  const bool accumulate = std::get<5>(key);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  OSP_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (!plan.ok || n < kLtTuneMinRows || capture != cudaStreamCaptureStatusNone || tune_mode() == TuneMode::kOff) {
    return;
  }
  LtKey bucket_key = key;
  std::get<0>(bucket_key) = tune_bucket(n);
  if (auto it = lt_best_.find(bucket_key); it != lt_best_.end()) {
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c, &it->second, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kLtWorkspaceBytes) {
      plan.algo = it->second;
      return;
    }
  }
  auto cands = lt_candidates(lt_, plan.desc, plan.a, plan.b, plan.c, std::get<6>(key), kLtCandidates);
  const size_t heuristic_count = cands.size();
  add_neighbour_picks(key, plan, cands);
  if (cands.size() < 2) return;
  ++lt_timings_;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // D of the timed runs: out itself when beta = 0 (each run rewrites it
  // whole, the call's own run below writes it last); with beta = 1 a
  // scratch matrix of out's layout (C = out is only read), so out is
  // updated once, by the call. The scratch grows only, like the others: the
  // engine's warm-up at its largest step sizes it before the KV pool.
  void* d = out;
  if (accumulate) {
    const int64_t ldo = std::get<3>(key);
    const size_t es = static_cast<DType>(std::get<4>(key)) == DType::kF32 ? 4 : 2;
    d = tune_out_.reserve(static_cast<size_t>(n * ldo) * es, stream_);
  }
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  OSP_CUDA_CHECK(cudaEventCreate(&e0));
  OSP_CUDA_CHECK(cudaEventCreate(&e1));
  float best_ms = std::numeric_limits<float>::infinity(), first_ms = 0.0f;
  size_t best_i = 0;
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const auto& c = cands[ci];
    auto run = [&] {
      return cublasLtMatmul(lt_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c, d, plan.c, &c.algo,
                            cublas_workspace_.get(), kLtWorkspaceBytes, stream_);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a candidate that cannot run is skipped
    OSP_CUDA_CHECK(cudaEventRecord(e0, stream_));
    bool ok = true;
    for (int r = 0; r < kLtTuneReps && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
    OSP_CUDA_CHECK(cudaEventRecord(e1, stream_));
    OSP_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    OSP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (ci == 0) first_ms = ok ? ms : 0.0f;
    if (ok && ms < best_ms) {
      best_ms = ms;
      best_i = ci;
      plan.algo = c.algo;
    }
  }
  OSP_CUDA_CHECK(cudaEventDestroy(e0));
  OSP_CUDA_CHECK(cudaEventDestroy(e1));
  if (best_ms < std::numeric_limits<float>::infinity()) {
    lt_best_.emplace(bucket_key, plan.algo);
    if (tune_mode() == TuneMode::kLog) {
      const auto [tn, tm, tk, ldo, out_type, acc, align, in_type] = key;
      (void)ldo, (void)align;
      std::fprintf(stderr,
                   "lt autotune n=%lld m=%lld k=%lld %s->%s%s: %zu candidates (+%zu from other n), heuristic first "
                   "%.1f us, best #%zu "
                   "%.1f us (algo %d tile %d stages %d splitk %d)\n",
                   static_cast<long long>(tn), static_cast<long long>(tm), static_cast<long long>(tk),
                   std::string(dtype_name(static_cast<DType>(in_type))).c_str(),
                   std::string(dtype_name(static_cast<DType>(out_type))).c_str(), acc ? " (beta 1)" : "",
                   heuristic_count, cands.size() - heuristic_count,
                   1e3 * first_ms / kLtTuneReps, best_i, 1e3 * best_ms / kLtTuneReps,
                   algo_attr(plan.algo, CUBLASLT_ALGO_CONFIG_ID), algo_attr(plan.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                   algo_attr(plan.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                   algo_attr(plan.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
    }
  }
}

void CudaBackend::lt_gemm(const void* w, const void* x, int64_t n, int64_t m, int64_t k, DType out_type, void* out,
                          int64_t ldo, bool accumulate, DType in_type, const float* a_scale, const float* b_scale) {
  const bool fp8 = in_type == DType::kF8E4M3;
  OSP_CHECK_MSG(in_type == DType::kBF16 || in_type == DType::kF16 || fp8, "lt_gemm takes BF16, F16 or F8_E4M3 inputs");
  OSP_CHECK_MSG(!fp8 || (a_scale && b_scale), "lt_gemm: an FP8 GEMM needs both scales");
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  OSP_CHECK(n <= kMaxInt && m <= kMaxInt && k <= kMaxInt && ldo <= kMaxInt);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  const uint64_t align = alignment_of(w) | (alignment_of(x) << 16) | (alignment_of(out) << 32);
  const LtKey key{n, m, k, ldo, static_cast<int>(out_type), accumulate, align, static_cast<int>(in_type)};
  LtPlan& plan = lt_plan(key);
  if (fp8) {  // this call's scales (read by the GEMM on the device; timed runs use them too)
    OSP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    OSP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  }
  if (!plan.tuned) lt_tune(key, plan, w, x, out);
  OSP_CHECK_MSG(plan.ok || !fp8, "cuBLASLt offers no FP8 GEMM for n " << n << ", m " << m << ", k " << k);
  if (plan.ok) {
    OSP_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c, out, plan.c,
                                    &plan.algo, cublas_workspace_.get(), kLtWorkspaceBytes, stream_));
    return;
  }
  OSP_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                                static_cast<int>(k), &alpha, w, cuda_type(in_type), static_cast<int>(k), x,
                                cuda_type(in_type), static_cast<int>(k), &beta, out, cuda_type(out_type),
                                static_cast<int>(ldo),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::matmul_bf16(const Tensor& x, const Tensor& w, const float* b, Tensor& out, bool add_to_out) {
  const int64_t m = w.dim(0), k = w.dim(1), n = x.rows();
  const DType ot = out.dtype();
  const DType xt = x.dtype();  // BF16 or F16: the GEMM's input dtype
  if (b) launch_fill_rows(b, n, m, ot, out.data(), m, stream_);
  const bool accumulate = b != nullptr || add_to_out;
  if (w.dtype() == xt) {
    lt_gemm(w.data(), x.data(), n, m, k, ot, out.data(), m, accumulate, xt);
    return;
  }
  // 16-bit panels (dtype xt) of weight rows; multiples of 128 rows keep each panel's
  // output columns 256-byte aligned for cuBLASLt.
  int64_t panel_rows = std::clamp<int64_t>(2 * kPanelElems / k, 1, m);
  if (panel_rows < m && panel_rows > 128) panel_rows = panel_rows / 128 * 128;
  auto* panel = panel_scratch_.reserve(static_cast<size_t>(panel_rows * k) * 2, stream_);
  const auto* wp = static_cast<const char*>(w.data());
  const size_t es = ot == DType::kF32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < m; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, m - r0);
    launch_dequant_rows(w.dtype(), wp + r0 * w.row_bytes(), w.row_bytes(), rows, k, xt, panel, stream_);
    lt_gemm(panel, x.data(), n, rows, k, ot, static_cast<char*>(out.data()) + static_cast<size_t>(r0) * es, m,
            accumulate, xt);
  }
}

void CudaBackend::matmul_fp8(const Tensor& x, const Tensor& w, const float* b, Tensor& out, bool add_to_out) {
  const int64_t m = w.dim(0), k = w.dim(1), n = x.rows();
  const DType xt = x.dtype(), ot = out.dtype();
  OSP_CHECK_MSG(is_16bit(xt) && ot == xt,
                "matmul on F8_E4M3 weights: BF16 or F16 activations and output of their dtype, got "
                    << dtype_name(xt) << " -> " << dtype_name(ot));
  OSP_CHECK_MSG(k % 16 == 0 && m % 16 == 0, "F8_E4M3 weights need rows and columns in multiples of 16, got " << m
                                                                                                         << " x " << k);
  const auto* w_scale = reinterpret_cast<const float*>(static_cast<const char*>(w.data()) + fp8_scale_offset(m, k));
  // One row: the own GEMV on the 16-bit row (weight-read bound; no input quantisation).
  if (n == 1 && launch_gemv_fp8(w.data(), m, k, w_scale, xt, x.data(), b, out.data(), add_to_out, stream_)) return;
  // Scratch: the quantised x (n * k bytes, 256-aligned end), then the amax
  // partials, then x's scale. Grows only (the engine's warm-up sizes it
  // before graphs are captured).
  const int64_t count = n * k;
  const int parts = fp8_amax_parts(count);
  const size_t q_bytes = static_cast<size_t>((count + 255) / 256 * 256);
  auto* s = static_cast<char*>(fp8_act_.reserve(q_bytes + (static_cast<size_t>(parts) + 64) * sizeof(float), stream_));
  auto* partials = reinterpret_cast<float*>(s + q_bytes);
  float* x_scale = partials + (parts + 63) / 64 * 64;
  launch_fp8_quantize(xt, x.data(), count, partials, reinterpret_cast<uint8_t*>(s), x_scale, stream_);
  if (b) launch_fill_rows(b, n, m, ot, out.data(), m, stream_);
  lt_gemm(w.data(), s, n, m, k, ot, out.data(), m, b != nullptr || add_to_out, DType::kF8E4M3, w_scale, x_scale);
}

bool CudaBackend::supports_fp8_weights(DType act) const { return is_16bit(act) && fp8_tensor_cores_; }

Status CudaBackend::quantize_weight_fp8(const Tensor& w, Tensor& q) {
  OSP_CHECK_MSG(w.device() == Device::kCuda && q.device() == Device::kCuda,
                "quantize_weight_fp8: tensors must be in CUDA device memory");
  check_quantize_weight_fp8_args(w, q);
  const int64_t m = w.rows(), k = w.cols();
  bind_device();
  const int parts = fp8_amax_parts(m * k);
  auto* partials = static_cast<float*>(fp8_act_.reserve(static_cast<size_t>(parts) * sizeof(float), stream_));
  auto* scale = reinterpret_cast<float*>(static_cast<char*>(q.data()) + fp8_scale_offset(m, k));
  launch_fp8_quantize(w.dtype(), w.data(), m * k, partials, static_cast<uint8_t*>(q.data()), scale, stream_);
  float host_scale = 0.0f;
  OSP_CUDA_CHECK(cudaMemcpyAsync(&host_scale, scale, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  OSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The scale is +inf when w holds a non-finite value (launch_fp8_quantize).
  if (!std::isfinite(host_scale)) return invalid_argument("the weight holds a non-finite value");
  return {};
}

namespace {

// The operands of matmul / matmul_add: x [n, k] F32/BF16/F16, w [m, k] of a
// weight dtype, out [n, m]; all in device memory.
void check_matmul_operands(const Tensor& x, const Tensor& w, const Tensor& out, const char* what) {
  OSP_CHECK_MSG(x.device() == Device::kCuda && w.device() == Device::kCuda && out.device() == Device::kCuda,
                what << " tensors must be in CUDA device memory");
  OSP_CHECK_EQ(w.ndim(), 2);
  OSP_CHECK_MSG(is_weight_dtype(w.dtype()), what << ": unsupported weight dtype " << dtype_name(w.dtype()));
  OSP_CHECK_EQ(x.cols(), w.dim(1));
  OSP_CHECK_EQ(out.rows(), x.rows());
  OSP_CHECK_EQ(out.cols(), w.dim(0));
  if (dtype_is_quantized(w.dtype())) OSP_CHECK_EQ(w.dim(1) % kQuantBlock, 0);
}

}  // namespace

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) {
  const DType xt = x.dtype(), ot = out.dtype();
  OSP_CHECK_MSG((xt == DType::kF32 && ot == DType::kF32) ||
                    ((xt == DType::kBF16 || xt == DType::kF16) && (ot == xt || ot == DType::kF32)),
                "matmul: activations F32 -> F32, BF16 -> BF16/F32 or F16 -> F16/F32, got " << dtype_name(xt) << " -> "
                                                                                           << dtype_name(ot));
  check_matmul_operands(x, w, out, "matmul");
  const float* b = nullptr;
  if (bias.defined()) {
    OSP_CHECK_MSG(bias.dtype() == DType::kF32 && bias.device() == Device::kCuda,
                  "matmul bias must be F32 on the device");
    OSP_CHECK_EQ(bias.numel(), w.dim(0));
    b = bias.data_as<float>();
  }
  matmul_into(x, w, b, out, false);
}

void CudaBackend::matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) {
  (void)scratch;  // every path adds in place
  const DType xt = x.dtype();
  OSP_CHECK_MSG((xt == DType::kF32 || xt == DType::kBF16 || xt == DType::kF16) && residual.dtype() == xt,
                "matmul_add: x and residual F32, BF16 or F16 of one dtype, got " << dtype_name(xt) << " and "
                                                                                 << dtype_name(residual.dtype()));
  check_matmul_operands(x, w, residual, "matmul_add");
  const char* xb = static_cast<const char*>(x.data());
  const char* rb = static_cast<const char*>(residual.data());
  OSP_CHECK_MSG(x.numel() == 0 || residual.numel() == 0 || xb + x.nbytes() <= rb || rb + residual.nbytes() <= xb,
                "matmul_add: x and residual overlap");
  matmul_into(x, w, nullptr, residual, true);
}

bool CudaBackend::fuses_matmul_add(DType act) const {
  static const bool env_off = env_equals("OSPREY_FUSED_RESIDUAL", "0");
  return options_.fused_residual && !env_off && (act == DType::kBF16 || act == DType::kF16);
}

int64_t CudaBackend::gemv_max_rows16() const {
  const int64_t env = env_gemv_max_rows();
  return env > 0 ? env : std::clamp<int64_t>(options_.gemv_max_rows, 1, kDenseGemvMaxRows);
}

bool CudaBackend::gemv_rows(int64_t n, DType xt, DType wt) const {
  if (dtype_is_quantized(wt)) return n <= quant_gemv_max_rows();
  if (is_16bit(xt) && wt == xt) return n <= gemv_max_rows16();
  return n <= kDenseGemvMaxRows;
}

bool CudaBackend::fuses_rms_norm_matmul(int64_t n, DType act) const {
  static const bool env_off = env_equals("OSPREY_FUSED_NORM", "0");
  return options_.fused_norm && !env_off && is_16bit(act) && n >= 1 && n <= gemv_max_rows16();
}

namespace {

// The operands the folded norm takes (anything else runs the two ops, whose
// own checks report misuse): x [n, k] BF16/F16, norm_w [k] F32, w [rows, k]
// BF16/F16 (or F8_E4M3: its folded kernels take one row, the launchers
// decline more), out [n, cols] of x's dtype, all in device memory.
bool norm_fold_operands(const Tensor& x, const Tensor& norm_w, const Tensor& w, const Tensor& out) {
  const auto on_device = [](const Tensor& t) { return t.defined() && t.device() == Device::kCuda; };
  return on_device(x) && on_device(norm_w) && on_device(w) && on_device(out) && x.ndim() == 2 &&
         (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) && norm_w.dtype() == DType::kF32 &&
         norm_w.numel() == x.cols() && w.ndim() == 2 && w.dim(1) == x.cols() &&
         (w.dtype() == DType::kBF16 || w.dtype() == DType::kF16 || w.dtype() == DType::kF8E4M3) && out.ndim() == 2 &&
         out.rows() == x.rows() && out.dtype() == x.dtype();
}

}  // namespace

void CudaBackend::rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                                  const Tensor& bias, Tensor& normed, Tensor& out) {
  const bool bias_ok = !bias.defined() || (bias.dtype() == DType::kF32 && bias.device() == Device::kCuda &&
                                           bias.numel() == w.dim(0));
  if (bias_ok && norm_fold_operands(x, norm_w, w, out) && out.cols() == w.dim(0) &&
      fuses_rms_norm_matmul(x.rows(), x.dtype())) {
    bind_device();
    const float* b = bias.defined() ? bias.data_as<float>() : nullptr;
    if (launch_gemv_rms_norm(w.dtype(), w.data(), w.row_bytes(), w.dim(0), w.dim(1), x.dtype(), x.data(), x.rows(),
                             norm_w.data_as<float>(), eps, b, out.data(), num_sms_, stream_))
      return;
  }
  ops::Backend::rms_norm_matmul(x, norm_w, eps, w, bias, normed, out);  // rms_norm, then matmul
}

void CudaBackend::rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w_gate_up,
                                           Tensor& normed, Tensor& gate_up, Tensor& out) {
  if (norm_fold_operands(x, norm_w, w_gate_up, out) && w_gate_up.dim(0) == 2 * out.cols() &&
      fuses_rms_norm_matmul(x.rows(), x.dtype())) {
    bind_device();
    const int64_t f = out.cols(), k = x.cols();
    const float* g = norm_w.data_as<float>();
    // One row: norm, gate/up and SiLU-and-mul in one kernel, gate_up unwritten.
    if (x.rows() == 1 && launch_gemv_rms_norm_silu_mul(w_gate_up.dtype(), w_gate_up.data(), w_gate_up.row_bytes(), f,
                                                       k, x.dtype(), x.data(), g, eps, out.data(), num_sms_, stream_))
      return;
    // More rows (or OSPREY_FUSED_SILU=0): the folded-norm GEMV into gate_up, then silu_mul.
    const bool gate_up_ok = gate_up.defined() && gate_up.device() == Device::kCuda && gate_up.ndim() == 2 &&
                            gate_up.rows() == x.rows() && gate_up.cols() == 2 * f && gate_up.dtype() == x.dtype();
    if (gate_up_ok && launch_gemv_rms_norm(w_gate_up.dtype(), w_gate_up.data(), w_gate_up.row_bytes(), 2 * f, k,
                                           x.dtype(), x.data(), x.rows(), g, eps, nullptr, gate_up.data(), num_sms_,
                                           stream_)) {
      silu_mul(gate_up, out);
      return;
    }
  }
  ops::Backend::rms_norm_matmul_silu_mul(x, norm_w, eps, w_gate_up, normed, gate_up, out);
}

void CudaBackend::matmul_into(const Tensor& x, const Tensor& w, const float* b, Tensor& out, bool add_to_out) {
  OSP_CHECK(b == nullptr || !add_to_out);
  const DType xt = x.dtype(), ot = out.dtype();
  const int64_t m = w.dim(0);
  const int64_t k = w.dim(1);
  const int64_t n = x.rows();
  const bool quant = dtype_is_quantized(w.dtype());
  if (n == 0 || m == 0) return;
  bind_device();
  if (k == 0) {  // empty sum: out = bias or 0; matmul_add leaves out as it is
    if (add_to_out) return;
    if (b) {
      launch_fill_rows(b, n, m, ot, out.data(), m, stream_);
    } else {
      OSP_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, static_cast<size_t>(out.nbytes()), stream_));
    }
    return;
  }

  if (w.dtype() == DType::kF8E4M3) {
    matmul_fp8(x, w, b, out, add_to_out);
    return;
  }
  if (gemv_rows(n, xt, w.dtype())) {
    launch_gemv(w.dtype(), w.data(), w.row_bytes(), m, k, xt, x.data(), n, b, ot, out.data(), num_sms_, stream_,
                add_to_out);
    return;
  }
  if (xt == DType::kBF16 || xt == DType::kF16) {
    matmul_bf16(x, w, b, out, add_to_out);
    return;
  }
  float* o = out.data_as<float>();
  const float* xp = x.data_as<float>();
  if (b) launch_fill_rows(b, n, m, DType::kF32, o, m, stream_);
  const bool accumulate = b != nullptr || add_to_out;

  if (w.dtype() == DType::kF32) {
    gemm(w.data(), CUDA_R_32F, xp, CUDA_R_32F, n, m, k, o, m, accumulate);
    return;
  }
  if (!quant && !options_.exact_fp32_matmul) {
    void* xh = act_scratch_.reserve(static_cast<size_t>(n * k) * 2, stream_);
    launch_convert_f32(xp, n * k, w.dtype(), xh, stream_);
    gemm(w.data(), cuda_type(w.dtype()), xh, cuda_type(w.dtype()), n, m, k, o, m, accumulate);
    return;
  }
  // Dequantised fp32 panels of weight rows; each panel fills columns [r0, r0 + rows) of out.
  const int64_t panel_rows = std::clamp<int64_t>(kPanelElems / k, 1, m);
  float* panel = panel_scratch_.reserve_as<float>(static_cast<size_t>(panel_rows * k), stream_);
  const auto* wp = static_cast<const char*>(w.data());
  for (int64_t r0 = 0; r0 < m; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, m - r0);
    launch_dequant_rows(w.dtype(), wp + r0 * w.row_bytes(), w.row_bytes(), rows, k, panel, stream_);
    gemm(panel, CUDA_R_32F, xp, CUDA_R_32F, n, rows, k, o + r0, m, accumulate);
  }
}

}  // namespace osprey::cuda
