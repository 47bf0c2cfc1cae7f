// CpuBackend::kv_write and paged_attention over paged KV caches
//   k, v pages: [num_blocks, block_size, num_kv_heads, head_dim], F32 (or
//   F16/BF16, F8_E4M3 with the layer's K and V scales, or I8 with a scale
//   a row: ops/backend.h).
//
// Attention is exact two-pass softmax in fp32 per (token, query head): scores
// for the token's causal window, max, exp and sum, then the weighted sum of V
// rows, divided by the sum at the end. The query heads of one GQA group are
// done together so each K/V row is loaded once per group.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"

namespace osprey::cpu {
namespace {

// Every E4M3 code's value.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// Row `row` of `len` values from src; F8_E4M3 pages store src * inv_scale.
void store_row(const float* src, void* base, DType t, int64_t row, int64_t len, float inv_scale) {
  if (t == DType::kF32) {
    std::memcpy(static_cast<float*>(base) + row * len, src, static_cast<size_t>(len) * sizeof(float));
    return;
  }
  if (t == DType::kF8E4M3) {
    uint8_t* p = static_cast<uint8_t*>(base) + row * len;
    for (int64_t i = 0; i < len; ++i) p[i] = f32_to_f8e4m3(src[i] * inv_scale);
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + row * len;
  if (t == DType::kF16) {
    for (int64_t i = 0; i < len; ++i) p[i] = f32_to_fp16(src[i]);
  } else {
    for (int64_t i = 0; i < len; ++i) p[i] = f32_to_bf16(src[i]);
  }
}

void check_pages(const ops::LayerKv& kv) {
  OSP_CHECK_EQ(kv.k.ndim(), 4);
  OSP_CHECK_EQ(kv.v.ndim(), 4);
  for (int i = 0; i < 4; ++i) OSP_CHECK_EQ(kv.k.dim(i), kv.v.dim(i));
  ops::Backend::check_kv_pages(kv);
}

}  // namespace

void CpuBackend::kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& batch, ops::LayerKv& kv) {
  check_pages(kv);
  OSP_CHECK(k.dtype() == DType::kF32 && v.dtype() == DType::kF32);
  const int64_t bs = kv.k.dim(1);
  const int64_t hk = kv.k.dim(2);
  const int64_t hd = kv.k.dim(3);
  const int64_t row = hk * hd;  // elements per slot
  const int64_t num_slots = kv.k.dim(0) * bs;
  const int64_t n = k.rows() * k.cols() / row;
  OSP_CHECK_EQ(k.numel(), n * row);
  OSP_CHECK_EQ(v.numel(), n * row);
  const float* kp = k.data_as<float>();
  const float* vp = v.data_as<float>();
  const DType t = kv.k.dtype();
  const float k_inv = 1.0f / kv.k_scale, v_inv = 1.0f / kv.v_scale;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = batch.slot_mapping[i];
    if (slot < 0) continue;
    OSP_CHECK_MSG(slot < num_slots, "kv_write: slot " << slot << " beyond " << num_slots);
    if (t == DType::kI8) {  // one scale a (slot, head) row of hd values
      for (int64_t h = 0; h < hk; ++h) {
        const int64_t r = slot * hk + h, si = ops::kv_row_scale_index(slot, h, hk, bs);
        kv.k_row_scales.data_as<float>()[si] =
            int8_row_quantize(kp + i * row + h * hd, hd, static_cast<int8_t*>(kv.k.data()) + r * hd);
        kv.v_row_scales.data_as<float>()[si] =
            int8_row_quantize(vp + i * row + h * hd, hd, static_cast<int8_t*>(kv.v.data()) + r * hd);
      }
      continue;
    }
    store_row(kp + i * row, kv.k.data(), t, slot, row, k_inv);
    store_row(vp + i * row, kv.v.data(), t, slot, row, v_inv);
  }
}

