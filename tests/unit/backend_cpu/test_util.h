// Helpers for the CPU backend tests: random data, quantisers that turn random
// floats into packed weights of every dtype, and comparison with tolerances
// relative to the reference's magnitude.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace osprey::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Packs rows x cols floats (row-major) as dtype t; cols % 32 == 0 for the
// quantised types. Quantisers follow the usual GGUF recipes.
inline std::vector<uint8_t> pack(DType t, const std::vector<float>& src, int64_t rows, int64_t cols) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes * rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * cols, out.data() + r * row_bytes, cols);
  return out;
}

// Dequantises packed rows with the core reference (dtype.cpp), as doubles.
inline std::vector<double> unpack(DType t, const std::vector<uint8_t>& packed, int64_t rows, int64_t cols) {
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, packed.data() + r * dtype_row_bytes(t, cols), row.data(), cols);
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * cols + c)] = row[static_cast<size_t>(c)];
  }
  return out;
}

// Expects max |got - ref| <= rel * max |ref| (+ a tiny absolute floor).
inline void expect_close(const float* got, const double* ref, size_t n, double rel, const std::string& what) {
  double max_ref = 0.0, max_diff = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= max_diff)) {  // also catches NaN
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  const double tol = rel * max_ref + 1e-30;
  EXPECT_LE(max_diff, tol) << what << ": worst index " << worst << " got " << got[worst] << " ref " << ref[worst]
                           << " (max|ref| " << max_ref << ")";
}

inline void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double rel,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  expect_close(got.data(), ref.data(), got.size(), rel, what);
}

// Backend variants every op test runs on: instruction set x thread count.
struct BackendVariant {
  cpu::Isa isa;
  int threads;
};

inline const char* isa_string(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::kScalar:
      return "scalar";
    case cpu::Isa::kAvx2:
      return "avx2";
    case cpu::Isa::kAvx512:
      return "avx512";
    default:
      return "auto";
  }
}

inline std::string variant_name(const testing::TestParamInfo<BackendVariant>& info) {
  return std::string(isa_string(info.param.isa)) + "_t" + std::to_string(info.param.threads);
}

inline std::vector<BackendVariant> all_variants() {
  std::vector<BackendVariant> v = {{cpu::Isa::kScalar, 1}, {cpu::Isa::kScalar, 2}};
  if (cpu::avx2_kernels() != nullptr) {
    v.push_back({cpu::Isa::kAvx2, 1});
    v.push_back({cpu::Isa::kAvx2, 2});
  }
  if (cpu::avx512_kernels() != nullptr) {
    v.push_back({cpu::Isa::kAvx512, 1});
    v.push_back({cpu::Isa::kAvx512, 2});
  }
  return v;
}

inline std::unique_ptr<cpu::CpuBackend> make_backend(const BackendVariant& v) {
  cpu::CpuBackendOptions o;
  o.num_threads = v.threads;
  o.isa = v.isa;
  auto b = cpu::make_cpu_backend(o);
  EXPECT_EQ(std::string(b->isa_name()), isa_string(v.isa));
  EXPECT_EQ(b->num_threads(), v.threads);
  return b;
}

}  // namespace osprey::test
