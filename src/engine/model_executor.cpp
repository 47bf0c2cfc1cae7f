#include "engine/model_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "engine/kv_calibration.h"
#include "ops/decode_order.h"

namespace osprey {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Edits (bias, masks, penalty ids) uploaded per step at most.
constexpr int kMaxEdits = 1 << 20;
// Rows with edits sampled on the device per step at most (scratch rows of vocab floats).
constexpr int kMaxScratchRows = 128;

}  // namespace

int leading_single_token_seqs(const std::vector<int32_t>& q_indptr) {
  size_t n = 0;
  while (n + 1 < q_indptr.size() && q_indptr[n + 1] - q_indptr[n] == 1) ++n;
  return static_cast<int>(n);
}

int decode_graph_bucket(int n, int max_bucket) {
  if (n <= 0 || n > max_bucket) return 0;
  int b = 1;
  while (b < n && b < 8) b *= 2;
  if (b < n) b = (n + 7) / 8 * 8;
  return std::min(b, max_bucket);
}

Expected<int64_t> kv_pages_from_memory(size_t free_bytes, size_t total_bytes, double utilization,
                                       size_t page_bytes) {
  if (!(utilization > 0.0 && utilization <= 1.0))
    return invalid_argument("gpu_memory_utilization must be in (0, 1], got " + std::to_string(utilization));
  if (page_bytes == 0) return invalid_argument("KV page size unknown");
  if (free_bytes > total_bytes) return internal_error("device reports more free than total memory");
  const double in_use = static_cast<double>(total_bytes - free_bytes);
  const double budget = static_cast<double>(total_bytes) * utilization - in_use;
  const int64_t pages = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(page_bytes)) : 0;
  if (pages <= 0) {
    return resource_exhausted(
        "no device memory left for the KV cache: " + std::to_string(total_bytes >> 20) + " MiB total x " +
        std::to_string(utilization) + " utilization = " +
        std::to_string(static_cast<int64_t>(static_cast<double>(total_bytes) * utilization) >> 20) + " MiB, but " +
        std::to_string(static_cast<int64_t>(in_use) >> 20) +
        " MiB are already in use (weights, step buffers, other processes); raise --gpu-memory-utilization, "
        "lower --max-num-batched-tokens, or set --kv-cache-mb");
  }
  return std::min<int64_t>(pages, int64_t{1} << 24);
}

ModelExecutor::ModelExecutor(std::unique_ptr<ops::Backend> backend, std::unique_ptr<Model> model,
                             ExecutorOptions options)
    : backend_(std::move(backend)), model_(std::move(model)), options_(options) {
  on_host_ = backend_->device() == Device::kCpu;
  profiler_ = dynamic_cast<ops::ProfilingBackend*>(backend_.get());
}

ProfileReport ModelExecutor::profile() const {
  ProfileReport r;
  if (!profiler_) return r;
  const ops::ProfileSnapshot s = profiler_->snapshot();
  for (const ops::ProfileGroup& g : s.groups)
    r.entries.push_back({g.phase, g.group, g.calls, g.total_ms, g.bytes, g.flops});
  r.prefill_steps = s.prefill_steps;
  r.decode_steps = s.decode_steps;
  r.untimed_calls = s.untimed_calls;
  r.copy_gbs = s.ceilings.copy_gbs;
  r.gemm_tflops = s.ceilings.gemm_tflops;
  r.gemm_shape = s.ceilings.gemm_shape;
  return r;
}

void ModelExecutor::reset_profile() {
  if (profiler_) profiler_->reset();
}

ModelExecutor::~ModelExecutor() {
  graphs_.clear();
  if (num_inflight_ > 0) backend_->synchronize();  // steps still queued use the buffers below
  if (!kv_.layers.empty()) model_->free_kv(kv_);
  for (void* p : host_swap_) backend_->free_host(p);
  free_step_buffers();
}

void ModelExecutor::set_limits(int max_num_seqs, int max_model_len) {
  if (max_num_seqs > 0) max_num_seqs_ = max_num_seqs;
  if (max_model_len > 0) max_model_len_ = max_model_len;
}

void ModelExecutor::free_step_buffers() {
  graphs_.clear();
  if (device_arrays_) backend_->free(device_arrays_);
  if (sample_scratch_) backend_->free(sample_scratch_);
  if (sample_out_) backend_->free(sample_out_);
  for (void*& p : staging_buf_) {
    if (p) backend_->free_host(p);
    p = nullptr;
  }
  for (void*& p : sample_out_host_) {
    if (p) backend_->free_host(p);
    p = nullptr;
  }
  if (host_logits_) backend_->free_host(host_logits_);
  device_arrays_ = staging_ = sample_out_ = nullptr;
  sample_scratch_ = host_logits_ = nullptr;
}

DeviceSamplingLimits ModelExecutor::device_sampling_limits() const {
  DeviceSamplingLimits l;
  if (on_host_ || !options_.enable_device_sampling || !backend_->supports_device_sampling() || !device_arrays_)
    return l;
  l.max_rows = layout_.max_sample_rows;
  l.max_edits = layout_.max_edits;
  l.max_scratch_rows = layout_.max_scratch_rows;
  return l;
}

