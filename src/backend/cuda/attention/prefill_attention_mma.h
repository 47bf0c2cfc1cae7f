// The two BF16/F16 prefill attention kernels behind launch_prefill_attention
// (kernels.h): the register-resident mma.sync one (prefill_attention_mma.cu)
// and the wmma one it replaced (prefill_attention.cu).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace osprey::cuda {

// Rows per sequence (max_q_len * hq / hk) from which the automatic choice
// takes 128-row tiles instead of 64-row tiles: wider tiles halve the K/V
// reads per row but leave SMs idle on short batches.
constexpr int64_t kRowsForWideTiles = 1024;
// Blocks of 128 rows from which the automatic choice gives each warp 32
// rows (two m16 tiles: half the K/V fragment loads per MMA; 2 blocks of 4
// warps per SM) instead of 16 rows in one 8-warp block per SM (variant 7);
// head_dim 128, and head_dim 64 (where only 1024 blocks were measured with
// the longest-first order: 4 x 32 rows 10% faster there).
constexpr int64_t kBlocksForTallWarps = 512;
constexpr int64_t kBlocksForTallWarpsHd64 = 1024;

// Block shapes of the mma kernel (warps x rows per warp, keys per tile):
// 0 automatic, 1: 4 x 16 rows, 64 keys; 2: 8 x 16, 64; 3: 4 x 32, 32;
// 4: 4 x 32, 64; 5: 8 x 32, 32; 6: 4 x 16, 32 with Q re-read from shared
// memory (3 blocks per SM); 7: 8 x 16, 128 keys (half the per-tile softmax
// and barrier overhead of 2); 8: 12 x 16, 48 keys, Q re-read from shared
// memory (12 warps per SM in one block); 9: 4 x 32, 48 keys (4's shape in
// fewer registers); 10: 8 x 32, 48 keys (64 at head_dim 64). All compute
// the same function.
constexpr int kNumPrefillMmaVariants = 11;

// Order in which the blocks (row tile, sequence, KV head) are issued; the
// row tiles run from the last (most keys under a causal mask) to the first
// in both. kLongestFirst: by row tile, all KV heads and sequences of one
// tile before the next (longest-processing-time first over the whole grid);
// kPerHead: KV head by KV head (the order before 2026-11-26, kept for A/B).
enum class PrefillOrder { kLongestFirst, kPerHead };

// Preconditions: prefill_attention_supported(a), a.out 16-byte aligned, at
// least one query token.
void launch_prefill_attention_mma(const PagedAttentionArgs& a, cudaStream_t stream, int variant = 0,
                                  PrefillOrder order = PrefillOrder::kLongestFirst);

// The earlier wmma kernel (S and O in shared memory, synchronous loads) of
// prefill_attention.cu: the fallback for an unaligned out, and the baseline
// the throughput benchmark compares against. Same preconditions as
// launch_prefill_attention.
void launch_prefill_attention_wmma(const PagedAttentionArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
