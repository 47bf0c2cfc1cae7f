// The opt-in 8-bit activation path of the CPU matmul (EngineConfig::
// quantize_activations): each activation row is quantised to blocks of 32
// int8 values with one fp32 scale per block, and multiplied against Q8_0 /
// Q4_0 / Q4_1 weights with integer dot products (exact int32 block sums), so
// that only the per-block scaling is floating point.
//
// For weight row w and activation row x, block b (32 elements):
//   isum_b = sum_e qw_e * qx_e           (exact; qw = Q8_0 q, Q4_0 q - 8, Q4_1 q)
//   out    = sum_b (dw_b * dx_b) * isum_b + [Q4_1] sum_b mw_b * sx_b
// with dx_b = amax_b / 127, qx = round_half_even(x * 127 / amax_b) in
// [-127, 127], sx_b = dx_b * sum_e qx_e. Each ISA fixes the fp32 summation
// order of these terms, and it is the same for every n: a request's output
// does not depend on the other rows of its batch.
//
// Layout: 8 blocks form a group (256 elements). Within a group, element e of
// block 8g + L sits at byte t * 32 + L * 4 + j with t = (e % 32) / 4 and
// j = e % 4, so one 32-byte vector t holds four elements of each of the 8
// blocks and an int32 lane of a u8 x s8 dot product (vpdpbusd, or
// maddubs + madd) sums four products of one block only. Lane L then carries
// block L's sum after the 8 vectors of the group: the scales are applied once
// per group (8 lanes), not once per block.
//
// The last group may hold G < 8 blocks (k % 256 != 0). It is stored in
// G' = the power of two >= G vectors (1, 2, 4 or 8; blocks G..G'-1 are zero)
// and each block spans P = 8 / G' lanes: dword u (elements 4u..4u+3) of
// block beta sits in vector u / P, lane beta * P + u % P. With G' = 8 that is
// the layout above. The per-lane arrays (scales, sums, biases below) repeat
// a block's scale in each of its lanes; minimum and bias terms sit in its
// first lane only (zero in the others), so that each counts once.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_kernels.h"