Status ModelExecutor::allocate_step_buffers(int max_tokens, int max_logit_rows, int block_size) {
  Layout L;
  L.max_tokens = max_tokens;
  L.max_seqs = std::max(1, std::min(max_num_seqs_, max_tokens));
  const int pages_per_seq = (max_model_len_ + block_size - 1) / block_size;
  L.max_block_indices = L.max_seqs * pages_per_seq;
  L.max_logit_rows = max_logit_rows;
  // A step samples one token per sequence, n at a fork: bounded by the logit rows times a margin.
  L.max_sample_rows = std::max(max_logit_rows, max_num_seqs_) * 2;
  L.max_edits = kMaxEdits;
  L.max_scratch_rows = std::min(kMaxScratchRows, L.max_sample_rows);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + bytes);
    return at;
  };
  const size_t T = static_cast<size_t>(max_tokens), S = static_cast<size_t>(L.max_seqs);
  L.sampled = take(static_cast<size_t>(L.max_sample_rows) * 4);
  L.token_ids = take(T * 4);
  L.positions = take(T * 4);
  L.slot_mapping = take(T * 4);
  L.q_indptr = take((S + 1) * 4);
  L.kv_lens = take(S * 4);
  L.block_indptr = take((S + 1) * 4);
  L.logit_rows = take(static_cast<size_t>(max_logit_rows) * 4);
  L.fill_src = take(T * 4);
  L.decode_order = take(S * 4);  // between token_ids and block_indices: in upload 1
  L.block_indices = take(static_cast<size_t>(L.max_block_indices) * 4);
  L.sample_rows = take(static_cast<size_t>(L.max_sample_rows) * sizeof(DeviceSampleRow));
  L.edit_ids = take(static_cast<size_t>(L.max_edits) * 4);
  L.edit_vals = take(static_cast<size_t>(L.max_edits) * 4);
  L.bytes = off;

  if (device_arrays_ && L.bytes == layout_.bytes && L.max_sample_rows == layout_.max_sample_rows &&
      L.max_logit_rows == layout_.max_logit_rows)
    return Status::Ok();  // already allocated (profile_memory) with the same shapes
  free_step_buffers();
  layout_ = L;
  const size_t M = static_cast<size_t>(L.max_sample_rows);
  const size_t out_bytes = M * (12 + 8 * kMaxDeviceTopLogprobs);
  device_arrays_ = backend_->alloc(L.bytes);
  for (void*& p : staging_buf_) p = backend_->alloc_host(L.bytes);
  staging_ = staging_buf_[0];
  sample_out_ = backend_->alloc(out_bytes);
  for (void*& p : sample_out_host_) p = backend_->alloc_host(out_bytes);
  if (backend_->supports_device_sampling() && options_.enable_device_sampling)
    sample_scratch_ = static_cast<float*>(backend_->alloc(static_cast<size_t>(L.max_scratch_rows) *
                                                          static_cast<size_t>(vocab_size()) * sizeof(float)));
  if (!device_arrays_ || !staging_buf_[0] || !staging_buf_[1] || !sample_out_ || !sample_out_host_[0] ||
      !sample_out_host_[1] ||
      (backend_->supports_device_sampling() && options_.enable_device_sampling && !sample_scratch_))
    return resource_exhausted("out of memory for the step buffers (" + std::to_string(L.bytes >> 10) + " KiB)");
  results_.assign(M, DeviceSampleResult{});
  return Status::Ok();
}

ForwardBatch ModelExecutor::device_batch(int num_seqs, int num_tokens, int max_q_len, int max_kv_len,
                                         int num_logit_rows) const {
  const Layout& L = layout_;
  ForwardBatch fb;
  fb.token_ids = dev<int32_t>(L.token_ids);
  fb.attn.num_seqs = num_seqs;
  fb.attn.num_tokens = num_tokens;
  fb.attn.max_kv_len = max_kv_len;
  fb.attn.max_q_len = max_q_len;
  fb.attn.q_indptr = dev<int32_t>(L.q_indptr);
  fb.attn.kv_lens = dev<int32_t>(L.kv_lens);
  fb.attn.block_indptr = dev<int32_t>(L.block_indptr);
  fb.attn.block_indices = dev<int32_t>(L.block_indices);
  fb.attn.positions = dev<int32_t>(L.positions);
  fb.attn.slot_mapping = dev<int32_t>(L.slot_mapping);
  fb.logit_rows = dev<int32_t>(L.logit_rows);
  fb.num_logit_rows = num_logit_rows;
  return fb;
}

