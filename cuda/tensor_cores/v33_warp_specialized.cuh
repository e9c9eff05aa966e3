// v33: warp specialization. The block's three warpgroups split the work: warpgroup 0 produces (one
// of its threads issues every TMA copy; the others have nothing to do) and gives up registers it
// does not need (setmaxnreg.dec to 40); warpgroups 1 and 2 consume (each a 64×256 half of the
// block's 128×256 tile, one wgmma m64n256k16 a k-step of 16) and take those registers
// (setmaxnreg.inc to 232: 128 accumulators a thread). A consumer keeps one group of wgmma's in
// flight while it issues the next, and hands a stage back to the producer as soon as the group
// that read it completes. The epilogue is v24's: bias, sigmoid, rounding, from the registers.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v33.cu -o /tmp/v33.cubin
// A stage is 128 + 256 rows of 64 k (48 KiB), 4 stages (192 KiB of the 227 KiB a block may have).
// Registers: 128 × 40 + 256 × 232 = 64,512 of the SM's 65,536, one block an SM.
#pragma once

#include "v32_tma.cuh"  // TmaTile, TmaPipeline

namespace {

constexpr int kV33BM = 128, kV33BN = 256, kV33Stages = 4;
constexpr int kV33LaunchRegisters = 168;  // ptxas's registers a thread at launch (384 threads, 1 block): setmaxnreg's pool
static_assert((kV33BM + kV33BN) * 64 * 2 == dense_kernels::tma_stage_bytes(33) &&
                  kV33Stages == dense_kernels::tma_stages(33),
              "the launcher's dynamic shared memory is this ring of stages");

template <typename T, bool TA, bool TB>
__device__ void gemm_v33(const CUtensorMap& map_a, const CUtensorMap& map_b, T* C, const T* bias, int64_t M,
                         int64_t N, int64_t K, int kind) {
  using TileA = TmaTile<kV33BM>;
  using TileB = TmaTile<kV33BN>;
  constexpr int kStage = TileA::kBytes + TileB::kBytes;
  DENSE_DYNAMIC_SMEM(smem);
  shared_window(smem);
  const TmaPipeline<kV33Stages, kStage> ring(smem + kV33Stages * kStage);
  const int wg = threadIdx.x / 128;
  const int64_t m0 = int64_t(blockIdx.y) * kV33BM, n0 = int64_t(blockIdx.x) * kV33BN;
  const int64_t steps = (K + 63) / 64;
  if (threadIdx.x == 0) ring.init(256);  // every consumer thread releases each stage
  __syncthreads();
  // region v33
  if (wg == 0) {  // the producer
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0)
      for (int64_t step = 0; step < steps; ++step) {
        uint64_t* bar = ring.producer_acquire(step);  // (from step 4 on: once it is consumed)
        unsigned char* as = smem + ring.stage(step) * kStage;
        TileA::load(as, &map_a, !TA, m0, step * 64, bar);
        TileB::load(as + TileA::kBytes, &map_b, TB, n0, step * 64, bar);
      }
    return;
  }
  setmaxnreg_inc<232>();  // the consumers
  float acc[kV33BN / 2] = {};
  const int r0 = 64 * (wg - 1);  // this warpgroup's rows of the tile
  for (int64_t step = 0; step < steps; ++step) {
    ring.consumer_wait(step);
    const unsigned char *as = smem + ring.stage(step) * kStage, *bs = as + TileA::kBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16)
      wgmma_m64k16<kV33BN, T, TA, !TB>(acc, TileA::desc(as, !TA, r0, kk), TileB::desc(bs, TB, 0, kk), 1);
    wgmma_commit();
    wgmma_wait<1>();  // the previous step's group has completed: its stage is free
    if (step > 0) ring.consumer_release(step - 1);
  }
  wgmma_wait<0>();
  // endregion
  store_d(acc, threadIdx.x % 128, C, bias, M, N, m0 + r0, n0, kind);  // (consumer warpgroup wg)
}

}  // namespace
