// The device sampler (src/backend/cuda/sampling) against the host sampler
// (src/sampling) on random logits: greedy ids identical (ties to the lowest
// id), processed rows (bias, min_tokens masks, penalties) bit-identical,
// logprobs / ranks / top entries as compute_logprobs, seeded draws without
// truncation equal the host's, draws with top-k / top-p / min-p always inside
// the host's kept set, a row's result independent of the other rows, and
// the device's uniform numbers equal sampling_uniform.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/sampling/sampler.h"
#include "gpu_test_util.h"
#include "osprey/engine.h"
#include "sampling/device_sampling.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"

namespace osprey::gpu_test {
namespace {

// One sampled row described on the host: its parameters and token history.
struct HostRow {
  SamplingParams p;
  std::vector<int32_t> prompt, output, stop_ids;
  uint64_t seed = 0;
  int seq_index = 0;
  int64_t position = 0;
  int logit_row = 0;
};

struct DeviceOut {
  std::vector<DeviceSampleResult> results;
  std::vector<float> scratch;  // processed rows
};

class SamplingTest : public GpuTest {
 protected:
  // Runs the device sampler over logits [num_logit_rows, vocab] for `rows`.
  DeviceOut run(const std::vector<float>& logits, int64_t vocab, const std::vector<HostRow>& rows) {
    std::vector<DeviceSampleRow> drows;
    DeviceSampleEdits edits;
    int scratch_rows = 0;
    for (const HostRow& h : rows) {
      DeviceSampleRow r;
      r.logit_row = h.logit_row;
      const size_t before = edits.ids.size();
      make_device_sample_row(h.p, h.prompt, h.output, h.stop_ids, h.seed, h.seq_index, h.position, r, edits);
      r.scratch_row = edits.ids.size() > before ? scratch_rows++ : -1;
      drows.push_back(r);
    }
    const size_t n = rows.size();
    DeviceMem d_logits = upload(gpu(), logits);
    DeviceMem d_rows = upload_bytes(gpu(), drows.data(), drows.size() * sizeof(DeviceSampleRow));
    edits.ids.push_back(0);  // never empty
    edits.vals.push_back(0.0f);
    DeviceMem d_ids = upload(gpu(), edits.ids);
    DeviceMem d_vals = upload(gpu(), edits.vals);
    DeviceMem d_scratch(gpu(), std::max<size_t>(1, static_cast<size_t>(scratch_rows) * vocab) * sizeof(float));
    DeviceMem d_tok(gpu(), n * 4), d_lp(gpu(), n * 4), d_rank(gpu(), n * 4);
    DeviceMem d_top_ids(gpu(), n * kMaxDeviceTopLogprobs * 4), d_top_lp(gpu(), n * kMaxDeviceTopLogprobs * 4);
    ops::Backend::SampleBatch b;
    b.logits = d_logits.as<float>();
    b.vocab = vocab;
    b.num_rows = static_cast<int>(n);
    b.rows = d_rows.get();
    b.edit_ids = d_ids.as<int32_t>();
    b.edit_vals = d_vals.as<float>();
    b.scratch = d_scratch.as<float>();
    b.tokens = d_tok.as<int32_t>();
    b.logprobs = d_lp.as<float>();
    b.ranks = d_rank.as<int32_t>();
    b.top_ids = d_top_ids.as<int32_t>();
    b.top_logprobs = d_top_lp.as<float>();
    gpu().sample(b);
    gpu().synchronize();
    auto tok = download<int32_t>(gpu(), d_tok, n);
    auto lp = download<float>(gpu(), d_lp, n);
    auto rank = download<int32_t>(gpu(), d_rank, n);
    auto top_ids = download<int32_t>(gpu(), d_top_ids, n * kMaxDeviceTopLogprobs);
    auto top_lp = download<float>(gpu(), d_top_lp, n * kMaxDeviceTopLogprobs);
    DeviceOut out;
    out.results.resize(n);
    for (size_t i = 0; i < n; ++i) {
      DeviceSampleResult& r = out.results[i];
      r.token = tok[i];
      r.logprob = lp[i];
      r.rank = rank[i];
      std::copy_n(top_ids.begin() + i * kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs, r.top_ids);
      std::copy_n(top_lp.begin() + i * kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs, r.top_logprobs);
    }
    out.scratch = download<float>(gpu(), d_scratch, static_cast<size_t>(scratch_rows) * vocab);
    return out;
  }