void ModelExecutor::warm_up(KvCache& kv, int block_size, int tokens) {
  // `tokens` tokens in sequences of up to max_model_len tokens, every page
  // read being page 0 and no KV written. At max_tokens: the largest
  // activations, GEMM shapes and attention work of any step.
  const Layout& L = layout_;
  const int want = std::clamp(tokens, 1, L.max_tokens);
  const int seq_len = std::max(1, std::min(want, max_model_len_));
  const int num_seqs = std::min(L.max_seqs, (want + seq_len - 1) / seq_len);
  const int T = std::min(want, num_seqs * seq_len);
  OSP_CHECK(kv.num_blocks >= 1);
  int32_t* ids = host<int32_t>(L.token_ids);
  int32_t* pos = host<int32_t>(L.positions);
  int32_t* slot = host<int32_t>(L.slot_mapping);
  int32_t* qi = host<int32_t>(L.q_indptr);
  int32_t* bi = host<int32_t>(L.block_indptr);
  qi[0] = bi[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int len = std::min(seq_len, T - s * seq_len);
    for (int p = 0; p < len; ++p) {
      const int t = s * seq_len + p;
      ids[t] = t % vocab_size();
      pos[t] = p;
      slot[t] = -1;
    }
    qi[s + 1] = qi[s] + len;
    host<int32_t>(L.kv_lens)[s] = len;
    bi[s + 1] = bi[s] + (len + block_size - 1) / block_size;
  }
  OSP_CHECK_LE(bi[num_seqs], L.max_block_indices);
  std::memset(host<int32_t>(L.block_indices), 0, static_cast<size_t>(bi[num_seqs]) * 4);
  const int rows = std::min(L.max_logit_rows, T);
  for (int r = 0; r < rows; ++r) host<int32_t>(L.logit_rows)[r] = T - rows + r;
  backend_->copy_to_device_async(dev<char>(L.token_ids), host<char>(L.token_ids),
                                 L.block_indices + static_cast<size_t>(bi[num_seqs]) * 4 - L.token_ids);
  model_->forward(device_batch(num_seqs, T, seq_len, seq_len, rows), kv);
  backend_->synchronize();
}

