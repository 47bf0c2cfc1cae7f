// ModelExecutor: the Executor over a loaded Model on its backend. Owns the
// paged KV cache and the device copies of each step's index arrays.
#pragma once

#include <memory>
#include <vector>

#include "engine/executor.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "ops/backend.h"

namespace osprey {

class ModelExecutor final : public Executor {
 public:
  // The executor owns the backend and the model (declared in that order so
  // the model is destroyed first).
  ModelExecutor(std::unique_ptr<ops::Backend> backend, std::unique_ptr<Model> model);
  ~ModelExecutor() override;

  int vocab_size() const override { return model_->config().vocab_size; }
  Status initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) override;
  Status initialize_swap(int num_host_blocks) override;
  Expected<const float*> execute(const StepBatch& batch) override;

  Model& model() { return *model_; }

 private:
  void copy_blocks(const std::vector<BlockCopy>& copies);
  // Device page -> host slot (to_host) or host slot -> device page, every layer's K and V.
  void swap_blocks(const std::vector<BlockCopy>& copies, bool to_host);
  // Host array -> pointer the backend can read (CPU: the host array itself).
  const int32_t* to_device(int slot, const std::vector<int32_t>& host);

  std::unique_ptr<ops::Backend> backend_;
  std::unique_ptr<Model> model_;
  KvCache kv_;
  bool on_host_ = true;
  int max_logit_rows_ = 0;
  std::vector<float> host_logits_;      // staging for device logits
  std::vector<uint8_t> page_staging_;   // staging for device page copies
  // Host swap slots: one buffer per KV tensor (layer-major, K then V), each
  // [num_host_blocks, page bytes of that tensor].
  std::vector<std::vector<uint8_t>> host_swap_;
  int num_host_blocks_ = 0;
  struct DeviceArray {
    void* ptr = nullptr;
    size_t capacity = 0;  // bytes
  };
  std::vector<DeviceArray> device_arrays_;
};

}  // namespace osprey
