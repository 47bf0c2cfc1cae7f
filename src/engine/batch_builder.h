// Batch builder: the scheduler's decisions for one step -> StepBatch host
// arrays (token ids, positions, slot mapping, CSR block tables, logit rows).
#pragma once

#include "engine/executor.h"
#include "engine/scheduler.h"

namespace osprey {

// Fills `batch` (reusing its capacity) and each ScheduledSeq's first_logit_row.
// Reorders sched.seqs first: sequences with one new token, then the others,
// each group in its scheduled order (the batch's sequences follow sched.seqs).
// Logit rows of a sequence: its prompt-logprob rows first, then its sample row.
// A pending token (kPendingToken, sampled by the step in flight) becomes a
// TokenFill from its sequence's pending_sample_row.
void build_step_batch(SchedulerOutput& sched, int block_size, StepBatch& batch);

}  // namespace osprey