void ModelExecutor::warm_up_matmuls(KvCache& kv, int block_size) {
  // One step at each row count where the backend settles a matmul choice
  // (cuBLASLt autotuning buckets on CUDA) that warm_up and warm_up_decode
  // did not reach. Left to serving, the first step of each bucket timed 8
  // candidates per weight shape with host waits in between: on an H200 in
  // the online 100-stream run, mixed steps of 320-448 tokens averaged
  // 15.7-21.5 ms against 15.2 ms at 512, which had been tuned.
  // OSPREY_MATMUL_WARMUP=0 leaves them to serving (A/B runs).
  if (matmuls_warmed_) return;
  matmuls_warmed_ = true;
  if (const char* env = std::getenv("OSPREY_MATMUL_WARMUP"); env && std::string(env) == "0") return;
  const auto t0 = std::chrono::steady_clock::now();
  int steps = 0;
  for (const int64_t n : backend_->matmul_tuning_rows(layout_.max_tokens)) {
    if (n <= decode_warm_rows_ || n >= layout_.max_tokens) continue;  // decode buckets; warm_up's own step
    warm_up(kv, block_size, static_cast<int>(n));
    ++steps;
  }
  if (steps > 0)
    spdlog::info("matmul warm-up: {} steps of {}..{} tokens in {:.0f} ms", steps, decode_warm_rows_ + 1,
                 layout_.max_tokens,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void ModelExecutor::warm_up_decode(KvCache& kv) {
  // Every decode bucket once, all sequences padded (no KV read or written),
  // smallest first: scratch that grows with the batch reaches its largest
  // size here, before any graph is captured, so no captured graph ever
  // points at a buffer that later grows (and moves).
  const Layout& L = layout_;
  const int max_bucket = std::min({max_num_seqs_, L.max_tokens, L.max_logit_rows, L.max_seqs});
  int32_t* qi = host<int32_t>(L.q_indptr);
  int32_t* bi = host<int32_t>(L.block_indptr);
  for (int s = 0; s < max_bucket; ++s) {
    host<int32_t>(L.token_ids)[s] = 0;
    host<int32_t>(L.positions)[s] = 0;
    host<int32_t>(L.slot_mapping)[s] = -1;
    host<int32_t>(L.kv_lens)[s] = 0;
    host<int32_t>(L.logit_rows)[s] = s;
    host<int32_t>(L.decode_order)[s] = s;  // every bucket's prefix a permutation
    qi[s] = s;
    bi[s] = 0;
  }
  qi[max_bucket] = max_bucket;
  bi[max_bucket] = 0;
  backend_->copy_to_device_async(dev<char>(L.token_ids), host<char>(L.token_ids), L.block_indices - L.token_ids);
  int last = 0;
  for (int n = 1; n <= max_bucket; ++n) {
    const int b = decode_graph_bucket(n, max_bucket);
    if (b == last) continue;
    last = b;
    model_->forward(decode_graph_batch(b), kv);  // the shape its graph will record
  }
  backend_->synchronize();
  decode_warm_rows_ = std::max(decode_warm_rows_, max_bucket);
}

Expected<ModelExecutor::MemoryProfile> ModelExecutor::profile_memory(int max_tokens, int max_logit_rows,
                                                                     int block_size) {
  MemoryProfile prof;
  prof.weight_bytes = model_->weight_bytes();
  if (on_host_) return prof;
  size_t free0 = 0, total0 = 0;
  if (!backend_->memory_info(free0, total0)) return prof;
  prof.before_bytes = total0 - free0;
  if (max_tokens <= 0 || max_logit_rows <= 0) return invalid_argument("profile_memory needs positive sizes");
  const int rows = std::min(max_logit_rows, max_tokens);
  model_->reserve(max_tokens, rows);
  OSP_RETURN_IF_ERROR(allocate_step_buffers(max_tokens, rows, block_size));
  KvCache tmp = model_->allocate_kv(1, block_size);
  warm_up(tmp, block_size, max_tokens);
  warm_up_decode(tmp);
  warm_up_matmuls(tmp, block_size);
  model_->free_kv(tmp);
  prof.measured = backend_->memory_info(prof.free_bytes, prof.total_bytes);
  prof.in_use_bytes = prof.total_bytes - prof.free_bytes;
  return prof;
}

Status ModelExecutor::initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) {
  if (num_blocks <= 0) return invalid_argument("the KV cache needs at least one page");
  kv_ = model_->allocate_kv(num_blocks, block_size);
  block_size_ = block_size;
  // A step without any wanted row still computes one (the model needs >= 1).
  max_logit_rows_ = std::min(max_logit_rows, max_tokens);
  model_->reserve(max_tokens, max_logit_rows_);
  if (on_host_) return calibrate_kv_scales(max_tokens);
  OSP_RETURN_IF_ERROR(allocate_step_buffers(max_tokens, max_logit_rows_, block_size));
  OSP_RETURN_IF_ERROR(calibrate_kv_scales(max_tokens));
  // Scratch reaches its largest size before any graph is captured.
  warm_up(kv_, block_size, layout_.max_tokens);
  max_bucket_ = std::min({max_num_seqs_, max_tokens, max_logit_rows_, layout_.max_seqs});
  graphs_on_ = options_.enable_graphs && backend_->supports_graphs();
  if (graphs_on_) {
    warm_up_decode(kv_);
    decode_warmed_ = true;
  }
  warm_up_matmuls(kv_, block_size);
  if (graphs_on_) {
    capture_decode_graphs();
    if (graphs_on_)
      spdlog::info("decode graphs: {} buckets up to {} sequences captured in {:.0f} ms", graphs_.size(), max_bucket_,
                   capture_ms_);
  }
  return Status::Ok();
}

Status ModelExecutor::calibrate_kv_scales(int max_tokens) {
  const std::vector<int32_t>& all = options_.kv_calibration_tokens;
  if (all.empty() || model_->kv_dtype() != DType::kF8E4M3) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model_->config();
  const int n = static_cast<int>(std::min<size_t>(all.size(), static_cast<size_t>(max_tokens)));
  for (int i = 0; i < n; ++i) {
    if (all[i] < 0 || all[i] >= c.vocab_size) return internal_error("KV calibration token out of the vocabulary");
  }
  const int bs = block_size_;
  const int pages = (n + bs - 1) / bs;
  // One prompt of n tokens in pages 0.. of a cache in the activation dtype,
  // written in slot order, so that its first n page rows are the prompt's.
  StepBatch b;
  b.num_seqs = 1;
  b.num_tokens = n;
  b.max_kv_len = b.max_q_len = n;
  b.token_ids.assign(all.begin(), all.begin() + n);
  for (int t = 0; t < n; ++t) {
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  b.q_indptr = {0, n};
  b.kv_lens = {n};
  b.block_indptr = {0, pages};
  for (int p = 0; p < pages; ++p) b.block_indices.push_back(p);
  KvCache tmp = model_->allocate_kv_as(pages, bs, model_->activation_dtype());
  // No logit rows: the KV writes are what is wanted.
  ForwardBatch fb = on_host_ ? host_batch(b) : stage(b, 0);
  model_->forward(fb, tmp);
  // Each layer's K and V rows of the prompt, to the host, widened to fp32.
  const DType dt = model_->activation_dtype();
  const int64_t values = int64_t{n} * c.num_kv_heads * c.head_dim;
  std::vector<unsigned char> raw(static_cast<size_t>(dtype_row_bytes(dt, values)));
  std::vector<float> wide(static_cast<size_t>(values));
  auto amax_of = [&](const Tensor& pages) {
    backend_->copy_to_host_async(raw.data(), pages.data(), raw.size());
    backend_->synchronize();
    dequantize_row(dt, raw.data(), wide.data(), values);
    float amax = 0.0f;
    for (float x : wide) {
      if (std::isfinite(x)) amax = std::max(amax, std::abs(x));
    }
    return amax;
  };
  std::vector<float> k_amax, v_amax, k_scales, v_scales;
  for (const ops::LayerKv& layer : tmp.layers) {
    k_amax.push_back(amax_of(layer.k));
    v_amax.push_back(amax_of(layer.v));
    k_scales.push_back(kv_scale_from_amax(k_amax.back()));
    v_scales.push_back(kv_scale_from_amax(v_amax.back()));
  }
  model_->free_kv(tmp);
  OSP_RETURN_IF_ERROR(model_->set_kv_scales(k_scales, v_scales, "calibrated"));
  for (size_t l = 0; l < kv_.layers.size(); ++l) {
    kv_.layers[l].k_scale = k_scales[l];
    kv_.layers[l].v_scale = v_scales[l];
  }
  const auto [k_lo, k_hi] = std::minmax_element(k_amax.begin(), k_amax.end());
  const auto [v_lo, v_hi] = std::minmax_element(v_amax.begin(), v_amax.end());
  spdlog::info(
      "FP8 KV scales calibrated on {} tokens in {:.0f} ms: per layer |K| max {:.3g}..{:.3g}, |V| max {:.3g}..{:.3g}, "
      "each mapped to {:.0f} of E4M3's 448",
      n, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), *k_lo, *k_hi, *v_lo,
      *v_hi, kKvCalibrationRange);
  return Status::Ok();
}

void ModelExecutor::set_graphs_enabled(bool on) {
  // Captured graphs are kept while off: they stay valid (fixed buffers).
  graphs_on_ = on && !on_host_ && backend_->supports_graphs() && device_arrays_ && !kv_.layers.empty();
  if (graphs_on_ && !decode_warmed_) {
    warm_up_decode(kv_);
    decode_warmed_ = true;
  }
  if (graphs_on_) capture_decode_graphs();
}

Status ModelExecutor::initialize_swap(int num_host_blocks) {
  if (num_host_blocks <= 0) return invalid_argument("swap space needs at least one page");
  if (kv_.layers.empty()) return internal_error("initialize_swap before initialize");
  num_host_blocks_ = num_host_blocks;
  for (void* p : host_swap_) backend_->free_host(p);
  host_swap_.clear();
  for (auto& layer : kv_.layers) {
    for (Tensor* t : layer.page_tensors()) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      void* p = backend_->alloc_host(page * static_cast<size_t>(num_host_blocks));
      if (!p) return resource_exhausted("out of host memory for the swap space");
      host_swap_.push_back(p);
    }
  }
  return Status::Ok();
}