  static SampleResult host_sample(const std::vector<float>& logits, int64_t vocab, const HostRow& h) {
    Sampler s(static_cast<int>(vocab));
    SampleInput in;
    in.params = &h.p;
    in.prompt = h.prompt;
    in.output = h.output;
    in.stop_ids = h.stop_ids;
    in.seed = h.seed;
    in.seq_index = h.seq_index;
    in.position = h.position;
    return s.sample(logits.data() + static_cast<size_t>(h.logit_row) * vocab, in);
  }

  static std::vector<float> random_logits(int rows, int64_t vocab, uint32_t seed, float scale = 4.0f) {
    std::vector<float> v = random_floats(static_cast<size_t>(rows) * vocab, seed, -scale, scale);
    // Ties at the maximum: a copy of the row's max at a later and an earlier id.
    std::mt19937 rng(seed);
    for (int r = 0; r < rows; r += 3) {
      float* row = v.data() + static_cast<size_t>(r) * vocab;
      const int64_t a = rng() % vocab, b = rng() % vocab;
      row[a] = row[b] = scale + 1.0f;
    }
    return v;
  }
};

TEST_F(SamplingTest, GreedyEqualsHostArgmaxWithTies) {
  for (int64_t vocab : {int64_t{49152}, int64_t{1007}, int64_t{128256}}) {
    const int rows = 24;
    std::vector<float> logits = random_logits(rows, vocab, 11 + static_cast<uint32_t>(vocab));
    std::vector<HostRow> hr(rows);
    for (int r = 0; r < rows; ++r) {
      hr[r].p.temperature = 0.0f;
      hr[r].logit_row = rows - 1 - r;  // rows out of order
    }
    DeviceOut d = run(logits, vocab, hr);
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(d.results[r].token, host_sample(logits, vocab, hr[r]).token) << "vocab " << vocab << " row " << r;
  }
}

// The scan's 16-byte path and its tail (vocab 128258: two floats past the
// last whole group; odd rows misaligned, so the one-float path too), with
// NaN and -inf entries, a maximum in the tail, ties across the vectorised
// groups, an all -inf row and an all-NaN row: the host's greedy choice and
// logprobs each time.
TEST_F(SamplingTest, GreedyScanPathsWithNanInfAndTail) {
  const int64_t vocab = 128258;
  const int rows = 8;
  std::vector<float> logits = random_floats(static_cast<size_t>(rows) * vocab, 77, -3.0f, 3.0f);
  auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * vocab; };
  for (int r = 0; r < rows; ++r) {
    for (int64_t i = r; i < vocab; i += 997) row(r)[i] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 3 * r + 1; i < vocab; i += 1009) row(r)[i] = -std::numeric_limits<float>::infinity();
  }
  row(0)[vocab - 1] = 9.0f;                      // the maximum in the tail
  row(1)[4 * 512 * 4 + 3] = row(1)[70001] = 9.0f;  // a tie across groups: the lower id
  row(2)[5] = 9.0f;                              // the first group
  for (int64_t i = 0; i < vocab; ++i) row(3)[i] = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) row(4)[i] = std::numeric_limits<float>::quiet_NaN();
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].p.temperature = 0.0f;
    hr[r].p.logprobs = r % 2 == 0 ? 3 : -1;
    hr[r].logit_row = r;
  }
  DeviceOut d = run(logits, vocab, hr);
  for (int r = 0; r < rows; ++r) {
    const SampleResult h = host_sample(logits, vocab, hr[r]);
    EXPECT_EQ(d.results[r].token, h.token) << "row " << r;
  }
  EXPECT_EQ(d.results[0].token, vocab - 1);
  EXPECT_EQ(d.results[1].token, 4 * 512 * 4 + 3);
  EXPECT_EQ(d.results[2].token, 5);
}

