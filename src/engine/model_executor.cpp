#include "engine/model_executor.h"

#include <cstring>

#include "core/check.h"

namespace osprey {

ModelExecutor::ModelExecutor(std::unique_ptr<ops::Backend> backend, std::unique_ptr<Model> model)
    : backend_(std::move(backend)), model_(std::move(model)) {
  on_host_ = backend_->device() == Device::kCpu;
}

ModelExecutor::~ModelExecutor() {
  if (!kv_.layers.empty()) model_->free_kv(kv_);
  for (auto& a : device_arrays_)
    if (a.ptr) backend_->free(a.ptr);
}

Status ModelExecutor::initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) {
  if (num_blocks <= 0) return invalid_argument("the KV cache needs at least one page");
  kv_ = model_->allocate_kv(num_blocks, block_size);
  // A step without any wanted row still computes one (the model needs >= 1).
  max_logit_rows_ = std::min(max_logit_rows, max_tokens);
  model_->reserve(max_tokens, max_logit_rows_);
  return Status::Ok();
}

Status ModelExecutor::initialize_swap(int num_host_blocks) {
  if (num_host_blocks <= 0) return invalid_argument("swap space needs at least one page");
  if (kv_.layers.empty()) return internal_error("initialize_swap before initialize");
  num_host_blocks_ = num_host_blocks;
  host_swap_.clear();
  for (auto& layer : kv_.layers) {
    for (Tensor* t : {&layer.k, &layer.v}) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      host_swap_.emplace_back(page * static_cast<size_t>(num_host_blocks));
    }
  }
  return Status::Ok();
}

void ModelExecutor::swap_blocks(const std::vector<BlockCopy>& copies, bool to_host) {
  size_t ti = 0;
  for (auto& layer : kv_.layers) {
    for (Tensor* t : {&layer.k, &layer.v}) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      char* base = static_cast<char*>(t->data());
      uint8_t* host = host_swap_[ti++].data();
      for (const BlockCopy& c : copies) {
        const int32_t dev_page = to_host ? c.src : c.dst;
        const int32_t slot = to_host ? c.dst : c.src;
        OSP_CHECK(dev_page >= 0 && dev_page < kv_.num_blocks && slot >= 0 && slot < num_host_blocks_);
        char* dev = base + page * dev_page;
        uint8_t* h = host + page * slot;
        if (on_host_) {
          if (to_host) std::memcpy(h, dev, page); else std::memcpy(dev, h, page);
        } else {
          if (to_host) backend_->copy_to_host(h, dev, page); else backend_->copy_to_device(dev, h, page);
        }
      }
    }
  }
}

const int32_t* ModelExecutor::to_device(int slot, const std::vector<int32_t>& host) {
  if (on_host_) return host.data();
  if (static_cast<int>(device_arrays_.size()) <= slot) device_arrays_.resize(slot + 1);
  DeviceArray& a = device_arrays_[slot];
  const size_t bytes = host.size() * sizeof(int32_t);
  if (bytes > a.capacity) {
    if (a.ptr) backend_->free(a.ptr);
    a.capacity = std::max(bytes * 2, size_t{4096});
    a.ptr = backend_->alloc(a.capacity);
  }
  if (bytes) backend_->copy_to_device(a.ptr, host.data(), bytes);
  return static_cast<const int32_t*>(a.ptr);
}

void ModelExecutor::copy_blocks(const std::vector<BlockCopy>& copies) {
  for (auto& layer : kv_.layers) {
    for (Tensor* t : {&layer.k, &layer.v}) {
      const size_t page = static_cast<size_t>(t->nbytes() / kv_.num_blocks);
      char* base = static_cast<char*>(t->data());
      for (const BlockCopy& c : copies) {
        char* dst = base + page * c.dst;
        const char* src = base + page * c.src;
        if (on_host_) {
          std::memcpy(dst, src, page);
        } else {
          // TODO(cuda): a device-to-device copy op; staging keeps this correct meanwhile.
          page_staging_.resize(page);
          backend_->copy_to_host(page_staging_.data(), src, page);
          backend_->copy_to_device(dst, page_staging_.data(), page);
        }
      }
    }
  }
}

Expected<const float*> ModelExecutor::execute(const StepBatch& b) {
  if (!b.swap_out.empty()) swap_blocks(b.swap_out, true);
  if (!b.copies.empty()) copy_blocks(b.copies);
  if (!b.swap_in.empty()) swap_blocks(b.swap_in, false);
  if (b.num_tokens == 0) return static_cast<const float*>(nullptr);  // copies only
  const std::vector<int32_t>* rows = &b.logit_rows;
  if (static_cast<int>(rows->size()) > max_logit_rows_)
    return internal_error("step wants " + std::to_string(rows->size()) + " logit rows, reserved " +
                          std::to_string(max_logit_rows_));
  ForwardBatch fb;
  fb.token_ids = to_device(0, b.token_ids);
  fb.attn.num_seqs = b.num_seqs;
  fb.attn.num_tokens = b.num_tokens;
  fb.attn.max_kv_len = b.max_kv_len;
  fb.attn.max_q_len = b.max_q_len;
  fb.attn.q_indptr = to_device(1, b.q_indptr);
  fb.attn.kv_lens = to_device(2, b.kv_lens);
  fb.attn.block_indptr = to_device(3, b.block_indptr);
  fb.attn.block_indices = to_device(4, b.block_indices);
  fb.attn.positions = to_device(5, b.positions);
  fb.attn.slot_mapping = to_device(6, b.slot_mapping);
  fb.logit_rows = to_device(7, *rows);
  fb.num_logit_rows = static_cast<int>(rows->size());
  Tensor logits = model_->forward(fb, kv_);
  if (logits.device() == Device::kCpu) return static_cast<const float*>(logits.data());
  host_logits_.resize(static_cast<size_t>(logits.numel()));
  backend_->copy_to_host(host_logits_.data(), logits.data(), host_logits_.size() * sizeof(float));
  return static_cast<const float*>(host_logits_.data());
}

}  // namespace osprey