void ModelExecutor::move_blocks(const StepBatch& b) {
  if (!b.swap_out.empty()) swap_blocks(b.swap_out, true);
  if (!b.copies.empty()) copy_blocks(b.copies);
  if (!b.swap_in.empty()) swap_blocks(b.swap_in, false);
}

void ModelExecutor::swap_blocks(const std::vector<BlockCopy>& copies, bool to_host) {
  size_t ti = 0;
  for (auto& layer : kv_.layers) {
    for (Tensor* t : layer.page_tensors()) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      char* base = static_cast<char*>(t->data());
      char* host_base = static_cast<char*>(host_swap_[ti++]);
      for (const BlockCopy& c : copies) {
        const int32_t dev_page = to_host ? c.src : c.dst;
        const int32_t slot = to_host ? c.dst : c.src;
        OSP_CHECK(dev_page >= 0 && dev_page < kv_.num_blocks && slot >= 0 && slot < num_host_blocks_);
        char* d = base + page * dev_page;
        char* h = host_base + page * slot;
        // Queued on the stream: a swap-out is read back (swap-in) or its page
        // reused (forward) only by later work on the same stream.
        if (to_host) {
          backend_->copy_to_host_async(h, d, page);
        } else {
          backend_->copy_to_device_async(d, h, page);
        }
      }
    }
  }
}

void ModelExecutor::copy_blocks(const std::vector<BlockCopy>& copies) {
  for (auto& layer : kv_.layers) {
    for (Tensor* t : layer.page_tensors()) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      char* base = static_cast<char*>(t->data());
      for (const BlockCopy& c : copies) backend_->copy_device_to_device(base + page * c.dst, base + page * c.src, page);
    }
  }
}

ForwardBatch ModelExecutor::host_batch(const StepBatch& b) const {
  ForwardBatch fb;
  fb.token_ids = b.token_ids.data();
  fb.attn.num_seqs = b.num_seqs;
  fb.attn.num_tokens = b.num_tokens;
  fb.attn.max_kv_len = b.max_kv_len;
  fb.attn.max_q_len = b.max_q_len;
  fb.attn.q_indptr = b.q_indptr.data();
  fb.attn.kv_lens = b.kv_lens.data();
  fb.attn.block_indptr = b.block_indptr.data();
  fb.attn.block_indices = b.block_indices.data();
  fb.attn.positions = b.positions.data();
  fb.attn.slot_mapping = b.slot_mapping.data();
  fb.attn.num_leading_decodes = leading_single_token_seqs(b.q_indptr);
  fb.logit_rows = b.logit_rows.data();
  fb.num_logit_rows = static_cast<int>(b.logit_rows.size());
  return fb;
}

Expected<StepOutput> ModelExecutor::execute_on_host(const StepBatch& b) {
  StepOutput out;
  if (b.num_tokens == 0) return out;
  if (static_cast<int>(b.logit_rows.size()) > max_logit_rows_)
    return internal_error("step wants " + std::to_string(b.logit_rows.size()) + " logit rows, reserved " +
                          std::to_string(max_logit_rows_));
  Tensor logits = model_->forward(host_batch(b), kv_);
  out.logits = static_cast<const float*>(logits.data());
  return out;
}

