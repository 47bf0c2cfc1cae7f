// CudaBackend::matmul_add: residual[n, m] += x[n, k] @ w[m, k]^T with the add
// folded into the GEMV epilogue, cuBLASLt's (and cuBLAS') beta = 1 in place
// or the quantised panels' accumulation.
//  - Against a float64 reference of residual + x @ w^T: BF16, F16 and F32
//    activations, every weight dtype, n = 1..2048 across the GEMV / cuBLASLt
//    thresholds (n >= 16: the shape's first call autotunes, and the residual
//    must still be added exactly once), one k not a multiple of 64.
//  - GEMV rows: bit for bit matmul into F32 plus one fp32 add, rounded once.
//  - Captured in a CUDA graph: each replay adds once more, bit for bit the
//    eager calls.
//  - The fused decode chain queued (programmatic dependent launch) and as a
//    graph, bit for bit the same ops serialised.
//  - Model::forward with the fused residual (the default on CUDA at 16-bit
//    activations) against the unfused sequence (CudaBackendOptions::
//    fused_residual = false), prefill and decode steps.
// Operand values are bf16 numbers of magnitude >= 2^-10 (or 0), so they are
// exact in F16, BF16 and F32 alike and one float64 reference serves every
// activation dtype.
#include <cmath>
#include <cstdlib>
#include <string>

#include "batch_runner.h"
#include "model/model.h"