namespace osprey::cpu {

constexpr int64_t kQ8GroupElems = 256;  // 8 blocks of 32
constexpr int kQ8GroupBlocks = 8;

inline int64_t q8_num_groups(int64_t k) {
  return (k + kQ8GroupElems - 1) / kQ8GroupElems;
}

// Vectors (= stored blocks) in the last group: 1, 2, 4 or 8.
inline int q8_tail_vectors(int64_t k) {
  const int64_t g = (k / 32) % kQ8GroupBlocks;
  return g == 0 ? 8 : g == 1 ? 1 : g == 2 ? 2 : g <= 4 ? 4 : 8;
}

// Lanes per block in the group holding block b (k / 32 blocks in all).
inline int q8_lanes_per_block(int64_t k, int64_t b) {
  return b / kQ8GroupBlocks + 1 < q8_num_groups(k) ? 1 : kQ8GroupBlocks / q8_tail_vectors(k);
}

// Byte offset of element e (< 32) of block b in an activation or unpacked
// weight row, and the per-lane array index of block b's first lane.
inline int64_t q8_elem_offset(int64_t k, int64_t b, int e) {
  const int p = q8_lanes_per_block(k, b);
  const int u = e / 4;
  const int64_t beta = b % kQ8GroupBlocks;
  return (b / kQ8GroupBlocks) * kQ8GroupElems + (u / p) * 32 + (beta * p + u % p) * 4 + e % 4;
}
inline int64_t q8_first_lane(int64_t k, int64_t b) {
  return (b / kQ8GroupBlocks) * kQ8GroupBlocks + (b % kQ8GroupBlocks) * q8_lanes_per_block(k, b);
}

// One quantised activation row (k elements, ng = q8_num_groups(k) groups):
//   [0, 256 ng)            qs, int8, in the group layout above (zero past k)
//   d    [8 ng] f32        per lane: block scales dx_b (0 past k)
//   s    [8 ng] f32        per lane: sx_b = dx_b * sum(qx) (read for Q4_1 only)
//   bias [8 ng] i32        first lane: -c * sum(qx), c = the kernel table's act_bias for
//                          the weight format (folds Q4_0's -8 and the u8
//                          offset of Q8_0 weights into the integer sum)
// Rows are a multiple of 32 bytes; a row buffer must be 32-byte aligned.
inline int64_t q8_act_row_bytes(int64_t k) {
  return q8_num_groups(k) * (kQ8GroupElems + 3 * 32);
}
inline int64_t q8_act_d_offset(int64_t k) {
  return q8_num_groups(k) * kQ8GroupElems;
}
inline int64_t q8_act_s_offset(int64_t k) {
  return q8_act_d_offset(k) + q8_num_groups(k) * 32;
}
inline int64_t q8_act_bias_offset(int64_t k) {
  return q8_act_s_offset(k) + q8_num_groups(k) * 32;
}

// Unpacked weight row of a panel (vector kernels; 32-byte aligned):
//   [0, 256 ng)    unsigned 4-bit values (Q4_0/Q4_1) or the int8 values (Q8_0),
//                  group layout
//   dw [8 ng] f32  per lane: block scales;  mw [8 ng] f32  first lane: Q4_1
//                  block minimums (0 otherwise)
inline int64_t q8_weight_row_bytes(int64_t k) {
  return q8_num_groups(k) * (kQ8GroupElems + 2 * 32);
}

// Weight rows a vector kernel unpacks at a time (its scratch holds this many).
constexpr int kQ8PanelRows = 8;

inline bool q8_format_supported(WeightFormat f) {
  return f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1;
}

// Quantises one row x[k] (k % 32 == 0) into dst (q8_act_row_bytes(k)), with
// bias = -act_bias * sum(qx) per block. Every table's quantiser produces
// bit-identical rows.
using Q8QuantizeFn = void (*)(const float* x, int64_t k, int32_t act_bias, uint8_t* dst);

// out[i * ldo + r] = the q8 dot of weight row r and activation row i, for
// i < n, r in [r0, r1). w row r starts at w + r * w_row_bytes (format f);
// xq row i at xq + i * xq_row_bytes (quantised with this table's act_bias[f]).
// scratch: q8_gemm_scratch_bytes(k) bytes, 32-byte aligned, owned by the caller
// thread. Per output element the arithmetic depends only on the two rows.
using Q8GemmFn = void (*)(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, const uint8_t* xq,
                          int64_t xq_row_bytes, int n, float* out, int64_t ldo, int64_t r0, int64_t r1,
                          uint8_t* scratch);

inline int64_t q8_gemm_scratch_bytes(int64_t k) {
  return kQ8PanelRows * q8_weight_row_bytes(k);
}

struct Q8Kernels {
  const char* isa = "scalar";
  Q8QuantizeFn quantize = nullptr;
  Q8GemmFn gemm = nullptr;
  int32_t act_bias[static_cast<int>(WeightFormat::kCount)] = {};
};

const Q8Kernels& q8_scalar_kernels();
// Null when the CPU lacks AVX2/FMA/F16C (same check as avx2_kernels()).
const Q8Kernels* q8_avx2_kernels();
// Null when the CPU lacks AVX-512 VNNI (with F/BW/VL) or AVX2.
const Q8Kernels* q8_avx512_kernels();
// Defined in cpu_q8_avx2.cpp / cpu_q8_avx512.cpp (x86-64 only); call the
// checked accessors above instead.
const Q8Kernels& q8_avx2_kernels_unchecked();
const Q8Kernels& q8_avx512_kernels_unchecked();

// The table matching a CpuBackend's fp32 table (same ISA, or the best the
// CPU has below it).
const Q8Kernels* q8_kernels_for(const CpuKernels* fp32_kernels);

// AVX2 building blocks the AVX-512 table reuses (cpu_q8_avx2.cpp): unpack
// `rows` weight rows into the panel layout at dst (q8_weight_row_bytes(k) each).
// With interleave_pairs, rows 2i and 2i + 1 share 2 * q8_weight_row_bytes(k)
// bytes, alternating 32-byte vectors (row 2i's vector v at 64 v, row 2i + 1's
// at 64 v + 32), so that one 64-byte load holds the same vector of both rows.
// dst is 32-byte aligned either way.
void q8_unpack_rows_avx2(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, int rows, uint8_t* dst,
                         bool interleave_pairs);

}  // namespace osprey::cpu