ForwardBatch ModelExecutor::stage(const StepBatch& b, int padded) {
  const Layout& L = layout_;
  const int n = b.num_seqs;
  const int seqs = std::max(padded, n);
  const int tokens = b.num_tokens + (seqs - n);  // one token per padded sequence
  auto put = [&](size_t off, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(host<int32_t>(off), v.data(), v.size() * 4);
  };
  put(L.token_ids, b.token_ids);
  put(L.positions, b.positions);
  put(L.slot_mapping, b.slot_mapping);
  put(L.q_indptr, b.q_indptr);
  put(L.kv_lens, b.kv_lens);
  put(L.block_indptr, b.block_indptr);
  put(L.logit_rows, b.logit_rows);
  put(L.block_indices, b.block_indices);
  int num_logit_rows = static_cast<int>(b.logit_rows.size());
  if (seqs > n) {
    // Padded decode sequences: no KV (kv_len 0, no pages), no writes (slot -1).
    int32_t* qi = host<int32_t>(L.q_indptr);
    int32_t* bi = host<int32_t>(L.block_indptr);
    for (int s = n; s < seqs; ++s) {
      const int t = b.num_tokens + (s - n);
      host<int32_t>(L.token_ids)[t] = 0;
      host<int32_t>(L.positions)[t] = 0;
      host<int32_t>(L.slot_mapping)[t] = -1;
      host<int32_t>(L.kv_lens)[s] = 0;
      qi[s + 1] = qi[s] + 1;
      bi[s + 1] = bi[s];
      host<int32_t>(L.logit_rows)[s] = t;
    }
    num_logit_rows = seqs;
  }
  // The leading single-token sequences (all of a decode step, padding
  // included) most keys first: AttentionBatch::decode_order.
  const int lead = seqs > n ? seqs : leading_single_token_seqs(b.q_indptr);
  if (lead > 0) ops::longest_first_order(host<int32_t>(L.kv_lens), lead, host<int32_t>(L.decode_order));
  // Upload 1: the index arrays (the small ones, then the used block indices).
  if (!b.token_fills.empty()) {
    // Row t of token_ids takes sampled[fill_src[t]], or keeps its uploaded id (-1).
    int32_t* src = host<int32_t>(L.fill_src);
    std::fill(src, src + tokens, -1);
    for (const TokenFill& f : b.token_fills) src[f.token_row] = f.sample_row;
  }
  const size_t used_indices = b.block_indices.size() * 4;
  backend_->copy_to_device_async(dev<char>(L.token_ids), host<char>(L.token_ids),
                                 L.block_indices + used_indices - L.token_ids);
  if (!b.token_fills.empty()) {
    Tensor src(dev<int32_t>(L.sampled), DType::kI32, {L.max_sample_rows, 1}, backend_->device());
    Tensor out(dev<int32_t>(L.token_ids), DType::kI32, {tokens, 1}, backend_->device());
    backend_->fill_rows_from(src, dev<int32_t>(L.fill_src), tokens, out);
  }
  // Upload 2 and 3: the sample rows and their edits.
  if (!b.sample_rows.empty()) {
    const size_t rows_bytes = b.sample_rows.size() * sizeof(DeviceSampleRow);
    std::memcpy(host<char>(L.sample_rows), b.sample_rows.data(), rows_bytes);
    backend_->copy_to_device_async(dev<char>(L.sample_rows), host<char>(L.sample_rows), rows_bytes);
    const size_t ne = b.sample_edits.ids.size();
    if (ne) {
      std::memcpy(host<char>(L.edit_ids), b.sample_edits.ids.data(), ne * 4);
      std::memcpy(host<char>(L.edit_vals), b.sample_edits.vals.data(), ne * 4);
      // edit_ids and edit_vals are adjacent: one copy spans both (the gap is unused).
      backend_->copy_to_device_async(dev<char>(L.edit_ids), host<char>(L.edit_ids), L.edit_vals - L.edit_ids + ne * 4);
    }
  }
  ForwardBatch fb = device_batch(seqs, tokens, b.max_q_len, b.max_kv_len, num_logit_rows);
  fb.attn.num_leading_decodes = lead;
  if (lead > 0) fb.attn.decode_order = dev<int32_t>(L.decode_order);
  return fb;
}

ForwardBatch ModelExecutor::decode_graph_batch(int bucket) const {
  // What stage() builds for a pure-decode step padded to `bucket` sequences,
  // with the decode overrides of enqueue(): the graph's launch parameters
  // depend on these sizes only, never on the arrays' contents.
  ForwardBatch fb = device_batch(bucket, bucket, 1, max_model_len_, bucket);
  fb.attn.num_leading_decodes = bucket;
  fb.attn.decode_order = dev<int32_t>(layout_.decode_order);  // stage() fills it before every replay
  return fb;
}

bool ModelExecutor::capture_decode_graph(int bucket) {
  // Scratch of every bucket was reserved by warm_up_decode's eager forwards
  // (and its GEMM plans chosen), so the capture records the same launches
  // an eager step of this bucket makes and allocates nothing.
  OSP_CHECK(decode_warmed_);
  backend_->begin_capture();
  Tensor logits = model_->forward(decode_graph_batch(bucket), kv_);
  std::unique_ptr<ops::Backend::Graph> g = backend_->end_capture();
  if (!g) {
    graphs_on_ = false;  // capture unsupported here: eager from now on
    options_.enable_graphs = false;
    return false;
  }
  graphs_.emplace(bucket, CapturedGraph{std::move(g), logits});
  return true;
}

void ModelExecutor::capture_decode_graphs() {
  // Every bucket at start-up. Captured lazily, the first step of each bucket
  // ran an eager forward, the capture and the replay: on an H200 in offline
  // 2048/128, where the batch shrinks through ~30 buckets, those steps took
  // 1.5-2x a replay and the decode steps averaged 22.2 ms against 18.6 eager.
  const auto t0 = std::chrono::steady_clock::now();
  int last = 0;
  for (int n = 1; n <= max_bucket_ && graphs_on_; ++n) {
    const int b = decode_graph_bucket(n, max_bucket_);
    if (b == last) continue;
    last = b;
    if (graphs_.find(b) == graphs_.end() && !capture_decode_graph(b)) break;
  }
  capture_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Tensor ModelExecutor::run_graph(int bucket, const ForwardBatch& fb) {
  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) {
    // Not captured at start-up (graphs were off then): capture it now.
    if (!capture_decode_graph(bucket)) return model_->forward(fb, kv_);
    it = graphs_.find(bucket);
  }
  it->second.graph->launch();
  ++num_graph_replays_;
  return it->second.logits;
}

