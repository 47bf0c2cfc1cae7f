// Timings of the CUDA backend's main op paths at Llama-3-8B shapes, against
// the card's measured copy bandwidth. A benchmark, not a test: it prints
// figures and asserts nothing. Built as gpu_op_bench next to gpu_tests.
//
// Columns: op, shape, microseconds per call (median of reps after warm-up),
// and the achieved rate (GB/s of bytes that must move, or TFLOP/s).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace {

using namespace osprey;

double median_us(ops::Backend& be, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  be.synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    be.synchronize();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const std::string& op, const std::string& shape, double us, double rate, const char* unit) {
  std::printf("%-34s %-30s %10.1f %9.1f %s\n", op.c_str(), shape.c_str(), us, rate, unit);
}

struct Buf {
  ops::Backend& be;
  void* p;
  Buf(ops::Backend& b, size_t bytes) : be(b), p(b.alloc(bytes)) {}
  ~Buf() { be.free(p); }
};

}  // namespace

int main() {
  auto be = cuda::make_cuda_backend({});
  if (!be) return 1;
  std::printf("device: %s\n", be->name());
  std::printf("%-34s %-30s %10s %9s\n", "op", "shape", "us", "rate");

  // Copy bandwidth: device-to-device, 1 GiB (read + write counted).
  double copy_gbs = 0;
  {
    const size_t bytes = size_t{1} << 30;
    Buf a(*be, bytes), b(*be, bytes);
    const double us = median_us(*be, 10, [&] {
      cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr);
      cudaDeviceSynchronize();
    });
    copy_gbs = 2.0 * bytes / us / 1e3;
    row("copy d2d", "1 GiB", us, copy_gbs, "GB/s (ceiling)");
  }

  // Matmul: decode (n = 1) is weight-bound; prefill (n = 2048) compute-bound.
  const int64_t d = 4096, f = 14336;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0, DType::kQ4_1, DType::kQ4_0}) {
    const int64_t m = 2 * f, k = d;  // fused gate/up
    const size_t wbytes = static_cast<size_t>(dtype_row_bytes(t, k) * m);
    Buf w(*be, wbytes), x(*be, 2048 * k * 4), o(*be, 2048 * m * 4);
    Tensor wt(w.p, t, {m, k}, Device::kCuda);
    for (int64_t n : {1, 8, 2048}) {
      Tensor xt(x.p, DType::kF32, {n, k}, Device::kCuda), ot(o.p, DType::kF32, {n, m}, Device::kCuda);
      const double us = median_us(*be, n == 2048 ? 5 : 50, [&] { be->matmul(xt, wt, Tensor(), ot); });
      const std::string shape = "n=" + std::to_string(n) + " [" + std::to_string(m) + "x" + std::to_string(k) + "]";
      if (n <= 8) {
        row("matmul " + std::string(dtype_name(t)), shape, us, wbytes / us / 1e3, "GB/s weights");
      } else {
        row("matmul " + std::string(dtype_name(t)), shape, us, 2.0 * n * m * k / us / 1e6, "TFLOP/s");
      }
    }
  }

  // Paged attention, Llama-3-8B heads (32 q / 8 kv x 128), F32 pages of 16.
  const int hq = 32, hk = 8, hd = 128, bs = 16;
  for (auto [num_seqs, ctx, q_len] :
       {std::tuple{1, 4096, 1}, std::tuple{32, 4096, 1}, std::tuple{1, 32768, 1}, std::tuple{1, 2048, 2048}}) {
    const int pages_per_seq = (ctx + bs - 1) / bs;
    const int num_blocks = pages_per_seq * num_seqs;
    const int n = num_seqs * q_len;
    const size_t page_bytes = static_cast<size_t>(num_blocks) * bs * hk * hd * 4;
    Buf kc(*be, page_bytes), vc(*be, page_bytes), q(*be, static_cast<size_t>(n) * hq * hd * 4),
        out(*be, static_cast<size_t>(n) * hq * hd * 4);
    std::vector<int32_t> qptr{0}, kvl, bptr{0}, bidx, pos;
    for (int s = 0; s < num_seqs; ++s) {
      for (int p = 0; p < pages_per_seq; ++p) bidx.push_back(s * pages_per_seq + p);
      bptr.push_back(static_cast<int32_t>(bidx.size()));
      for (int i = 0; i < q_len; ++i) pos.push_back(ctx - q_len + i);
      qptr.push_back(static_cast<int32_t>(pos.size()));
      kvl.push_back(ctx);
    }
    auto up = [&](const std::vector<int32_t>& v) {
      void* p = be->alloc(v.size() * 4);
      be->copy_to_device(p, v.data(), v.size() * 4);
      return static_cast<int32_t*>(p);
    };
    ops::AttentionBatch b;
    b.num_seqs = num_seqs;
    b.num_tokens = n;
    b.max_q_len = q_len;
    b.max_kv_len = ctx;
    b.q_indptr = up(qptr);
    b.kv_lens = up(kvl);
    b.block_indptr = up(bptr);
    b.block_indices = up(bidx);
    b.positions = up(pos);
    ops::LayerKv kv;
    kv.k = Tensor(kc.p, DType::kF32, {num_blocks, bs, hk, hd}, Device::kCuda);
    kv.v = Tensor(vc.p, DType::kF32, {num_blocks, bs, hk, hd}, Device::kCuda);
    Tensor qt(q.p, DType::kF32, {n, hq, hd}, Device::kCuda), ot(out.p, DType::kF32, {n, hq, hd}, Device::kCuda);
    const double us = median_us(*be, 10, [&] { be->paged_attention(qt, kv, b, 0.088f, 0, ot); });
    const std::string shape =
        std::to_string(num_seqs) + " seq x " + std::to_string(q_len) + " q, ctx " + std::to_string(ctx);
    if (q_len == 1) {
      row("paged_attention decode F32 KV", shape, us, 2.0 * page_bytes / us / 1e3, "GB/s KV");
    } else {
      const double flops = 4.0 * hq * hd * (static_cast<double>(q_len) * (q_len + 1) / 2);
      row("paged_attention prefill F32 KV", shape, us, flops / us / 1e6, "TFLOP/s (causal)");
    }
    for (const int32_t* p : {b.q_indptr, b.kv_lens, b.block_indptr, b.block_indices, b.positions})
      be->free(const_cast<int32_t*>(p));
  }
  std::printf("copy ceiling %.0f GB/s\n", copy_gbs);
  return 0;
}
