#include "engine/batch_builder.h"

#include <algorithm>

#include "core/check.h"

namespace osprey {

void StepBatch::clear() {
  num_seqs = num_tokens = max_kv_len = max_q_len = 0;
  token_ids.clear();
  positions.clear();
  slot_mapping.clear();
  q_indptr.clear();
  kv_lens.clear();
  block_indptr.clear();
  block_indices.clear();
  logit_rows.clear();
  copies.clear();
  swap_out.clear();
  swap_in.clear();
  sample_rows.clear();
  sample_edits.clear();
  need_host_logits = true;
  token_fills.clear();
}

void build_step_batch(SchedulerOutput& sched, int block_size, StepBatch& b) {
  b.clear();
  b.copies = sched.copies;
  b.swap_out = sched.swap_out;
  b.swap_in = sched.swap_in;
  // Slots freed by a swap-in may be reused only from the next step on.
  OSP_CHECK(b.swap_out.empty() || b.swap_in.empty());
  b.q_indptr.push_back(0);
  b.block_indptr.push_back(0);
  // Single-token sequences (decodes) first, each group in scheduling order:
  // a backend may run a mixed step's leading decodes through its decode
  // attention kernel (AttentionBatch::num_leading_decodes).
  std::stable_partition(sched.seqs.begin(), sched.seqs.end(), [](const ScheduledSeq& ss) { return ss.num_new == 1; });
  for (ScheduledSeq& ss : sched.seqs) {
    const Sequence& seq = *ss.seq;
    const int begin = seq.num_computed;
    const int end = begin + ss.num_new;
    OSP_CHECK_LE(end, seq.num_tokens());
    const int num_pages = (end + block_size - 1) / block_size;
    OSP_CHECK_LE(num_pages, static_cast<int>(seq.table.blocks.size()));
    const int first_token = b.num_tokens;
    for (int p = begin; p < end; ++p) {
      if (seq.tokens[p] == kPendingToken) {
        // Sampled by the step in flight: only a sequence's last token can be.
        OSP_CHECK(p == seq.num_tokens() - 1 && seq.num_pending == 1 && seq.pending_sample_row >= 0);
        b.token_fills.push_back({b.num_tokens + (p - begin), seq.pending_sample_row});
      }
      b.token_ids.push_back(seq.tokens[p]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(seq.table.blocks[p / block_size] * block_size + p % block_size);
    }
    b.num_tokens += ss.num_new;
    b.q_indptr.push_back(b.num_tokens);
    b.kv_lens.push_back(end);
    b.block_indices.insert(b.block_indices.end(), seq.table.blocks.begin(), seq.table.blocks.begin() + num_pages);
    b.block_indptr.push_back(static_cast<int32_t>(b.block_indices.size()));
    b.max_kv_len = std::max(b.max_kv_len, end);
    b.max_q_len = std::max(b.max_q_len, ss.num_new);
    ++b.num_seqs;

    ss.first_logit_row = static_cast<int>(b.logit_rows.size());
    if (ss.num_prompt_logprob_rows > 0) {
      // Row of position p gives the logprob of prompt token p + 1.
      const int lp_begin = std::max(begin, seq.prompt_logprob_pos);
      for (int r = 0; r < ss.num_prompt_logprob_rows; ++r)
        b.logit_rows.push_back(first_token + (lp_begin - begin) + r);
    }
    if (ss.sample) b.logit_rows.push_back(first_token + ss.num_new - 1);
  }
}

}  // namespace osprey