void CpuBackend::paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& batch, float scale,
                                 int sliding_window, Tensor& out) {
  check_pages(kv);
  OSP_CHECK(q.dtype() == DType::kF32 && out.dtype() == DType::kF32);
  OSP_CHECK_EQ(q.ndim(), 3);
  const int64_t n = q.dim(0);
  const int64_t hq = q.dim(1);
  const int64_t hd = q.dim(2);
  const int64_t num_blocks = kv.k.dim(0);
  const int64_t bs = kv.k.dim(1);
  const int64_t hk = kv.k.dim(2);
  OSP_CHECK_EQ(kv.k.dim(3), hd);
  OSP_CHECK_MSG(hk > 0 && hq % hk == 0, "paged_attention: " << hq << " query heads over " << hk << " kv heads");
  OSP_CHECK_EQ(out.numel(), q.numel());
  OSP_CHECK_EQ(batch.q_indptr[batch.num_seqs], n);
  const int64_t group = hq / hk;

  // token -> sequence; also the longest window any token reads.
  token_seq_.resize(static_cast<size_t>(n));
  int64_t max_len = 0;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int64_t num_pages = batch.block_indptr[s + 1] - batch.block_indptr[s];
    for (int32_t t = batch.q_indptr[s]; t < batch.q_indptr[s + 1]; ++t) {
      token_seq_[static_cast<size_t>(t)] = s;
      const int64_t p = batch.positions[t];
      OSP_CHECK_MSG(p >= 0 && p < batch.kv_lens[s] && p / bs < num_pages,
                    "paged_attention: position " << p << " of sequence " << s << " outside its KV (" << batch.kv_lens[s]
                                                 << " tokens, " << num_pages << " pages)");
      max_len = std::max(max_len, sliding_window > 0 ? std::min<int64_t>(p + 1, sliding_window) : p + 1);
    }
  }

  const float* qp = q.data_as<float>();
  float* op = out.data_as<float>();
  const DType pt = kv.k.dtype();
  const char* kbase = static_cast<const char*>(kv.k.data());
  const char* vbase = static_cast<const char*>(kv.v.data());
  const float* k_rs = pt == DType::kI8 ? kv.k_row_scales.data_as<float>() : nullptr;
  const float* v_rs = pt == DType::kI8 ? kv.v_row_scales.data_as<float>() : nullptr;
  const CpuKernels& kern = *kernels_;
  const int64_t ld = std::max<int64_t>(1, max_len);  // scores row stride
  // One work item = (token, kv head): the group's query heads share every
  // K and V row, which is read once for all of them.
  for_range(n * hk, ld * hd * 2 * group, [&](int64_t b, int64_t e) {
    float* scores = thread_scratch(0).get(static_cast<size_t>(ld * group));  // [group, ld]
    // [bs, hd] one page run widened to fp32 (F16/BF16 pages), [group] 1/sum
    float* buf = thread_scratch(1).get(static_cast<size_t>(bs * hd + group));
    float* inv = buf + bs * hd;
    // F16/BF16 pages: the run's rows widened (exactly) into buf, then the
    // fp32 kernels; each row's arithmetic is that of an fp32 page holding
    // the same values. F8_E4M3 pages: each value times the scale (one fp32
    // product); I8 pages: times its row's scale (the run's scales lie side
    // by side from kv_row_scale_index of its first row).
    auto widened = [&](const char* base, int64_t r, int64_t cnt, float page_scale, const float* row_scales) {
      if (pt == DType::kI8) {
        const float* rs0 = row_scales + ops::kv_row_scale_index(r / hk, r % hk, hk, bs);
        for (int64_t i = 0; i < cnt; ++i) {
          const int8_t* src = reinterpret_cast<const int8_t*>(base) + (r + i * hk) * hd;
          const float rs = rs0[i];
          for (int64_t d = 0; d < hd; ++d) buf[i * hd + d] = static_cast<float>(src[d]) * rs;
        }
        return static_cast<const float*>(buf);
      }
      if (pt == DType::kF8E4M3) {
        const std::array<float, 256>& e4m3 = e4m3_table();
        for (int64_t i = 0; i < cnt; ++i) {
          const uint8_t* src = reinterpret_cast<const uint8_t*>(base) + (r + i * hk) * hd;
          for (int64_t d = 0; d < hd; ++d) buf[i * hd + d] = e4m3[src[d]] * page_scale;
        }
        return static_cast<const float*>(buf);
      }
      const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + r * hd;
      if (pt == DType::kF16) {
        kern.widen_f16(src, hk * hd, cnt, hd, buf);
      } else {
        kern.widen_bf16(src, hk * hd, cnt, hd, buf);
      }
      return static_cast<const float*>(buf);
    };
    // Runs of consecutive keys j in [lo, p] that lie in one page: rows
    // (page * bs + j % bs) * hk + kvh, stride hk rows.
    auto for_each_run = [&](int64_t t, int64_t kvh, auto&& fn) {
      const int s = token_seq_[static_cast<size_t>(t)];
      const int64_t p = batch.positions[t];
      const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, p - sliding_window + 1) : 0;
      const int32_t* pages = batch.block_indices + batch.block_indptr[s];
      for (int64_t j = lo; j <= p;) {
        const int64_t page = pages[j / bs];
        OSP_CHECK_MSG(page >= 0 && page < num_blocks, "paged_attention: page id " << page);
        const int64_t end = std::min(p + 1, (j / bs + 1) * bs);
        fn(j - lo, (page * bs + j % bs) * hk + kvh, end - j);
        j = end;
      }
    };
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / hk;
      const int64_t kvh = item % hk;
      const int64_t p = batch.positions[t];
      const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, p - sliding_window + 1) : 0;
      const int64_t len = p - lo + 1;
      const int64_t h0 = kvh * group;
      const float* qv = qp + (t * hq + h0) * hd;
      float* o = op + (t * hq + h0) * hd;

      // Pass 1: scores[h, j - lo] = q_h . k_j * scale for j in [lo, p].
      for_each_run(t, kvh, [&](int64_t off, int64_t r, int64_t cnt) {
        if (pt == DType::kF32) {
          kern.attn_scores(qv, static_cast<int>(group), hd, reinterpret_cast<const float*>(kbase) + r * hd, hk * hd,
                           cnt, scale, scores + off, ld);
        } else {
          kern.attn_scores(qv, static_cast<int>(group), hd, widened(kbase, r, cnt, kv.k_scale, k_rs), hd, cnt, scale,
                           scores + off, ld);
        }
      });
      for (int64_t h = 0; h < group; ++h) {
        float* sh = scores + h * ld;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < len; ++j) mx = std::max(mx, sh[j]);
        inv[h] = 1.0f / kern.exp_sub_sum(sh, len, mx);
      }

      // Pass 2: out_h = sum_j scores[h, j] * v_j / sum_h.
      std::memset(o, 0, static_cast<size_t>(hd * group) * sizeof(float));
      for_each_run(t, kvh, [&](int64_t off, int64_t r, int64_t cnt) {
        if (pt == DType::kF32) {
          kern.attn_accum(scores + off, ld, static_cast<int>(group), hd,
                          reinterpret_cast<const float*>(vbase) + r * hd, hk * hd, cnt, o);
        } else {
          kern.attn_accum(scores + off, ld, static_cast<int>(group), hd, widened(vbase, r, cnt, kv.v_scale, v_rs), hd, cnt,
                          o);
        }
      });
      for (int64_t h = 0; h < group; ++h) kern.scale(inv[h], o + h * hd, hd);
    }
  });
}

}  // namespace osprey::cpu
