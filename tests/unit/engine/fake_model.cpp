#include "fake_model.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "sampling/rng.h"

namespace osprey::testing {

void fake_logits(const std::vector<int32_t>& history, float* out) {
  uint64_t h = 0x1234567;
  for (int32_t t : history) h = splitmix64(h ^ static_cast<uint64_t>(t + 1));
  for (int v = 0; v < kFakeVocab; ++v) {
    const uint64_t x = splitmix64(h + static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15ULL);
    out[v] = static_cast<float>(x % 100000) / 10000.0f;  // [0, 10)
  }
}

Status FakeExecutor::initialize(int nb, int bs, int mt, int mlr) {
  num_blocks = nb;
  block_size = bs;
  max_tokens = mt;
  max_logit_rows = mlr;
  slots_.assign(static_cast<size_t>(nb) * bs, -1);
  logits_.assign(static_cast<size_t>(mlr) * kFakeVocab, 0.0f);
  return Status::Ok();
}

Status FakeExecutor::initialize_swap(int n) {
  num_host_blocks = n;
  host_.assign(static_cast<size_t>(n) * block_size, -1);
  return Status::Ok();
}

Expected<const float*> FakeExecutor::execute(const StepBatch& b) {
  if (fail_next) {
    fail_next = false;
    return internal_error("fake executor failure");
  }
  if (step_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us));
  ++num_executes;
  num_copies += static_cast<int64_t>(b.copies.size());
  max_tokens_seen = std::max(max_tokens_seen, b.num_tokens);
  if (b.num_tokens > max_tokens) return internal_error("step larger than reserved");
  if (static_cast<int>(b.logit_rows.size()) > max_logit_rows) return internal_error("too many logit rows");
  if (!b.swap_out.empty() && !b.swap_in.empty()) return internal_error("swap out and in in one step");
  for (const BlockCopy& c : b.swap_out) {
    if (c.src < 0 || c.src >= num_blocks || c.dst < 0 || c.dst >= num_host_blocks)
      return internal_error("swap-out copy out of range");
    std::copy_n(slots_.begin() + static_cast<size_t>(c.src) * block_size, block_size,
                host_.begin() + static_cast<size_t>(c.dst) * block_size);
  }
  num_swap_out_pages += static_cast<int64_t>(b.swap_out.size());
  for (const BlockCopy& c : b.copies)
    std::copy_n(slots_.begin() + static_cast<size_t>(c.src) * block_size, block_size,
                slots_.begin() + static_cast<size_t>(c.dst) * block_size);
  for (const BlockCopy& c : b.swap_in) {
    if (c.src < 0 || c.src >= num_host_blocks || c.dst < 0 || c.dst >= num_blocks)
      return internal_error("swap-in copy out of range");
    auto h = host_.begin() + static_cast<size_t>(c.src) * block_size;
    std::copy_n(h, block_size, slots_.begin() + static_cast<size_t>(c.dst) * block_size);
    std::fill_n(h, block_size, -1);
  }
  num_swap_in_pages += static_cast<int64_t>(b.swap_in.size());
  if (b.num_tokens == 0) return static_cast<const float*>(nullptr);
  for (int t = 0; t < b.num_tokens; ++t) slots_[b.slot_mapping[t]] = b.token_ids[t];
  std::vector<int32_t> history;
  for (size_t r = 0; r < b.logit_rows.size(); ++r) {
    const int t = b.logit_rows[r];
    int s = 0;
    while (b.q_indptr[s + 1] <= t) ++s;
    const int pos = b.positions[t];
    if (pos + 1 > b.kv_lens[s]) return internal_error("position beyond kv_len");
    history.clear();
    for (int p = 0; p <= pos; ++p) {
      const int page_idx = b.block_indptr[s] + p / block_size;
      if (page_idx >= b.block_indptr[s + 1]) return internal_error("block table too short");
      const int32_t tok = slots_[static_cast<size_t>(b.block_indices[page_idx]) * block_size + p % block_size];
      if (tok < 0) read_unwritten = true;
      history.push_back(tok);
    }
    fake_logits(history, logits_.data() + r * kFakeVocab);
  }
  return static_cast<const float*>(logits_.data());
}

std::string FakeCodec::token_text(int32_t id) {
  if (id == kFakeEos) return "<eos>";
  if (id <= 26) return std::string(1, static_cast<char>('a' + id - 1));
  if (id <= 52) return std::string(1, static_cast<char>('A' + id - 27));
  if (id <= 62) return std::string(1, static_cast<char>('0' + id - 53));
  return " ";
}

std::vector<int32_t> FakeCodec::encode(std::string_view text, bool) const {
  std::vector<int32_t> ids;
  for (char c : text) {
    for (int32_t v = 1; v < kFakeVocab; ++v)
      if (token_text(v)[0] == c) {
        ids.push_back(v);
        break;
      }
  }
  return ids;
}

std::string FakeCodec::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string s;
  for (int32_t id : ids)
    if (!(skip_special && id == kFakeEos)) s += token_text(id);
  return s;
}

namespace {
class FakeStreamDecoder final : public StreamDecoder {
 public:
  explicit FakeStreamDecoder(bool skip) : skip_(skip) {}
  std::string step(int32_t id) override { return skip_ && id == kFakeEos ? "" : FakeCodec::token_text(id); }
  std::string finish() override { return ""; }

 private:
  bool skip_;
};
}  // namespace

std::unique_ptr<StreamDecoder> FakeCodec::stream_decoder(bool skip, std::span<const int32_t>) const {
  return std::make_unique<FakeStreamDecoder>(skip);
}

RefResult reference_generate(const std::vector<int32_t>& prompt, const SamplingParams& params, uint64_t seed,
                             int index, int max_model_len) {
  RefResult r;
  std::vector<int32_t> tokens = prompt;
  std::vector<float> logits(kFakeVocab);
  Sampler sampler(kFakeVocab);
  std::vector<int32_t> stop_ids;
  if (!params.ignore_eos) stop_ids.push_back(kFakeEos);
  stop_ids.insert(stop_ids.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  while (true) {
    fake_logits(tokens, logits.data());
    SampleInput in;
    in.params = &params;
    in.prompt = std::span<const int32_t>(tokens.data(), prompt.size());
    in.output = std::span<const int32_t>(tokens.data() + prompt.size(), tokens.size() - prompt.size());
    in.stop_ids = stop_ids;
    in.seed = seed;
    in.seq_index = index;
    in.position = static_cast<int64_t>(tokens.size());
    const int32_t t = sampler.sample(logits.data(), in).token;
    tokens.push_back(t);
    r.tokens.push_back(t);
    const int n = static_cast<int>(r.tokens.size());
    if (n >= params.min_tokens &&
        (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end())) {
      r.finish = FinishReason::kStop;
      break;
    }
    if (n >= params.max_tokens || static_cast<int>(tokens.size()) >= max_model_len) {
      r.finish = FinishReason::kLength;
      break;
    }
  }
  return r;
}

}  // namespace osprey::testing
