// CudaBackend::kv_write and paged_attention: shape checks, the split plan,
// and the kernel launches (kernels in kv_write.cu and paged_attention.cu).
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace osprey::cuda {
namespace {

// A split below this many keys costs more in the merge than it saves.
constexpr int kMinKeysPerSplit = 256;
constexpr int kMaxSplits = 32;

void check_cache(const ops::LayerKv& kv, int64_t hk, int64_t hd) {
  OSP_CHECK_EQ(kv.k.ndim(), 4);
  OSP_CHECK_EQ(kv.v.ndim(), 4);
  for (int i = 0; i < 4; ++i) OSP_CHECK_EQ(kv.k.dim(i), kv.v.dim(i));
  ops::Backend::check_kv_pages(kv);
  OSP_CHECK_MSG(kv.k.device() == Device::kCuda && kv.v.device() == Device::kCuda, "KV pages must be on the device");
  OSP_CHECK_EQ(kv.k.dim(2), hk);
  OSP_CHECK_EQ(kv.k.dim(3), hd);
}

}  // namespace

// The mixed step's side stream (cuda_backend_impl.h): created with the
// device's highest priority, so the decode part's blocks are dispatched
// before the prefill kernel's queued ones; fork and join are timing-free
// events.
struct CudaBackend::SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
  SideStream() {
    int least = 0, greatest = 0;
    OSP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    OSP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    OSP_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    OSP_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
  ~SideStream() {
    cudaEventDestroy(join);
    cudaEventDestroy(fork);
    cudaStreamDestroy(stream);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
};

bool CudaBackend::supports_kv_dtype(DType kv, DType act, int head_dim, int group) const {
  if (kv != DType::kI8) return ops::is_kv_page_dtype(kv);
  return (act == DType::kBF16 || act == DType::kF16) && (head_dim == 64 || head_dim == 128) && group >= 1;
}

void CudaBackend::kv_write(const Tensor& k, const Tensor& v, const ops::AttentionBatch& batch, ops::LayerKv& kv) {
  OSP_CHECK_MSG(k.dtype() == v.dtype() && supports_activation_dtype(k.dtype()),
                "kv_write k, v must be F32, BF16 or F16 (same dtype)");
  OSP_CHECK_MSG(k.device() == Device::kCuda && v.device() == Device::kCuda, "kv_write k, v must be on the device");
  OSP_CHECK_EQ(k.ndim(), 3);
  OSP_CHECK_EQ(v.ndim(), 3);
  for (int i = 0; i < 3; ++i) OSP_CHECK_EQ(k.dim(i), v.dim(i));
  OSP_CHECK_EQ(k.dim(0), batch.num_tokens);
  check_cache(kv, k.dim(1), k.dim(2));
  if (batch.num_tokens == 0) return;
  bind_device();
  launch_kv_write(k.dtype(), k.data(), v.data(), batch.slot_mapping, batch.num_tokens, static_cast<int>(k.dim(1)),
                  static_cast<int>(k.dim(2)), kv.k.dtype(), kv.k.data(), kv.v.data(), kv.k.dim(0) * kv.k.dim(1),
                  1.0f / kv.k_scale, 1.0f / kv.v_scale, kv.k_row_scales.data_as<float>(),
                  kv.v_row_scales.data_as<float>(), static_cast<int>(kv.k.dim(1)), stream_);
}

void CudaBackend::paged_attention(const Tensor& q, const ops::LayerKv& kv, const ops::AttentionBatch& batch,
                                  float scale, int sliding_window, Tensor& out) {
  OSP_CHECK_MSG(q.dtype() == out.dtype() && supports_activation_dtype(q.dtype()),
                "paged_attention q, out must be F32, BF16 or F16 (same dtype)");
  OSP_CHECK_MSG(q.device() == Device::kCuda && out.device() == Device::kCuda,
                "paged_attention q, out must be on the device");
  OSP_CHECK_EQ(q.ndim(), 3);
  OSP_CHECK_EQ(out.numel(), q.numel());
  OSP_CHECK_EQ(q.dim(0), batch.num_tokens);
  const int hq = static_cast<int>(q.dim(1));
  const int hd = static_cast<int>(q.dim(2));
  OSP_CHECK_EQ(kv.k.ndim(), 4);
  const int hk = static_cast<int>(kv.k.dim(2));
  check_cache(kv, hk, hd);
  OSP_CHECK_MSG(hk > 0 && hq % hk == 0, "query heads " << hq << " not a multiple of KV heads " << hk);
  OSP_CHECK_MSG(hd <= kMaxHeadDim, "head_dim " << hd << " exceeds " << kMaxHeadDim);
  OSP_CHECK_GE(sliding_window, 0);
  if (batch.num_tokens == 0 || batch.num_seqs == 0) return;
  bind_device();

  PagedAttentionArgs a;
  a.act = q.dtype();
  a.q = q.data();
  a.k_cache = kv.k.data();
  a.v_cache = kv.v.data();
  a.kv_dtype = kv.k.dtype();
  if (a.kv_dtype == DType::kF8E4M3) {
    a.k_scale = kv.k_scale;
    a.v_scale = kv.v_scale;
  }
  a.k_row_scales = kv.k_row_scales.data_as<float>();  // null but for I8 pages (check_kv_pages)
  a.v_row_scales = kv.v_row_scales.data_as<float>();
  a.num_blocks = static_cast<int>(kv.k.dim(0));
  a.block_size = static_cast<int>(kv.k.dim(1));
  a.hq = hq;
  a.hk = hk;
  a.hd = hd;
  a.num_seqs = batch.num_seqs;
  a.num_tokens = batch.num_tokens;
  a.max_q_len = batch.max_q_len;
  a.max_kv_len = batch.max_kv_len;
  a.q_indptr = batch.q_indptr;
  a.kv_lens = batch.kv_lens;
  a.block_indptr = batch.block_indptr;
  a.block_indices = batch.block_indices;
  a.positions = batch.positions;
  a.scale = scale;
  a.window = sliding_window;
  a.out = out.data();
  // The decode kernel's longest-first order (decode parts only; the prefill
  // kernels take none). OSPREY_DECODE_ORDER=0 ignores the hint (A/B).
  static const bool order_off = env_equals("OSPREY_DECODE_ORDER", "0");
  const int32_t* decode_order = order_off ? nullptr : batch.decode_order;
  // A mixed step whose leading sequences have one query token each (decodes
  // riding along prompt chunks): those rows go through the decode kernel and
  // the rest through the prefill kernels, each on its own sub-batch (views of
  // the same device arrays; token indices stay absolute through q_indptr).
  // The prefill kernels give single-token rows 64-128-row tiles of one
  // (sequence, KV head) and read their keys without splits.
  // The two parts run concurrently: the decode part (memory-bound) on a
  // side stream forked from stream_ after the step's K/V writes, the prompt
  // part (tensor-core bound) on stream_, which then waits for the side
  // stream before the o projection. Graph captures take the fork and join
  // as edges.
  // OSPREY_MIXED_ATTENTION=joint: one launch for the whole step;
  // =serial: the two parts one after the other on stream_ (A/B).
  const int lead = batch.num_leading_decodes;
  static const bool split_mixed = !env_equals("OSPREY_MIXED_ATTENTION", "joint");
  static const bool concurrent_mixed = !env_equals("OSPREY_MIXED_ATTENTION", "serial");
  if (split_mixed && lead > 0 && lead < batch.num_seqs && batch.num_tokens > batch.num_seqs &&
      options_.attention_splits <= 0) {
    PagedAttentionArgs d = a;
    d.seq_order = decode_order;
    d.num_seqs = lead;
    d.num_tokens = lead;
    d.max_q_len = 1;
    PagedAttentionArgs p = a;
    p.num_seqs = a.num_seqs - lead;
    p.num_tokens = a.num_tokens - lead;
    p.token_offset = a.token_offset + lead;
    p.q_indptr += lead;
    p.kv_lens += lead;
    p.block_indptr += lead;
    if (decode_attention_supported(d) && prefill_attention_supported(p)) {
      if (!concurrent_mixed) {
        run_attention(d, true, stream_);
        run_attention(p, false, stream_);
        return;
      }
      if (!side_) side_ = std::make_shared<SideStream>();
      OSP_CUDA_CHECK(cudaEventRecord(side_->fork, stream_));
      OSP_CUDA_CHECK(cudaStreamWaitEvent(side_->stream, side_->fork, 0));
      run_attention(d, true, side_->stream);
      run_attention(p, false, stream_);
      OSP_CUDA_CHECK(cudaEventRecord(side_->join, side_->stream));
      OSP_CUDA_CHECK(cudaStreamWaitEvent(stream_, side_->join, 0));
      return;
    }
  }
  // A pure decode step (one query token per sequence, padded sequences
  // included): everything launched depends on num_seqs and the shapes only
  // (graph contract in ops/backend.h); each split takes >= kMinKeysPerSplit
  // keys, so short contexts leave the later splits empty.
  const bool decode = batch.num_tokens == batch.num_seqs && batch.max_q_len <= 1;
  if (decode) {
    a.max_q_len = 1;
    a.seq_order = decode_order;
  }
  run_attention(a, decode, stream_);
}

// Plans the splits and launches the kernel for one (sub-)batch; decode: one
// query token per sequence, token s = sequence s. Scratch grows against
// stream_ (which orders every earlier use, side-stream ones joined), before
// the launch on `on`.
void CudaBackend::run_attention(PagedAttentionArgs& a, bool decode, cudaStream_t on) {
  const int hq = a.hq, hk = a.hk, hd = a.hd;
  // I8 pages have no generic kernel: a decode step the decode kernel does
  // not take (head_dim not 64 or 128, pages not 16-byte aligned) runs on the
  // prefill kernel, one query row a sequence.
  if (decode && a.kv_dtype == DType::kI8 && !decode_attention_supported(a)) decode = false;
  const bool decode_kernel = decode && decode_attention_supported(a);
  int splits = options_.attention_splits;
  if (splits <= 0 && decode_kernel) {
    plan_decode_splits(a, num_sms_);  // the decode kernels' own plan (decode_attention.cu)
    splits = a.num_splits;
  } else if (splits <= 0 && decode) {
    const int64_t blocks = int64_t{a.num_seqs} * attention_tiles_per_seq(1, hq / hk) * hk;
    splits = static_cast<int>(std::clamp<int64_t>((2 * int64_t{num_sms_} + blocks - 1) / blocks, 1, kMaxSplits));
    a.min_keys_per_split = kMinKeysPerSplit;
  } else if (splits <= 0) {
    // Split the KV range when the tiles alone leave most SMs idle (the
    // tensor-core prefill kernel does not split).
    splits = 1;
    const int64_t blocks = int64_t{a.num_seqs} * attention_tiles_per_seq(a.max_q_len, hq / hk) * hk;
    if (!prefill_attention_supported(a) && a.max_kv_len >= 2 * kMinKeysPerSplit &&
        blocks < 2 * int64_t{num_sms_}) {
      const int64_t by_len = a.max_kv_len / kMinKeysPerSplit;
      const int64_t by_sms = (2 * int64_t{num_sms_} + blocks - 1) / blocks;
      splits = static_cast<int>(std::clamp<int64_t>(std::min(by_len, by_sms), 1, kMaxSplits));
    }
  }
  a.num_splits = splits;
  if (splits > 1) {
    const size_t rows = static_cast<size_t>(splits) * static_cast<size_t>(a.num_tokens) * static_cast<size_t>(hq);
    a.part_acc = attn_acc_.reserve_as<float>(rows * static_cast<size_t>(hd), stream_);
    a.part_ml = attn_ml_.reserve_as<float>(rows * 2, stream_);
    // The decode kernel's in-kernel split merge, where the counters suffice.
    if (decode_kernel && decode_blocks_per_split(a) <= kDecodeSplitTickets) {
      a.split_tickets = static_cast<unsigned int*>(decode_tickets_.get());
    }
  }
  if (decode_kernel) {
    launch_decode_attention(a, on);
  } else if (!decode && splits == 1 && prefill_attention_supported(a)) {
    launch_prefill_attention(a, on);
  } else {
    launch_paged_attention(a, on);
  }
}

}  // namespace osprey::cuda
