// Inline-PTX wrappers for the Hopper (sm_90a) warpgroup MMA used by the
// prefill attention kernels of prefill_wgmma.cu: shared-memory matrix
// descriptors, wgmma.mma_async m64n128k16 (and m64n64k16 for P V at head_dim
// 64) with fp32 accumulators (A from registers, B from shared memory),
// the fence / commit / wait steps, and
// the mbarrier, bulk tensor copy (TMA) and setmaxnreg steps of the
// warp-specialised kernel.
// Only usable in device code compiled for sm_90a (OSP_WGMMA_DEVICE below);
// elsewhere the wrappers compile to nothing and must not be reached.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OSP_WGMMA_DEVICE 1
#else
#define OSP_WGMMA_DEVICE 0
#endif

namespace osprey::cuda::wgmma {

// Descriptor of a shared-memory operand in the 128-byte swizzle mode
// (mode 1 in bits 62-63): the swizzle pattern repeats every 1024 bytes, so
// the atoms must sit on 1024-byte boundaries (base offset 0). Byte offsets
// are encoded >> 4 in 14 bits: start address bits 0-13, leading-dimension
// byte offset bits 16-29, stride-dimension byte offset bits 32-45.
//  - K-major (the reduction dimension contiguous): rows of 128 bytes, the
//    16-byte chunk c of row r stored at chunk c ^ (r % 8); sbo = 1024 (from
//    one 8-row group to the next); lbo unused (1). A k-step of 16 elements
//    moves the start address by 32 bytes within the 128-byte row.
//  - MN-major (transposed B): rows of 128 bytes along N for one k, same
//    XOR pattern over k % 8; sbo = 1024 (next 8 k), lbo = byte distance
//    between 64-element panels along N.
__host__ __device__ constexpr uint64_t sw128_desc(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) | (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) |
         (uint64_t{1} << 62);
}

// sw128_desc(a + bytes, ...) from d = sw128_desc(a, ...), for a and bytes
// multiples of 16 with a + bytes below 2^18 (every shared address): bytes
// / 16 added to the low word only; the start-address field does not carry
// into the others, and the high word stays a constant.
__host__ __device__ constexpr uint64_t desc_plus(uint64_t d, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
  return (d & 0xFFFFFFFF00000000ull) | lo;
}
static_assert(desc_plus(sw128_desc(0x8000u, 16, 1024), 0x4060u) == sw128_desc(0xC060u, 16, 1024));
static_assert(desc_plus(sw128_desc(0x1C000u, 0x4000u, 1024), 7u * 2048u) == sw128_desc(0x1F800u, 0x4000u, 1024));
static_assert(desc_plus(sw128_desc(0u, 16, 1024), 0x3FFF0u) == sw128_desc(0x3FFF0u, 16, 1024));

// Orders this thread's earlier register accesses before the wgmma that
// follow (required before the first wgmma and after registers they use
// were written by other instructions).
__device__ __forceinline__ void fence() {
#if OSP_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Closes the wgmma issued since the last commit into one group.
__device__ __forceinline__ void commit() {
#if OSP_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
#if OSP_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Makes the compiler treat x as read and rewritten here: keeps accesses to
// accumulators on the right side of a wait / before a fence.
__device__ __forceinline__ void pin(float& x) {
  asm volatile("" : "+f"(x)::"memory");
}
__device__ __forceinline__ void pin(uint32_t& x) {
  asm volatile("" : "+r"(x)::"memory");
}

// Generic-proxy writes to shared memory (cp.async, st.shared) made visible
// to the async proxy (wgmma operand reads); each writing thread, before the
// barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if OSP_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#define OSP_WGMMA_D64                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define OSP_WGMMA_D64_OPS(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define OSP_WGMMA_D32                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"

#define OSP_WGMMA_D32_OPS(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d[64 x kN] (+)= A[64 x 16] B[16 x kN] (kN 128 or 64), fp32 accumulators
// in the m64nNk16 layout (thread of warp w, lane l: d[4 j + e] is row 16 w +
// l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2; kN / 2 a thread).
// A from registers: the m16n8k16 A-fragment layout per warp (a[0] row l /
// 4, columns 2 (l % 4) + {0, 1}; a[1] the same 8 rows down; a[2], a[3]
// those 8 columns right). B from shared memory through a descriptor:
// K-major (B^T stored row by row), or with kTransB MN-major (B stored k by
// k, 128-byte rows along N; the transpose bit set). accumulate = false
// overwrites d. kF16: f16 operands, else bf16. (Until session 32 the
// prefill kernels also took A from shared memory, wgmma's SS form, for Q.)
template <bool kF16, int kN, bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(kN == 128 || kN == 64, "m64n128k16 or m64n64k16");
#if OSP_WGMMA_DEVICE
  if constexpr (kN == 128 && kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" OSP_WGMMA_D64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : OSP_WGMMA_D64_OPS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
          "n"(kTransB ? 1 : 0));
  } else if constexpr (kN == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" OSP_WGMMA_D64
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : OSP_WGMMA_D64_OPS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
          "n"(kTransB ? 1 : 0));
  } else if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" OSP_WGMMA_D32
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : OSP_WGMMA_D32_OPS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
          "n"(kTransB ? 1 : 0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" OSP_WGMMA_D32
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : OSP_WGMMA_D32_OPS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),
          "n"(kTransB ? 1 : 0));
  }
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)accumulate;
#endif
}

