// The two BF16 prefill attention kernels behind launch_prefill_attention
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
// Blocks of 128 rows (hd 64; twice as many for hd 128) from which the
// automatic choice gives each warp 32 rows (two m16 tiles: half the K/V
// fragment loads per MMA) instead of 16.
constexpr int64_t kBlocksForTallWarps = 1024;

// Block shapes of the mma kernel (warps x rows per warp, keys per tile):
// 0 automatic, 1: 4 x 16 rows, 64 keys; 2: 8 x 16, 64; 3: 4 x 32, 32;
// 4: 4 x 32, 64; 5: 8 x 32, 32; 6: 4 x 16, 32 with Q re-read from shared
// memory (3 blocks per SM). All compute the same function.
constexpr int kNumPrefillMmaVariants = 7;

// Preconditions: prefill_attention_supported(a), a.out 16-byte aligned, at
// least one query token.
void launch_prefill_attention_mma(const PagedAttentionArgs& a, cudaStream_t stream, int variant = 0);

// The earlier wmma kernel (S and O in shared memory, synchronous loads) of
// prefill_attention.cu: the fallback for an unaligned out, and the baseline
// the throughput benchmark compares against. Same preconditions as
// launch_prefill_attention.
void launch_prefill_attention_wmma(const PagedAttentionArgs& a, cudaStream_t stream);

}  // namespace osprey::cuda
