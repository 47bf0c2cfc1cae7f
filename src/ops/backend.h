// The ops interface every backend implements. Model code (src/model) is
// written only against this; it never includes a backend header.
//
// Conventions: activations are F32 (CPU) unless stated; weights may be any
// DType including the block-quantised ones, kept packed. Shapes are given as
// comments; "n" is the number of tokens in the step.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "osprey/status.h"

namespace osprey::ops {

// Rotary embedding frequencies. inv_freq[i] for i in [0, rotary_dim/2) is
// computed once by make_rope_inv_freq (src/ops/rope_freq.h), including
// Llama 3.1 style scaling, so backends only rotate.
struct RopeTable {
  const float* inv_freq = nullptr;  // [rotary_dim / 2], host or device memory
  int rotary_dim = 0;               // == head_dim for every supported architecture
  float attention_scaling = 1.0f;   // multiplies cos/sin (1 except for YaRN-like scalings)
};

// Describes the sequences of one step for attention and KV writes. All arrays
// are I32 on the backend's device.
//
// Token t of the step belongs to sequence s when q_indptr[s] <= t < q_indptr[s+1].
// Its absolute position is positions[t]; it attends causally to KV positions
// [max(0, positions[t] - window + 1), positions[t]] of its sequence (window = 0
// means unlimited). The KV entry of position p of sequence s lives in page
// block_indices[block_indptr[s] + p / block_size], row p % block_size.
//
// GRAPH CONTRACT (CUDA graphs replay decode steps per batch-size bucket):
// for a step where every sequence has exactly one query token
// (num_tokens == num_seqs), the kernels a backend launches for
// paged_attention / qkv_rope_kv_write / kv_write may depend only on
// num_tokens, num_seqs, the tensor shapes and values fixed when the KV pool
// and step buffers were allocated; never on max_kv_len, max_q_len or other
// per-step host scalars. Sequence lengths, pages, positions and slots are
// read from the device arrays. Such calls allocate nothing (after one eager
// call of the same shape), free nothing, synchronise nothing and copy nothing
// to or from the host. Padded sequences (kv_lens = 0, slot_mapping = -1,
// q_indptr advancing by 1) produce zero outputs and write no KV.
struct AttentionBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_kv_len = 0;      // max over sequences of kv_lens
  int max_q_len = 0;       // max over sequences of query tokens
  const int32_t* q_indptr = nullptr;       // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;        // [num_seqs] tokens in KV after this step's writes
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]]
  const int32_t* positions = nullptr;      // [num_tokens]
  const int32_t* slot_mapping = nullptr;   // [num_tokens] page * block_size + row, -1 = skip
  // Host hint: sequences [0, num_leading_decodes) have exactly one query token
  // each (token s = sequence s; 0 = not known). A backend may run those rows
  // of a mixed step through its decode kernel and the rest through its
  // prefill kernel; the result is the same function either way.
  int num_leading_decodes = 0;
  // Host hint, device array or null: in a pure decode step a permutation of
  // [0, num_seqs), in a mixed step one of [0, num_leading_decodes), listing
  // those sequences most keys first. A backend may start the longer
  // sequences' work first, so that short ones fill the end of the kernel
  // (less tail when lengths differ); results never depend on it.
  const int32_t* decode_order = nullptr;
};

// One layer's paged KV cache:
//   k, v: [num_blocks, block_size, num_kv_heads, head_dim], dtype F32, F16,
//   BF16, F8_E4M3 or I8 (one byte a value).
// F8_E4M3 pages hold each value x as e4m3(x / scale) (round to nearest even,
// magnitudes past 448 saturated), with one scale for the layer's K and one
// for its V; reads give e4m3 * scale. Writers first round x to the
// activation dtype, as kv_write's input already is. The scales are 1 for
// the other dtypes and are ignored there.
// I8 pages hold each row of head_dim values (one token, one KV head) as
// int8_row_quantize(x) (core/dtype.h): int8 q under the row's own fp32
// scale s = amax / 127, kept in k_row_scales / v_row_scales
// [num_blocks, num_kv_heads, block_size] F32 at kv_row_scale_index(slot,
// head) (a page's scales of one head side by side, as a kernel reading a
// page's keys of one head wants them); reads give q * s (one fp32
// product). The row scale tensors are defined for I8 pages only, and move
// with their pages (page_tensors).
struct LayerKv {
  Tensor k;
  Tensor v;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  Tensor k_row_scales{};
  Tensor v_row_scales{};