bool ModelExecutor::supports_async_steps() const {
  // The per-op profile resolves each step's marks when it ends: synchronous.
  return !on_host_ && profiler_ == nullptr && device_sampling_limits().max_rows > 0;
}

Expected<StepOutput> ModelExecutor::execute_step(const StepBatch& b) {
  // Profiling: this step's ops are timed; resolved when the scope ends (after the wait below).
  const ops::ProfileStepScope profile_step(profiler_, {b.num_seqs, b.num_tokens, b.q_indptr, b.kv_lens});
  if (on_host_) {
    last_device_ns_ = -1;
    move_blocks(b);
    return execute_on_host(b);
  }
  if (num_inflight_ > 0) return internal_error("execute_step while launched steps are in flight");
  OSP_RETURN_IF_ERROR(enqueue(b));
  return complete();
}

Status ModelExecutor::launch_step(const StepBatch& b) {
  if (!supports_async_steps()) return Executor::launch_step(b);
  return enqueue(b);
}

Expected<StepOutput> ModelExecutor::wait_step() {
  if (!supports_async_steps()) return Executor::wait_step();
  return complete();
}

Status ModelExecutor::enqueue(const StepBatch& b) {
  if (num_inflight_ >= 2) return internal_error("more than two steps in flight");
  const Layout& L = layout_;
  const int num_rows = static_cast<int>(b.logit_rows.size());
  if (b.num_tokens > 0) {
    if (num_rows > max_logit_rows_)
      return internal_error("step wants " + std::to_string(num_rows) + " logit rows, reserved " +
                            std::to_string(max_logit_rows_));
    if (b.num_tokens > L.max_tokens || b.num_seqs > L.max_seqs ||
        static_cast<int>(b.block_indices.size()) > L.max_block_indices)
      return internal_error("step exceeds the executor's limits (" + std::to_string(b.num_tokens) + " tokens, " +
                            std::to_string(b.num_seqs) + " sequences, " + std::to_string(b.block_indices.size()) +
                            " pages)");
  }
  const int num_samples = static_cast<int>(b.sample_rows.size());
  if (num_samples > 0 && (num_samples > L.max_sample_rows ||
                          static_cast<int>(b.sample_edits.ids.size()) > L.max_edits || !sample_scratch_))
    return internal_error("step exceeds the device sampler's limits");
  for (const TokenFill& f : b.token_fills)
    if (f.token_row < 0 || f.token_row >= b.num_tokens || f.sample_row < 0 || f.sample_row >= L.max_sample_rows)
      return internal_error("token fill out of range");
  if (b.need_host_logits && num_rows > 0 && !host_logits_) {
    host_logits_ = static_cast<float*>(backend_->alloc_host(static_cast<size_t>(max_logit_rows_) *
                                                            static_cast<size_t>(vocab_size()) * sizeof(float)));
    if (!host_logits_) return resource_exhausted("out of pinned host memory for logits");
  }

  // Buffers of step k: staging and results k % 2. Step k - 2, their last
  // user, has been waited for (at most two steps are in flight).
  const int buf = static_cast<int>(num_enqueued_ % 2);
  staging_ = staging_buf_[buf];
  InFlight& f = inflight_[(inflight_head_ + num_inflight_) % 2];
  f.host_buf = buf;
  f.num_samples = 0;
  f.want_logprobs = false;
  f.logits = nullptr;
  f.phases = false;
  f.mark_begin = backend_->timer_mark();
  // Queued before the forward.
  move_blocks(b);
  if (b.num_tokens > 0) {
    // Pure decode: one query token per sequence, each sequence's row wanted once.
    bool decode = b.num_tokens == b.num_seqs && num_rows == b.num_seqs;
    for (int i = 0; decode && i < num_rows; ++i) decode = b.logit_rows[i] == i;
    const int bucket = decode && graphs_on_ ? decode_graph_bucket(b.num_seqs, max_bucket_) : 0;

    ForwardBatch fb = stage(b, bucket);
    if (decode) {
      // Decode steps plan attention for the longest context any sequence may
      // have, eager or replayed alike, so a replay equals the eager step bit for bit.
      fb.attn.max_kv_len = max_model_len_;
      fb.attn.max_q_len = 1;
    }
    Tensor logits;
    f.phases = step_phases_;
    if (f.phases) f.mark_forward = backend_->timer_mark();
    if (bucket > 0) {
      logits = run_graph(bucket, fb);
    } else {
      logits = model_->forward(fb, kv_);
      if (decode) ++num_eager_decode_;
    }
    if (f.phases) f.mark_after = backend_->timer_mark();
    if (logits.dtype() != DType::kF32) return internal_error("the model's logits must be F32");
    const int64_t vocab = vocab_size();
    const size_t M = static_cast<size_t>(L.max_sample_rows);
    int32_t* d_tokens = dev<int32_t>(L.sampled);  // read by the next step's token fills
    float* d_lp = reinterpret_cast<float*>(static_cast<int32_t*>(sample_out_) + M);
    int32_t* d_rank = reinterpret_cast<int32_t*>(d_lp + M);
    int32_t* d_top_ids = d_rank + M;
    float* d_top_lp = reinterpret_cast<float*>(d_top_ids + M * kMaxDeviceTopLogprobs);
    if (num_samples > 0) {
      ops::Backend::SampleBatch sb;
      sb.logits = static_cast<const float*>(logits.data());
      sb.vocab = vocab;
      sb.num_rows = num_samples;
      sb.rows = dev<char>(L.sample_rows);
      sb.edit_ids = dev<int32_t>(L.edit_ids);
      sb.edit_vals = dev<float>(L.edit_vals);
      sb.scratch = sample_scratch_;
      sb.tokens = d_tokens;
      sb.logprobs = d_lp;
      sb.ranks = d_rank;
      sb.top_ids = d_top_ids;
      sb.top_logprobs = d_top_lp;
      backend_->sample(sb);
      f.row_logprobs.resize(static_cast<size_t>(num_samples));
      for (int i = 0; i < num_samples; ++i) {
        const bool lp = b.sample_rows[static_cast<size_t>(i)].num_logprobs >= 0;
        f.row_logprobs[static_cast<size_t>(i)] = lp ? 1 : 0;
        f.want_logprobs |= lp;
      }
      char* h = static_cast<char*>(sample_out_host_[buf]);
      const size_t ns = static_cast<size_t>(num_samples);
      backend_->copy_to_host_async(h, d_tokens, ns * 4);
      if (f.want_logprobs) {
        const size_t top = ns * kMaxDeviceTopLogprobs * 4;
        backend_->copy_to_host_async(h + M * 4, d_lp, ns * 4);
        backend_->copy_to_host_async(h + M * 8, d_rank, ns * 4);
        backend_->copy_to_host_async(h + M * 12, d_top_ids, top);
        backend_->copy_to_host_async(h + M * (12 + 4 * kMaxDeviceTopLogprobs), d_top_lp, top);
      }
      f.num_samples = num_samples;
    }
    if (b.need_host_logits && num_rows > 0) {
      backend_->copy_to_host_async(host_logits_, logits.data(),
                                   static_cast<size_t>(num_rows) * static_cast<size_t>(vocab) * sizeof(float));
      f.logits = host_logits_;
    }
  }
  f.mark_end = backend_->timer_mark();
  ++num_enqueued_;
  ++num_inflight_;
  return Status::Ok();
}

