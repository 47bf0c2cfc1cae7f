// Test doubles for the engine: a fake Executor whose "KV cache" stores token
// ids in real pages (so paging, copy-on-write and prefix reuse bugs change
// the output), logits that are a deterministic function of the whole token
// history read back through the block table, and a one-character-per-token
// TextCodec. reference_generate() computes what a request must produce
// without any paging or batching.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "engine/text_codec.h"
#include "osprey/engine.h"
#include "sampling/sampler.h"

namespace osprey::testing {

constexpr int kFakeVocab = 64;
constexpr int32_t kFakeEos = 0;

// logits[v] for the sequence whose tokens so far are `history`.
void fake_logits(const std::vector<int32_t>& history, float* out);

class FakeExecutor final : public Executor {
 public:
  int vocab_size() const override { return kFakeVocab; }
  Status initialize(int num_blocks, int block_size, int max_tokens, int max_logit_rows) override;
  Status initialize_swap(int num_host_blocks) override;
  Expected<const float*> execute(const StepBatch& batch) override;

  int num_host_blocks = 0;
  int64_t num_swap_out_pages = 0;
  int64_t num_swap_in_pages = 0;
  int block_size = 0, num_blocks = 0, max_tokens = 0, max_logit_rows = 0;
  int64_t num_executes = 0;
  int64_t num_copies = 0;
  int max_tokens_seen = 0;
  bool read_unwritten = false;  // a read of a slot never written: a paging bug
  bool fail_next = false;       // the next execute returns an error
  int step_delay_us = 0;        // sleep per execute (to make a request slow)

 private:
  std::vector<int32_t> slots_;
  // Host swap slots: [num_host_blocks * block_size] token ids; -1 once read
  // back (a slot is swapped in once per swap-out).
  std::vector<int32_t> host_;
  std::vector<float> logits_;
};

// Token v > 0 is one character; 0 is the special EOS "<eos>".
class FakeCodec final : public TextCodec {
 public:
  static std::string token_text(int32_t id);
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  std::unique_ptr<StreamDecoder> stream_decoder(bool skip_special_tokens,
                                                std::span<const int32_t> prompt) const override;
  std::optional<int32_t> eos_id() const override { return kFakeEos; }
};

struct RefResult {
  std::vector<int32_t> tokens;  // generated
  FinishReason finish = FinishReason::kNone;
};
// What sequence `index` of a request must generate (EOS = kFakeEos, stop ids,
// max_tokens, max_model_len), sampled with the real Sampler from fake_logits.
RefResult reference_generate(const std::vector<int32_t>& prompt, const SamplingParams& params, uint64_t seed,
                             int index, int max_model_len);

}  // namespace osprey::testing