TEST_F(SamplingTest, ProcessedRowsBitIdenticalAndGreedyEqual) {
  const int64_t vocab = 5003;
  const int rows = 8;
  std::vector<float> logits = random_logits(rows, vocab, 5);
  std::mt19937 rng(3);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    HostRow& h = hr[r];
    h.logit_row = r;
    h.p.temperature = 0.0f;
    for (int i = 0; i < 40; ++i) h.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    for (int i = 0; i < 30; ++i) h.output.push_back(static_cast<int32_t>(rng() % 50));  // repeats
    h.stop_ids = {1, 2, 2, 7};
    if (r % 2 == 0) h.p.repetition_penalty = 1.3f;
    if (r % 3 == 0) h.p.frequency_penalty = 0.7f;
    if (r % 4 == 0) h.p.presence_penalty = -0.4f;
    if (r != 5) h.p.logit_bias = {{3, 2.5f}, {static_cast<int32_t>(vocab - 1), -1.0f}, {9, 30.0f}};
    if (r % 2 == 1) h.p.min_tokens = 100;  // masks the stop ids
  }
  DeviceOut d = run(logits, vocab, hr);
  int scratch_row = 0;
  for (int r = 0; r < rows; ++r) {
    const HostRow& h = hr[r];
    EXPECT_EQ(d.results[r].token, host_sample(logits, vocab, h).token) << "row " << r;
    // The processed row, exactly as the host sampler builds it.
    std::vector<float> ref(logits.begin() + static_cast<size_t>(r) * vocab,
                           logits.begin() + static_cast<size_t>(r + 1) * vocab);
    std::span<float> row(ref);
    apply_logit_bias(row, h.p.logit_bias);
    if (static_cast<int>(h.output.size()) < h.p.min_tokens) mask_tokens(row, h.stop_ids);
    apply_repetition_penalty(row, h.prompt, h.output, h.p.repetition_penalty);
    apply_frequency_presence(row, h.output, h.p.frequency_penalty, h.p.presence_penalty);
    const float* got = d.scratch.data() + static_cast<size_t>(scratch_row++) * vocab;
    int mismatches = 0;
    for (int64_t i = 0; i < vocab; ++i) mismatches += std::memcmp(&got[i], &ref[i], 4) != 0;
    EXPECT_EQ(mismatches, 0) << "row " << r;
  }
}

TEST_F(SamplingTest, LogprobsMatchHost) {
  const int64_t vocab = 32000;
  const int rows = 6;
  std::vector<float> logits = random_logits(rows, vocab, 17, 8.0f);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].logit_row = r;
    hr[r].p.temperature = r < 3 ? 0.0f : 0.9f;
    hr[r].p.logprobs = (r * 7) % 21;
    hr[r].seed = 100 + r;
    hr[r].position = 12;
    if (r == 4) hr[r].p.logit_bias = {{5, 40.0f}};  // logprobs stay those of the raw row
  }
  DeviceOut d = run(logits, vocab, hr);
  for (int r = 0; r < rows; ++r) {
    const DeviceSampleResult& g = d.results[r];
    std::span<const float> raw(logits.data() + static_cast<size_t>(r) * vocab, vocab);
    LogprobData ref = compute_logprobs(raw, g.token, hr[r].p.logprobs);
    EXPECT_NEAR(g.logprob, ref.logprob, 1e-5) << "row " << r;
    EXPECT_EQ(g.rank, ref.rank) << "row " << r;
    ASSERT_EQ(static_cast<int>(ref.top.size()), hr[r].p.logprobs);
    for (size_t j = 0; j < ref.top.size(); ++j) {
      EXPECT_EQ(g.top_ids[j], ref.top[j].first) << "row " << r << " entry " << j;
      EXPECT_NEAR(g.top_logprobs[j], ref.top[j].second, 1e-5) << "row " << r << " entry " << j;
    }
    if (r == 4) {
      EXPECT_EQ(g.token, 5);
    }
  }
}

TEST_F(SamplingTest, UntruncatedDrawsEqualHostDraws) {
  // Without top-k / top-p both samplers walk the tokens in id order.
  const int64_t vocab = 2048;
  const int rows = 200;
  std::vector<float> logits = random_logits(rows, vocab, 23, 3.0f);
  std::vector<HostRow> hr(rows);
  for (int r = 0; r < rows; ++r) {
    hr[r].logit_row = r;
    hr[r].p.temperature = 0.5f + 0.01f * static_cast<float>(r % 50);
    hr[r].seed = 1000 + static_cast<uint64_t>(r);
    hr[r].seq_index = r % 3;
    hr[r].position = 40 + r;
  }
  DeviceOut d = run(logits, vocab, hr);
  int same = 0;
  for (int r = 0; r < rows; ++r) same += d.results[r].token == host_sample(logits, vocab, hr[r]).token;
  // Fixed-point weights can move a draw that lands within ~1e-12 of a boundary.
  EXPECT_GE(same, rows - 2);
}