Expected<StepOutput> ModelExecutor::complete() {
  if (num_inflight_ == 0) return internal_error("wait_step: no step in flight");
  InFlight& f = inflight_[inflight_head_];
  inflight_head_ = (inflight_head_ + 1) % 2;
  --num_inflight_;
  // Waits for the end mark: the step's ids (and logits) are on the host.
  const double ms = backend_->timer_elapsed_ms(f.mark_begin, f.mark_end);
  if (ms < 0) backend_->synchronize();  // marks no longer held: wait for everything
  last_device_ns_ = ms >= 0 ? static_cast<int64_t>(ms * 1e6) : -1;
  last_phases_ = {};
  if (f.phases && ms >= 0) {
    auto ns = [&](uint64_t a, uint64_t b) {
      const double m = backend_->timer_elapsed_ms(a, b);
      return m >= 0 ? static_cast<int64_t>(m * 1e6) : int64_t{-1};
    };
    last_phases_ = {ns(f.mark_begin, f.mark_forward), ns(f.mark_forward, f.mark_after), ns(f.mark_after, f.mark_end)};
  }
  StepOutput out;
  out.logits = f.logits;
  if (f.num_samples > 0) {
    const size_t M = static_cast<size_t>(layout_.max_sample_rows);
    const char* h = static_cast<const char*>(sample_out_host_[f.host_buf]);
    const int32_t* tok = reinterpret_cast<const int32_t*>(h);
    const float* lp = reinterpret_cast<const float*>(h + M * 4);
    const int32_t* rank = reinterpret_cast<const int32_t*>(h + M * 8);
    const int32_t* top_ids = reinterpret_cast<const int32_t*>(h + M * 12);
    const float* top_lp = reinterpret_cast<const float*>(h + M * (12 + 4 * kMaxDeviceTopLogprobs));
    for (int i = 0; i < f.num_samples; ++i) {
      DeviceSampleResult& r = results_[static_cast<size_t>(i)];
      r.token = tok[i];
      if (f.row_logprobs[static_cast<size_t>(i)]) {
        r.logprob = lp[i];
        r.rank = rank[i];
        const size_t k = static_cast<size_t>(i) * kMaxDeviceTopLogprobs;
        std::copy(top_ids + k, top_ids + k + kMaxDeviceTopLogprobs, r.top_ids);
        std::copy(top_lp + k, top_lp + k + kMaxDeviceTopLogprobs, r.top_logprobs);
      }
    }
    out.samples = results_.data();
  }
  return out;
}

Expected<const float*> ModelExecutor::execute(const StepBatch& batch) {
  if (on_host_ || (batch.need_host_logits && batch.sample_rows.empty())) {
    OSP_ASSIGN_OR_RETURN(StepOutput out, execute_step(batch));
    return out.logits;
  }
  StepBatch copy = batch;  // not a hot path: callers of execute() want every logit row
  copy.sample_rows.clear();
  copy.sample_edits.clear();
  copy.need_host_logits = true;
  OSP_ASSIGN_OR_RETURN(StepOutput out, execute_step(copy));
  return out.logits;
}

}  // namespace osprey