#undef OSP_WGMMA_D64
#undef OSP_WGMMA_D64_OPS
#undef OSP_WGMMA_D32
#undef OSP_WGMMA_D32_OPS

// Shared-memory mbarriers (CTA scope; addr: shared-space byte address of an
// 8-byte aligned uint64_t), for the warp-specialised kernel's stage ring.
__device__ __forceinline__ void mbar_init(uint32_t addr, uint32_t count) {
#if OSP_WGMMA_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
#else
  (void)addr;
  (void)count;
#endif
}
// Makes the initialised barriers visible to the other threads (before the
// block-wide barrier that publishes them).
__device__ __forceinline__ void fence_mbar_init() {
#if OSP_WGMMA_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival (release semantics: this thread's earlier writes are visible
// to a thread that observes the phase complete).
__device__ __forceinline__ void mbar_arrive(uint32_t addr) {
#if OSP_WGMMA_DEVICE
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
#else
  (void)addr;
#endif
}
// One arrival made by the hardware once every cp.async this thread issued
// before has landed (.noinc: counted among the barrier's expected arrivals;
// the thread does not wait).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t addr) {
#if OSP_WGMMA_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
#else
  (void)addr;
#endif
}
// One arrival made by the hardware once every cp.async this thread issued
// before has landed, on top of the barrier's expected arrivals: the
// pending count goes up by one now and down by one then (no .noinc), so the
// phase cannot complete before those copies have landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t addr) {
#if OSP_WGMMA_DEVICE
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
#else
  (void)addr;
#endif
}
// One arrival that also expects `bytes` more of asynchronous copies
// (complete_tx) in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t addr, uint32_t bytes) {
#if OSP_WGMMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
#else
  (void)addr;
  (void)bytes;
#endif
}
// The bulk tensor copy engine (TMA): the box of the 3-D tensor map at
// `tmap` (a __grid_constant__ kernel parameter) at coordinates (c0, c1, c2)
// into shared memory at dst (shared-space address), completing its bytes
// on the mbarrier at bar. Elements past the tensor's bounds are zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, int c0, int c1, int c2, uint32_t bar) {
#if OSP_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#else
  (void)dst;
  (void)tmap;
  (void)c0;
  (void)c1;
  (void)c2;
  (void)bar;
#endif
}
// Fetches a tensor map (kernel parameter) ahead of its first use.
__device__ __forceinline__ void prefetch_tmap(const void* tmap) {
#if OSP_WGMMA_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#else
  (void)tmap;
#endif
}
// Waits until the phase with the given parity (0 or 1) has completed. Each
// try_wait may suspend the thread until the phase completes, for up to
// the hint (1 ms), instead of returning at once: fewer issue slots spent
// polling (variant 3 on an H200: +2-3% at 1k-2k tokens, +0.5-1% at 4k-8k).
__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t parity) {
#if OSP_WGMMA_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity), "r"(1000000u)
        : "memory");
  } while (done == 0);
#else
  (void)addr;
  (void)parity;
#endif
}

// Per-thread register budget of the executing warpgroup from here on
// (setmaxnreg; the kernel needs a register cap at entry: launch bounds with
// a minimum of one block per SM).
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
#if OSP_WGMMA_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
#if OSP_WGMMA_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace osprey::cuda::wgmma