  // The tensors a page's contents live in, each with num_blocks as its first
  // dimension: k, v and, for I8 pages, their row scales. Copies, swaps and
  // frees of pages go over all of them.
  std::vector<Tensor*> page_tensors() {
    std::vector<Tensor*> t{&k, &v};
    if (k_row_scales.defined()) t.push_back(&k_row_scales);
    if (v_row_scales.defined()) t.push_back(&v_row_scales);
    return t;
  }
};

// Where the row scale of (page, offset in the page, KV head) lives in an I8
// layer's k_row_scales / v_row_scales, in the integer type I (kernels that
// already hold page and offset use it directly: no division; int where
// the caller has checked that the indices fit).
template <class I>
constexpr I kv_row_scale_index_at(I page, I offset, I head, I num_kv_heads, I block_size) {
  return (page * num_kv_heads + head) * block_size + offset;
}
// The same for slot = page * block_size + offset.
constexpr int64_t kv_row_scale_index(int64_t slot, int64_t head, int64_t num_kv_heads, int64_t block_size) {
  return kv_row_scale_index_at<int64_t>(slot / block_size, slot % block_size, head, num_kv_heads, block_size);
}

// The KV page dtypes: F32, F16, BF16, F8_E4M3, I8.
constexpr bool is_kv_page_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 || t == DType::kI8;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // Memory for step buffers and the KV pool. Returned memory is zeroed.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // out[n, d] = dequant(table[ids[i], :]); table [vocab, d] any dtype; ids on device.
  virtual void embedding(const Tensor& table, const int32_t* ids, Tensor& out) = 0;

  // out[n, d] = x / rms(x) * w; w [d] F32.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;

  // residual[n, d] += x; out = rms_norm(residual) * w.
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                            Tensor& out) = 0;

  // x[n, d] += y[n, d]
  virtual void add(Tensor& x, const Tensor& y) = 0;

  // out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]); w any dtype (packed), bias F32 or undefined.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) = 0;

  // residual[n, m] += x[n, k] @ w[m, k]^T: a projection (o, down) with the
  // residual add folded in. w any dtype (packed); residual and scratch
  // [n, m] of x's dtype; x must not overlap residual. scratch is a buffer a
  // backend may use for the product (this default: matmul into scratch,
  // then add, two roundings to the activation dtype) or leave unwritten
  // (a backend that fuses: the add inside the GEMM/GEMV epilogue, residual =
  // round(residual + sum) with the sum in fp32, one rounding).
  virtual void matmul_add(const Tensor& x, const Tensor& w, Tensor& residual, Tensor& scratch) {
    matmul(x, w, Tensor(), scratch);
    add(residual, scratch);
  }
  // True when matmul_add at activations of dtype `act` is one pass over the
  // residual (no product written and read back). The model then runs
  // matmul_add + rms_norm where it would run matmul + add_rms_norm (half
  // the norm's traffic); false keeps the unfused sequence and its exact
  // results (the CPU backend).
  virtual bool fuses_matmul_add(DType act) const {
    (void)act;
    return false;
  }

  // Per-head RMSNorm (Qwen3 q/k norm): x [n, heads, head_dim] in place, w [head_dim].
  virtual void head_rms_norm(Tensor& x, const Tensor& w, float eps) = 0;

  // In place, Hugging Face half-rotation layout: for each head, pairs
  // (x[i], x[i + rotary_dim/2]). q [n, hq, hd], k [n, hk, hd].
  virtual void rope(Tensor& q, Tensor& k, const int32_t* positions, const RopeTable& table) = 0;

  // out[n, f] = silu(gate_up[n, :f]) * gate_up[n, f:]
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;

  // out[n, f] = silu_mul(x @ w_gate_up^T), w_gate_up [2 f, k]: the same values
  // as matmul into gate_up [n, 2 f] then silu_mul. gate_up is scratch that a
  // backend may leave unwritten (CUDA at n = 1: one kernel, no gate_up).
  virtual void matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& gate_up, Tensor& out) {
    matmul(x, w_gate_up, Tensor(), gate_up);
    silu_mul(gate_up, out);
  }

  // out[n, m] = rms_norm(x) @ w^T (+ bias): rms_norm(x, norm_w, eps, normed)
  // then matmul(normed, w, bias, out), x [n, k], norm_w [k] F32, normed
  // [n, k] of x's dtype. normed is scratch a backend may leave unwritten (a
  // backend that fuses: the norm folded into the GEMV, the normed rows kept
  // on chip; CUDA rounds them to the activation dtype as this default does).
  virtual void rms_norm_matmul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w, const Tensor& bias,
                               Tensor& normed, Tensor& out) {
    rms_norm(x, norm_w, eps, normed);
    matmul(normed, w, bias, out);
  }
  // out[n, f] = silu_mul(rms_norm(x) @ w_gate_up^T): rms_norm into normed,
  // then matmul_silu_mul(normed, w_gate_up, gate_up, out). normed and
  // gate_up are scratch (same rules as rms_norm_matmul / matmul_silu_mul).
  virtual void rms_norm_matmul_silu_mul(const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w_gate_up,
                                        Tensor& normed, Tensor& gate_up, Tensor& out) {
    rms_norm(x, norm_w, eps, normed);
    matmul_silu_mul(normed, w_gate_up, gate_up, out);
  }
  // True when rms_norm_matmul / rms_norm_matmul_silu_mul of n rows of
  // activations of dtype `act` skip the normed round trip (one kernel fewer
  // per norm); the model then calls them where it would run rms_norm and a
  // projection. False keeps the two ops and their exact results (the CPU
  // backend). A backend may still fall back to the two ops for weights it
  // does not fuse.
  virtual bool fuses_rms_norm_matmul(int64_t n, DType act) const {
    (void)n;
    (void)act;
    return false;
  }

  // ---- RMSNorm weights folded into the projections (norm_fold.cpp) ----
  //
  // rms_norm(x) @ w^T = diag(inv) (x @ (w diag(norm_w))^T) with inv_t =
  // 1 / sqrt(mean(x[t, :]^2) + eps): the per-row scale commutes with the
  // product. Where folds_norms(act) is true, the model multiplies each
  // pre-projection norm weight into the projection that reads it once at
  // load (scale_columns: w_qkv by the attention norm, w_gate_up by the MLP
  // norm) and, at steps where fuses_rms_norm_matmul is false, runs that
  // projection on the residual itself; the op that reads the product
  // applies inv (rms_scaled_qkv_rope_kv_write, rms_scaled_silu_mul). No norm
  // pass runs and no normed rows are written: two kernels fewer per layer.
  // GEMV-size steps keep rms_norm_matmul* with a unit norm weight. The same
  // function up to rounding (the weights and the raw product are rounded
  // instead of the normed rows), so false keeps the exact sequence (the
  // CPU backend). The model folds only 16-bit or F32 weights it owns.
  virtual bool folds_norms(DType act) const {
    (void)act;
    return false;
  }
  // w[m, k] = w[m, k] * scale[k] rounded to w's dtype (F32, F16 or BF16), in
  // place; scale [k] F32. This default: host memory (the CPU's "device").
  virtual void scale_columns(Tensor& w, const Tensor& scale);

  // ---- FP8 weights (ModelLoadOptions::quantization "fp8", fp8_quant.cpp) ----
  //
  // True when matmul and matmul_add take F8_E4M3 weight matrices (the
  // layout of fp8_scale_offset: one fp32 scale s a matrix) with activations
  // of dtype act: each call quantises its input x [n, k] to E4M3 with one
  // dynamic scale (the same recipe as quantize_weight_fp8 over the whole
  // input) and runs the product on FP8 tensor cores with fp32 accumulation,
  // times s * the input's scale, out in act. The fused rms_norm_matmul* /
  // matmul_silu_mul ops take them too (as their two-op sequences where a
  // backend's fused kernels do not read them; CUDA's read them at one row).
  // Default: false.
  virtual bool supports_fp8_weights(DType act) const {
    (void)act;
    return false;
  }
  // q [m, k] F8_E4M3, fp8_weight_bytes(m, k) bytes at q.data(), from w [m,
  // k] (F32, F16 or BF16): amax = max |w|, inv = 448 / amax and s = amax /
  // 448 in fp32 (inv = s = 1 for an all-zero w), q = e4m3(w * inv) rounded
  // to nearest even and saturated (f32_to_f8e4m3), s stored at
  // fp8_scale_offset(m, k). A non-finite value in w is returned as an
  // invalid_argument error (q's contents are then unspecified). This
  // default: host memory (the reference the CUDA kernels are tested against).
  virtual Status quantize_weight_fp8(const Tensor& w, Tensor& q);
  // The dtype and shape checks every quantize_weight_fp8 makes (w F32, F16
  // or BF16 [m, k]; q F8_E4M3 of the same shape): aborts with the reason.
  static void check_quantize_weight_fp8_args(const Tensor& w, const Tensor& q);
  // qkv_rope_kv_write of qkv with each row t first multiplied by inv_t of
  // x[t, :] (x_eps), plus qkv_bias [cols] F32 where defined, and rounded to
  // qkv's dtype: the values a projection of rms_norm(x) with that bias
  // outputs, up to rounding (the bias is not scaled, so the projection
  // before runs without it). x [n, d] of qkv's dtype; qkv is left
  // unchanged. This default: host memory (scaled copy, then
  // qkv_rope_kv_write).
  virtual void rms_scaled_qkv_rope_kv_write(const Tensor& x, float x_eps, const Tensor& qkv, const Tensor& qkv_bias,
                                            const Tensor& q_norm, const Tensor& k_norm, float eps,
                                            const RopeTable& rope, const AttentionBatch& batch, LayerKv& kv,
                                            Tensor& q_out);
  // out[n, f] = silu(g) * u where g = gate_up[t, :f] and u = gate_up[t, f:]
  // are each first multiplied by inv_t of x[t, :] (x_eps) and rounded to
  // gate_up's dtype. x [n, d] of gate_up's dtype. This default: host memory
  // (scaled copy, then silu_mul).
  virtual void rms_scaled_silu_mul(const Tensor& x, float x_eps, const Tensor& gate_up, Tensor& out);

  // The page checks every kv_write, paged_attention and qkv_rope_kv_write
  // makes: K and V pages of one KV page dtype, and for F8_E4M3 positive
  // finite scales. Aborts with the reason.
  static void check_kv_pages(const LayerKv& kv) {
    OSP_CHECK_MSG(kv.k.dtype() == kv.v.dtype() && is_kv_page_dtype(kv.k.dtype()),
                  "KV pages must be F32, F16, BF16, F8_E4M3 or I8 (K and V alike), got "
                      << dtype_name(kv.k.dtype()) << " and " << dtype_name(kv.v.dtype()));
    if (kv.k.dtype() == DType::kF8E4M3) {
      OSP_CHECK_MSG(std::isfinite(kv.k_scale) && kv.k_scale > 0.0f && std::isfinite(kv.v_scale) && kv.v_scale > 0.0f,
                    "KV scales must be positive and finite, got " << kv.k_scale << ", " << kv.v_scale);
    }
    const bool i8 = kv.k.dtype() == DType::kI8;
    for (const Tensor* s : {&kv.k_row_scales, &kv.v_row_scales}) {
      OSP_CHECK_MSG(s->defined() == i8, "KV row scales go with I8 pages only");
      if (!i8) continue;
      OSP_CHECK_MSG(s->dtype() == DType::kF32 && s->ndim() == 3 && kv.k.ndim() == 4 && s->dim(0) == kv.k.dim(0) &&
                        s->dim(1) == kv.k.dim(2) && s->dim(2) == kv.k.dim(1),
                    "I8 KV row scales must be F32 [num_blocks, num_kv_heads, block_size] of their pages");
    }
  }

  // Whether kv_write, paged_attention and qkv_rope_kv_write take pages of
  // dtype kv (is_kv_page_dtype) for a model computing in act with this
  // head_dim and `group` query heads per KV head. This default: every page
  // dtype but I8.
  virtual bool supports_kv_dtype(DType kv, DType act, int head_dim, int group) const {
    (void)act;
    (void)head_dim;
    (void)group;
    return is_kv_page_dtype(kv) && kv != DType::kI8;
  }

  // Writes k, v [n, hk, hd] into the layer's pages at batch.slot_mapping.
  virtual void kv_write(const Tensor& k, const Tensor& v, const AttentionBatch& batch, LayerKv& kv) = 0;

  // out[n, hq, hd] = softmax(q k^T * scale) v over each token's causal window,
  // reading K/V from pages (GQA: query head h uses kv head h / (hq / hk)).
  virtual void paged_attention(const Tensor& q, const LayerKv& kv, const AttentionBatch& batch,
                               float scale, int sliding_window, Tensor& out) = 0;

  // out[r, :] = x[rows[r], :] for r in [0, num_rows); x [n, d].
  virtual void gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) = 0;

  // out[r, :] = x[src_rows[r], :] for each r in [0, num_rows) with
  // src_rows[r] >= 0; rows with src_rows[r] < 0 are left as they are (only
  // the filled rows are written). x [m, d], out [>= num_rows, d], same dtype;
  // x and out must not overlap; src_rows [num_rows] on the device, each < m.
  // The launch shape depends on num_rows and the row size only, never on how
  // many rows are filled (graph contract above).
  virtual void fill_rows_from(const Tensor& x, const int32_t* src_rows, int num_rows, Tensor& out) = 0;

  // ---- compute dtype, conversion, fused attention input (cudacore) ----

  // Activation dtype used when the user asks for "auto" (CPU: F32, CUDA: BF16).
  virtual DType default_activation_dtype() const { return DType::kF32; }
  // Whether every op above takes activations (x, out, residual, q, k, v) of
  // this dtype. Logits (matmul out) may always be F32; norm weights and biases
  // stay F32. The CPU backend takes F32 only.
  virtual bool supports_activation_dtype(DType t) const { return t == DType::kF32; }

  // dst = src converted elementwise between F32, F16 and BF16 (round to
  // nearest even); same numel; both on this backend's device. Used to convert
  // weights at upload, one chunk at a time.
  virtual void convert(const Tensor& src, Tensor& dst) = 0;

  // t (F32/F16/BF16, on this backend's device) = lo + (hi - lo) * u(i), where
  // u(i) in [0, 1) is a hash of (seed, i) for element i: the same values on
  // every backend (random "dummy" weights without a host buffer).
  virtual void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) = 0;

  // The fused attention input of one layer. qkv [n, (hq + 2 hk) * hd] is the
  // output of the fused QKV projection (q heads, then k heads, then v heads).
  // Per token: optional per-head RMSNorm of q and k (q_norm, k_norm [hd] F32,
  // Qwen3; undefined tensors skip it), RoPE of q and k at positions, then
  // q_out [n, hq, hd] = rotated q and K/V written into the pages at
  // batch.slot_mapping (-1 skips). qkv is left unchanged. Follows the graph
  // contract above.
  virtual void qkv_rope_kv_write(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                 const RopeTable& rope, const AttentionBatch& batch, LayerKv& kv,
                                 Tensor& q_out) = 0;

  // ---- device runtime (cudaruntime): staging, queued copies, memory, sampling, graphs ----
  // Defaults are right for a backend whose "device" is host memory (CPU).

  // Host memory that queued copies read or write (CUDA: pinned), zeroed.
  virtual void* alloc_host(size_t bytes) { return std::calloc(1, bytes ? bytes : 1); }
  virtual void free_host(void* p) { std::free(p); }
  // Copies queued in order with the ops: the host side must stay valid and
  // unchanged (copy_to_host_async: unread) until synchronize(). CPU: at once.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes) { copy_to_device(dst, src, bytes); }
  virtual void copy_to_host_async(void* dst, const void* src, size_t bytes) { copy_to_host(dst, src, bytes); }
  // Device memory to device memory, queued in order with the ops.
  virtual void copy_device_to_device(void* dst, const void* src, size_t bytes) { copy_to_device(dst, src, bytes); }
  // Free and total bytes of device memory; false where there is no such
  // measure (CPU: the KV pool is sized from kv_cache_bytes).
  virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) {
    free_bytes = total_bytes = 0;
    return false;
  }

  // One step's sampling on the device (src/sampling/device_sampling.h). All
  // pointers are device memory. rows: const DeviceSampleRow[num_rows];
  // edit_ids/edit_vals: the rows' edits; scratch: [rows with scratch_row >= 0,
  // vocab] F32 for processed logits. Outputs per row: token; logprob, rank
  // and kMaxDeviceTopLogprobs top (id, logprob) entries when num_logprobs >= 0.
  struct SampleBatch {
    const float* logits = nullptr;  // [logit rows, vocab] F32
    int64_t vocab = 0;
    int num_rows = 0;
    const void* rows = nullptr;
    const int32_t* edit_ids = nullptr;
    const float* edit_vals = nullptr;
    float* scratch = nullptr;
    int32_t* tokens = nullptr;       // [num_rows]
    float* logprobs = nullptr;       // [num_rows]
    int32_t* ranks = nullptr;        // [num_rows]
    int32_t* top_ids = nullptr;      // [num_rows, kMaxDeviceTopLogprobs]
    float* top_logprobs = nullptr;   // [num_rows, kMaxDeviceTopLogprobs]
  };
  virtual bool supports_device_sampling() const { return false; }
  virtual void sample(const SampleBatch& batch) { (void)batch; }

  // Row counts (<= max_rows, ascending) at which a matmul of a given weight
  // shape settles its kernel choice for a range of row counts, e.g. by
  // timing candidates on first use. The engine runs one warm-up step at each
  // before serving, so no step pays for that choice. Empty: nothing to warm
  // (the CPU backend's kernels are fixed).
  virtual std::vector<int64_t> matmul_tuning_rows(int64_t max_rows) const {
    (void)max_rows;
    return {};
  }

  // Graphs: the ops queued between begin_capture() and end_capture() are
  // recorded (not run) and replayed by Graph::launch() with the same
  // pointers; nothing between may allocate, free, synchronise or copy to
  // the host. end_capture() returns null when capture failed.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void launch() = 0;
  };
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual std::unique_ptr<Graph> end_capture() { return nullptr; }

  // Timer marks, for the per-op profile (ops/profiling_backend.h): mark()
  // records a point in the queued work and returns its id; elapsed_ms(a, b)
  // is the device time from mark a to a later mark b in milliseconds, waiting
  // for b to be reached; negative when a mark is no longer held (a backend
  // holds at least the kTimerMarksHeld latest marks). Never called during
  // graph capture. Default: the host's steady clock, in nanoseconds, as the
  // id (right where ops run synchronously on the calling thread, as on the CPU).
  // Decorators (ProfilingBackend) forward every virtual of this class: a new
  // one needs its forward there too.
  static constexpr uint64_t kTimerMarksHeld = 8192;
  virtual uint64_t timer_mark() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  virtual double timer_elapsed_ms(uint64_t a, uint64_t b) {
    return (static_cast<double>(b) - static_cast<double>(a)) * 1e-6;
  }
};

// quantize_activations: 8-bit activations in matmuls with Q8_0/Q4_0/Q4_1
// weights (EngineConfig::quantize_activations).
std::unique_ptr<Backend> make_cpu_backend(int num_threads, bool quantize_activations = false);
#ifdef OSPREY_HAVE_CUDA
// Null when the device cannot be opened (the reason goes to stderr).
std::unique_ptr<Backend> make_cuda_backend(int device_index);
#endif

}  // namespace osprey::ops
