// build_step_batch: sequence order (single-token sequences first, each group
// in scheduled order) and the arrays that follow it.
#include <gtest/gtest.h>

#include <vector>

#include "engine/batch_builder.h"
#include "engine/request_state.h"

namespace osprey::testing {
namespace {

// A sequence of `len` known tokens (ids 100 + position) with `computed` in
// its pages; pages first_page, first_page + 1, ... (block size 4).
Sequence make_seq(int len, int computed, int first_page) {
  Sequence s;
  for (int p = 0; p < len; ++p) s.tokens.push_back(100 + p);
  s.num_prompt_tokens = len;
  s.num_computed = computed;
  for (int p = 0; p < (len + 3) / 4; ++p) s.table.blocks.push_back(first_page + p);
  return s;
}

TEST(BuildStepBatch, SingleTokenSequencesComeFirstInScheduledOrder) {
  Sequence prompt_a = make_seq(6, 0, 0);   // 6 new tokens
  Sequence decode_b = make_seq(9, 8, 10);  // 1 new token at position 8
  Sequence chunk_c = make_seq(12, 4, 20);  // 5 new tokens at positions 4..8
  Sequence decode_d = make_seq(3, 2, 30);  // 1 new token at position 2
  SchedulerOutput sched;
  sched.seqs = {{&prompt_a, 6, true, 0, 0}, {&decode_b, 1, true, 0, 0}, {&chunk_c, 5, false, 0, 0},
                {&decode_d, 1, true, 0, 0}};
  sched.num_tokens = 13;
  StepBatch b;
  build_step_batch(sched, 4, b);

  ASSERT_EQ(sched.seqs.size(), 4u);
  EXPECT_EQ(sched.seqs[0].seq, &decode_b);
  EXPECT_EQ(sched.seqs[1].seq, &decode_d);
  EXPECT_EQ(sched.seqs[2].seq, &prompt_a);
  EXPECT_EQ(sched.seqs[3].seq, &chunk_c);
  EXPECT_EQ(b.num_seqs, 4);
  EXPECT_EQ(b.num_tokens, 13);
  EXPECT_EQ(b.q_indptr, (std::vector<int32_t>{0, 1, 2, 8, 13}));
  EXPECT_EQ(b.kv_lens, (std::vector<int32_t>{9, 3, 6, 9}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{8, 2, 0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.token_ids[0], 108);
  EXPECT_EQ(b.token_ids[1], 102);
  EXPECT_EQ(b.slot_mapping[0], 12 * 4 + 0);  // decode_b position 8: its page 2 (= 12), row 0
  EXPECT_EQ(b.slot_mapping[1], 30 * 4 + 2);
  EXPECT_EQ(b.block_indptr, (std::vector<int32_t>{0, 3, 4, 6, 9}));
  // Sample rows: each sampling sequence's last token, in the new order; the chunk samples nothing.
  EXPECT_EQ(b.logit_rows, (std::vector<int32_t>{0, 1, 7}));
  EXPECT_EQ(sched.seqs[0].first_logit_row, 0);
  EXPECT_EQ(sched.seqs[1].first_logit_row, 1);
  EXPECT_EQ(sched.seqs[2].first_logit_row, 2);
  EXPECT_EQ(b.max_q_len, 6);
  EXPECT_EQ(b.max_kv_len, 9);
}

}  // namespace
}  // namespace osprey::testing