TEST_F(SamplingTest, TruncatedDrawsStayInHostKeptSet) {
  const int64_t vocab = 300;
  std::vector<float> logits = random_logits(1, vocab, 29, 2.0f);
  struct Case {
    int top_k;
    float top_p, min_p, temperature;
  };
  const std::vector<Case> cases = {{10, 1.0f, 0.0f, 1.0f}, {0, 0.5f, 0.0f, 1.0f}, {0, 1.0f, 0.3f, 0.7f},
                                   {40, 0.8f, 0.05f, 1.3f}, {1, 1.0f, 0.0f, 1.0f}, {0, 0.01f, 0.0f, 1.0f}};
  for (const Case& c : cases) {
    std::vector<HostRow> hr(256);
    for (size_t i = 0; i < hr.size(); ++i) {
      hr[i].p.temperature = c.temperature;
      hr[i].p.top_k = c.top_k;
      hr[i].p.top_p = c.top_p;
      hr[i].p.min_p = c.min_p;
      hr[i].seed = 7;
      hr[i].position = static_cast<int64_t>(i);
    }
    Candidates kept;
    truncate_distribution(std::span<const float>(logits.data(), vocab), c.temperature, c.min_p, c.top_k, c.top_p,
                          kept);
    const std::set<int32_t> allowed(kept.ids.begin(), kept.ids.end());
    DeviceOut d = run(logits, vocab, hr);
    std::set<int32_t> seen;
    for (const auto& r : d.results) {
      EXPECT_TRUE(allowed.count(r.token)) << "token " << r.token << " outside the kept set (k " << c.top_k << ", p "
                                          << c.top_p << ", min_p " << c.min_p << ")";
      seen.insert(r.token);
    }
    if (allowed.size() > 4) {
      EXPECT_GT(seen.size(), 2u) << "draws should spread over the kept set";
    }
  }
}

TEST_F(SamplingTest, RowResultIndependentOfBatch) {
  const int64_t vocab = 49152;
  std::vector<float> logits = random_logits(8, vocab, 31);
  HostRow probe;
  probe.logit_row = 5;
  probe.p.temperature = 0.8f;
  probe.p.top_p = 0.9f;
  probe.p.top_k = 50;
  probe.p.repetition_penalty = 1.1f;
  probe.prompt = {1, 2, 3};
  probe.seed = 99;
  probe.position = 7;
  probe.p.logprobs = 3;
  DeviceOut alone = run(logits, vocab, {probe});
  std::vector<HostRow> many(12);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i].logit_row = static_cast<int>(i % 8);
    many[i].p.temperature = (i % 2) ? 0.0f : 1.0f;
    many[i].p.frequency_penalty = 0.3f;
    many[i].output = {4, 4, 5};
    many[i].seed = i;
  }
  many[7] = probe;
  DeviceOut batched = run(logits, vocab, many);
  EXPECT_EQ(batched.results[7].token, alone.results[0].token);
  EXPECT_EQ(batched.results[7].logprob, alone.results[0].logprob);
}

TEST_F(SamplingTest, DeviceUniformEqualsHost) {
  const int n = 1000;
  std::vector<uint64_t> seeds(n);
  std::vector<int32_t> idx(n);
  std::vector<int64_t> pos(n);
  std::mt19937_64 rng(5);
  for (int i = 0; i < n; ++i) {
    seeds[i] = rng();
    idx[i] = static_cast<int32_t>(rng() % 128);
    pos[i] = static_cast<int64_t>(rng() % 100000);
  }
  DeviceMem ds = upload(gpu(), seeds), di = upload(gpu(), idx), dp = upload(gpu(), pos);
  DeviceMem out(gpu(), n * sizeof(double));
  auto* be = dynamic_cast<cuda::CudaBackend*>(&gpu());
  ASSERT_NE(be, nullptr);
  cuda::device_sampling_uniform(ds.as<uint64_t>(), di.as<int32_t>(), dp.as<int64_t>(), n, out.as<double>(),
                                be->stream());
  auto got = download<double>(gpu(), out, n);
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], sampling_uniform(seeds[i], idx[i], pos[i])) << i;
}

}  // namespace
}  // namespace osprey::gpu_test