namespace osprey::gpu_test {
namespace {

// Uniform values in [lo, hi) rounded to bf16, small ones flushed to 0.
std::vector<float> exact_values(size_t count, uint32_t seed, float lo, float hi) {
  std::vector<float> v = round_bf16(random_floats(count, seed, lo, hi));
  for (float& x : v)
    if (std::fabs(x) < 1.0f / 1024) x = 0.0f;
  return v;
}

size_t elem_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// v (exact in t) as t's bytes.
std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * elem_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t == DType::kF16 ? f32_to_fp16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<float> decode(DType t, const std::vector<uint8_t>& b) {
  std::vector<float> out(b.size() / elem_size(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = t == DType::kF16 ? fp16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return out;
}

// f rounded once to t (round to nearest even).
float round_once(DType t, float f) {
  if (t == DType::kF16) return fp16_to_f32(f32_to_fp16(f));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(f));
  return f;
}

struct Tol {
  double nmse, max_rel;
};
// The result rounded once to the activation dtype; weights of another dtype
// rounded to it on the GEMM's panel path. F32: fp32 order differences only.
Tol tol_for(DType act) {
  switch (act) {
    case DType::kBF16:
      return {3e-5, 2e-2};
    case DType::kF16:
      return {2e-6, 5e-3};
    default:
      return {1e-10, 1e-5};
  }
}

constexpr DType kWeightTypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};
constexpr DType kActTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// Rows at which the GEMV runs for activations of dtype at (matmul.cpp:
// gemv_rows; the default CudaBackendOptions::gemv_max_rows of 1 for 16-bit
// activations on weights of their dtype, kDenseGemvMaxRows = 8 for other
// float weights, kQuantGemvDefaultRows = 4 for quantised ones). Not known
// under OSPREY_GEMV_MAX_ROWS / OSPREY_QGEMV_MAX_ROWS: the GEMV-only check
// below is then skipped.
bool gemv_rows(DType wt, DType at, int64_t n) {
  if (dtype_is_quantized(wt)) return n <= 4;
  if ((at == DType::kBF16 || at == DType::kF16) && wt == at) return n <= 1;
  return n <= 8;
}

class MatmulAddTest : public GpuTest {};

TEST_F(MatmulAddTest, MatchesFloat64ReferenceEveryDtypeAndPath) {
  struct Shape {
    int64_t m, k, max_n;
  };
  // Llama-ish, small: (256, 512) up to 2048 rows; (512, 1024); k = 352 is not a multiple of 64.
  const Shape shapes[] = {{256, 512, 2048}, {512, 1024, 300}, {384, 352, 300}};
  const int64_t ns[] = {1, 3, 8, 9, 17, 96, 300, 2048};
  uint32_t seed = 11000;
  for (const Shape& sh : shapes) {
    const int64_t m = sh.m, k = sh.k;
    const auto xs = exact_values(static_cast<size_t>(sh.max_n * k), seed += 3, -1.0f, 1.0f);
    const auto r0 = exact_values(static_cast<size_t>(sh.max_n * m), seed += 3, -2.0f, 2.0f);
    for (DType wt : kWeightTypes) {
      const auto packed = pack(wt, exact_values(static_cast<size_t>(m * k), seed += 3, -0.1f, 0.1f), m, k);
      const auto wd = unpack(wt, packed, m, k);
      // prod[i, j] = x row i . w row j for every row any n uses.
      std::vector<double> prod(static_cast<size_t>(sh.max_n * m));
      for (int64_t i = 0; i < sh.max_n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double s = 0;
          const float* xr = xs.data() + i * k;
          const double* wr = wd.data() + j * k;
          for (int64_t c = 0; c < k; ++c) s += double{xr[c]} * wr[c];
          prod[static_cast<size_t>(i * m + j)] = s;
        }
      DeviceMem gw = upload_bytes(gpu(), packed.data(), packed.size());
      const Tensor w = dev_tensor(gw, wt, {m, k});
      for (DType at : kActTypes) {
        const Tol tol = tol_for(at);
        for (int64_t n : ns) {
          if (n > sh.max_n) continue;
          const std::string what = "act " + std::string(dtype_name(at)) + " w " + std::string(dtype_name(wt)) +
                                   " n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k);
          const size_t nx = static_cast<size_t>(n * k), nr = static_cast<size_t>(n * m);
          const std::vector<float> x(xs.begin(), xs.begin() + static_cast<ptrdiff_t>(nx));
          const std::vector<float> r(r0.begin(), r0.begin() + static_cast<ptrdiff_t>(nr));
          const auto xb = encode(at, x), rb = encode(at, r);
          DeviceMem gx = upload_bytes(gpu(), xb.data(), xb.size()), gr = upload_bytes(gpu(), rb.data(), rb.size());
          DeviceMem gs(gpu(), rb.size());
          Tensor xt = dev_tensor(gx, at, {n, k}), rt = dev_tensor(gr, at, {n, m}), st = dev_tensor(gs, at, {n, m});
          // The first call of this shape and dtypes: n >= 16 on cuBLASLt times candidates first.
          gpu().matmul_add(xt, w, rt, st);
          const auto got = decode(at, download<uint8_t>(gpu(), gr, rb.size()));
          std::vector<double> ref(nr);
          for (size_t i = 0; i < nr; ++i) ref[i] = double{r[i]} + prod[i];
          expect_close(got, ref, tol.nmse, tol.max_rel, what);
          if (gemv_rows(wt, at, n) && std::getenv("OSPREY_GEMV_MAX_ROWS") == nullptr &&
              std::getenv("OSPREY_QGEMV_MAX_ROWS") == nullptr) {
            // The GEMV's sum is the one matmul writes to F32: one fp32 add, one rounding.
            DeviceMem gf(gpu(), nr * 4);
            Tensor ft = dev_tensor(gf, DType::kF32, {n, m});
            gpu().matmul(xt, w, Tensor(), ft);
            const auto f = download<float>(gpu(), gf, nr);
            int mismatches = 0;
            for (size_t i = 0; i < nr; ++i) mismatches += got[i] != round_once(at, f[i] + r[i]) ? 1 : 0;
            EXPECT_EQ(mismatches, 0) << what << ": GEMV epilogue is not round(fp32 sum + residual)";
          }
        }
      }
    }
  }
}

// n = 0: a no-op that leaves the residual alone.
TEST_F(MatmulAddTest, EmptyProductsLeaveTheResidual) {
  const std::vector<float> r = exact_values(40, 12000, -2.0f, 2.0f);
  const auto rb = encode(DType::kBF16, r);
  DeviceMem gr = upload_bytes(gpu(), rb.data(), rb.size()), gx(gpu(), 64), gw(gpu(), 64), gs(gpu(), rb.size());
  Tensor x = dev_tensor(gx, DType::kBF16, {0, 8}), w = dev_tensor(gw, DType::kBF16, {3, 8});
  Tensor rt = dev_tensor(gr, DType::kBF16, {0, 3}), st = dev_tensor(gs, DType::kBF16, {0, 3});
  gpu().matmul_add(x, w, rt, st);
  EXPECT_EQ(download<uint8_t>(gpu(), gr, rb.size()), rb) << "n = 0";
}

// A captured matmul_add replayed twice adds twice: bit for bit two eager calls
// (the plan is settled, tuning included, by the first eager call of the shape).
TEST_F(MatmulAddTest, GraphReplayAddsOncePerReplay) {
  ASSERT_TRUE(gpu().supports_graphs());
  const int64_t m = 512, k = 1024;
  uint32_t seed = 13000;
  for (DType wt : {DType::kBF16, DType::kQ4_0}) {
    const auto packed = pack(wt, exact_values(static_cast<size_t>(m * k), seed += 3, -0.1f, 0.1f), m, k);
    const auto wd = unpack(wt, packed, m, k);
    DeviceMem gw = upload_bytes(gpu(), packed.data(), packed.size());
    const Tensor w = dev_tensor(gw, wt, {m, k});
    for (int64_t n : {1, 9, 40, 96}) {
      const std::string what = std::string(dtype_name(wt)) + " n=" + std::to_string(n);
      const auto x = exact_values(static_cast<size_t>(n * k), seed += 3, -1.0f, 1.0f);
      const auto r = exact_values(static_cast<size_t>(n * m), seed += 3, -2.0f, 2.0f);
      const auto xb = encode(DType::kBF16, x), rb = encode(DType::kBF16, r);
      DeviceMem gx = upload_bytes(gpu(), xb.data(), xb.size()), gr = upload_bytes(gpu(), rb.data(), rb.size());
      DeviceMem gs(gpu(), rb.size());
      Tensor xt = dev_tensor(gx, DType::kBF16, {n, k}), rt = dev_tensor(gr, DType::kBF16, {n, m});
      Tensor st = dev_tensor(gs, DType::kBF16, {n, m});
      gpu().matmul_add(xt, w, rt, st);
      gpu().matmul_add(xt, w, rt, st);
      const auto eager = download<uint8_t>(gpu(), gr, rb.size());
      std::vector<double> ref(r.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double s = 0;
          for (int64_t c = 0; c < k; ++c)
            s += double{x[static_cast<size_t>(i * k + c)]} * wd[static_cast<size_t>(j * k + c)];
          ref[static_cast<size_t>(i * m + j)] = r[static_cast<size_t>(i * m + j)] + 2 * s;
        }
      // Two roundings to bf16 now (one per call).
      expect_close(decode(DType::kBF16, eager), ref, 6e-5, 3e-2, what + " eager x2");

      gpu().copy_to_device(gr.get(), rb.data(), rb.size());
      gpu().begin_capture();
      gpu().matmul_add(xt, w, rt, st);
      auto graph = gpu().end_capture();
      ASSERT_NE(graph, nullptr) << what;
      EXPECT_EQ(download<uint8_t>(gpu(), gr, rb.size()), rb) << what << ": capture must not run the op";
      graph->launch();
      graph->launch();
      EXPECT_EQ(download<uint8_t>(gpu(), gr, rb.size()), eager) << what << ": two replays vs two eager calls";
    }
  }
}

// The fused decode chain (rms_norm -> matmul_add -> rms_norm ->
// matmul_silu_mul -> matmul_add, four layers) at 1 and 4 rows, queued back
// to back (the GEMVs and norms under programmatic dependent launch: the
// accumulating GEMV reads the residual only after its wait) and replayed as
// a graph, against the same ops with the stream drained after each: bit for
// bit. Intermediates are poisoned (bf16 NaN) before every run.
TEST_F(MatmulAddTest, DecodeChainQueuedEqualsSerialised) {
  const int64_t d = 2048, f = 4096;
  const int layers = 4;
  uint32_t seed = 14000;
  DeviceMem gwo = upload(gpu(), to_bf16(exact_values(static_cast<size_t>(d * d), seed += 3, -0.05f, 0.05f)));
  DeviceMem gwgu = upload(gpu(), to_bf16(exact_values(static_cast<size_t>(2 * f * d), seed += 3, -0.05f, 0.05f)));
  DeviceMem gwd = upload(gpu(), to_bf16(exact_values(static_cast<size_t>(d * f), seed += 3, -0.05f, 0.05f)));
  DeviceMem gnorm = upload(gpu(), random_floats(static_cast<size_t>(d), seed += 3, 0.5f, 1.5f));
  const Tensor wo = dev_tensor(gwo, DType::kBF16, {d, d}), wgu = dev_tensor(gwgu, DType::kBF16, {2 * f, d});
  const Tensor wd = dev_tensor(gwd, DType::kBF16, {d, f}), wn = dev_tensor(gnorm, DType::kF32, {d});
  for (int64_t n : {1, 4}) {
    const std::string what = "n=" + std::to_string(n) + ": ";
    const auto x0 = to_bf16(exact_values(static_cast<size_t>(n * d), seed += 3, -2.0f, 2.0f));
    DeviceMem gresid(gpu(), static_cast<size_t>(n * d) * 2), gnormed(gpu(), static_cast<size_t>(n * d) * 2),
        ggu(gpu(), static_cast<size_t>(n * 2 * f) * 2), gact(gpu(), static_cast<size_t>(n * f) * 2),
        gproj(gpu(), static_cast<size_t>(n * d) * 2);
    Tensor resid = dev_tensor(gresid, DType::kBF16, {n, d}), normed = dev_tensor(gnormed, DType::kBF16, {n, d});
    Tensor gu = dev_tensor(ggu, DType::kBF16, {n, 2 * f}), act = dev_tensor(gact, DType::kBF16, {n, f});
    Tensor proj = dev_tensor(gproj, DType::kBF16, {n, d});
    const std::vector<uint16_t> poison(static_cast<size_t>(n * 2 * f), 0xffff);  // bf16 NaN
    auto reset = [&] {
      gpu().copy_to_device(gresid.get(), x0.data(), x0.size() * 2);
      for (DeviceMem* m : {&gnormed, &ggu, &gact, &gproj}) gpu().copy_to_device(m->get(), poison.data(), m->bytes());
      gpu().synchronize();
    };
    auto chain = [&](bool serial) {
      auto step = [&] {
        if (serial) gpu().synchronize();
      };
      for (int l = 0; l < layers; ++l) {
        gpu().rms_norm(resid, wn, 1e-5f, normed);
        step();
        gpu().matmul_add(normed, wo, resid, proj);
        step();
        gpu().rms_norm(resid, wn, 1e-5f, normed);
        step();
        gpu().matmul_silu_mul(normed, wgu, gu, act);
        step();
        gpu().matmul_add(act, wd, resid, proj);
        step();
      }
    };
    auto read = [&] { return download<uint16_t>(gpu(), gresid, static_cast<size_t>(n * d)); };
    expect_chain_queued_and_graph_equal_serialised(gpu(), reset, chain, read, x0, what);
  }
}

// The model's residual sequence with matmul_add (fused) against matmul +
// add_rms_norm (unfused), same weights, prefill (GEMM rows) then decode
// steps (GEMV rows): logits within the 16-bit rounding of the residual.
TEST(MatmulAddModel, FusedResidualForwardMatchesUnfused) {
  ASSERT_GT(cuda::device_count(), 0);
  if (const char* v = std::getenv("OSPREY_FUSED_RESIDUAL"); v != nullptr && std::string(v) == "0")
    GTEST_SKIP() << "OSPREY_FUSED_RESIDUAL=0 turns the fused sequence off";
  cuda::CudaBackendOptions on, off;
  off.fused_residual = false;
  auto be_on = cuda::make_cuda_backend(on), be_off = cuda::make_cuda_backend(off);
  ASSERT_NE(be_on, nullptr);
  ASSERT_NE(be_off, nullptr);
  const std::string path = std::string(OSPREY_SOURCE_DIR) + "/tests/fixtures/llama";
  for (const char* dtype : {"bfloat16", "float16"}) {
    const bool bf16 = std::string(dtype) == "bfloat16";
    const DType act = bf16 ? DType::kBF16 : DType::kF16;
    EXPECT_TRUE(be_on->fuses_matmul_add(act));
    EXPECT_FALSE(be_off->fuses_matmul_add(act));
    EXPECT_FALSE(be_on->fuses_matmul_add(DType::kF32));  // the exact fp32 mode keeps its sequence
    ModelLoadOptions o;
    o.dtype = dtype;
    auto m_on = Model::load(path, *be_on, o), m_off = Model::load(path, *be_off, o);
    ASSERT_TRUE(m_on.ok()) << m_on.status().to_string();
    ASSERT_TRUE(m_off.ok()) << m_off.status().to_string();
    expect_fused_forward_matches(**m_on, **m_off, bf16 ? 1e-3 : 5e-5, dtype);
  }
}

}  // namespace
}  // namespace osprey::gpu_test
