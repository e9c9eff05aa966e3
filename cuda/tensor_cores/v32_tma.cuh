// v32: TMA and mbarriers. v31's warpgroup, its tiles now brought by the Tensor Memory Accelerator:
// one thread asks for a whole 2-D box of A or B (cp.async.bulk.tensor), the copy engine writes it
// into shared memory already 128B-swizzled, with zeros where the box leaves the matrix, and counts
// its bytes into an mbarrier, on which the warpgroup waits. A ring of 4 stages keeps three steps of
// copies in flight while the tensor cores work on the fourth.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v32.cu -o /tmp/v32.cubin
// The ring (tma_pipeline.cuh): two barriers a stage, `full` completing when the stage's bytes have
// arrived (thread 0 announces them with expect_tx, the copies deliver them), `empty` when all 128
// threads are done reading it, after which thread 0 refills it. Phases alternate 0, 1, 0...: a
// thread waits on stage s of step i with parity (i / 4) % 2. The tensor maps are made on the host
// (cuda/kernels/launch.cuh), one per operand: K-major operands in boxes of 64 k × the tile's rows,
// MN-major ones in boxes of 64 k × 64 m or n (32 for a tile only 32 wide), one per block.
#pragma once

#include "v31_wgmma.cuh"
#include "tma_pipeline.cuh"

namespace {

constexpr int kV32Stages = 4;
static_assert((kV31BM + kV31BN) * 64 * 2 == dense_kernels::tma_stage_bytes(32) &&
                  kV32Stages == dense_kernels::tma_stages(32),
              "the launcher's dynamic shared memory is this ring of stages");

// The bytes and layout of one operand's tile of a stage: Rows (m or n) × 64 k, K-major (one
// 128-byte row per m or n, 128B-swizzled) or MN-major (one row per k, in blocks of kWide m or n).
// MN-major, a block's rows are kSpan = 2·kWide bytes and swizzled by as many: the PTX ISA's
// canonical MN-major layouts ("Shared Memory Matrix Layout", for 16-bit types T = 8 elements of
// 16 bytes) are ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) under the 128-byte swizzle, blocks of 64
// m or n, and ((T,4,m),(8,k)):((1,T,LBO),(4T,SBO)) under the 64-byte one, blocks of 32: a tile 32
// wide (v35's B) is one whole block of the second, and only half a block of the first.
template <int Rows>
struct TmaTile {
  static constexpr int kBytes = Rows * 64 * 2;
  static constexpr int kWide = Rows < 64 ? Rows : 64, kSpan = 2 * kWide, kBlock = 64 * kSpan;
  static_assert(Rows % kWide == 0 && (kSpan == 128 || kSpan == 64), "MN-major blocks of 64 or 32");
  static constexpr int kMnSwizzle = kSpan == 128 ? kSwizzle128B : kSwizzle64B;  // the tensor map's too
  // Issue the copies of the tile at (x0, k0) into S, completing `bar` (one thread calls this).
  __device__ __forceinline__ static void load(unsigned char* S, const CUtensorMap* map, bool k_major, int64_t x0,
                                              int64_t k0, uint64_t* bar) {
    if (k_major) {
      tma_load_2d(S, map, int(k0), int(x0), bar);
    } else {
#pragma unroll
      for (int b = 0; b < Rows / kWide; ++b) tma_load_2d(S + b * kBlock, map, int(x0 + kWide * b), int(k0), bar);
    }
  }
  // The descriptor of rows [r0, r0 + 64 (A) or Rows (B)) at k-step kk of 16: K-major, 32 bytes
  // further along the rows; MN-major, 16 rows further down; blocks LBO = kBlock apart, atoms of 8
  // rows SBO = 8·kSpan apart.
  __device__ __forceinline__ static uint64_t desc(const unsigned char* S, bool k_major, int r0, int kk) {
    return k_major ? smem_desc(S + r0 * 128 + kk * 2, 16, 1024, kSwizzle128B)
                   : smem_desc(S + (r0 / kWide) * kBlock + kk * kSpan, kBlock, 8 * kSpan, kMnSwizzle);
  }
};

template <typename T, bool TA, bool TB>
__device__ void gemm_v32(const CUtensorMap& map_a, const CUtensorMap& map_b, T* C, const T* bias, int64_t M,
                         int64_t N, int64_t K, int kind) {
  using TileA = TmaTile<kV31BM>;
  using TileB = TmaTile<kV31BN>;
  constexpr int kStage = TileA::kBytes + TileB::kBytes;
  DENSE_DYNAMIC_SMEM(smem);  // kV32Stages × kStage bytes of tiles, then the barriers
  shared_window(smem);
  const TmaPipeline<kV32Stages, kStage> ring(smem + kV32Stages * kStage);
  const int64_t m0 = int64_t(blockIdx.y) * kV31BM, n0 = int64_t(blockIdx.x) * kV31BN;
  const int64_t steps = (K + 63) / 64;
  auto load = [&](uint64_t* bar, int s, int64_t step) {  // thread 0: the copies of `step` into stage s
    TileA::load(smem + s * kStage, &map_a, !TA, m0, step * 64, bar);
    TileB::load(smem + s * kStage + TileA::kBytes, &map_b, TB, n0, step * 64, bar);
  };
  if (threadIdx.x == 0) ring.init(128);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < kV32Stages && s < steps; ++s) load(ring.producer_acquire(s), s, s);
  float acc[kV31BN / 2] = {};
  // region v32
  for (int64_t step = 0; step < steps; ++step) {
    ring.consumer_wait(step);  // the stage's bytes have landed
    const unsigned char *as = smem + ring.stage(step) * kStage, *bs = as + TileA::kBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16)
      wgmma_m64k16<kV31BN, T, TA, !TB>(acc, TileA::desc(as, !TA, 0, kk), TileB::desc(bs, TB, 0, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    ring.consumer_release(step);  // this thread is done reading the stage
    if (threadIdx.x == 0 && step + kV32Stages < steps)  // once all have: refill it, kV32Stages steps ahead
      load(ring.producer_refill(step), ring.stage(step), step + kV32Stages);
  }
  // endregion
  store_d(acc, threadIdx.x, C, bias, M, N, m0, n0, kind);
}

}  // namespace
