// v35: small batches on Hopper. At B = 32 the layer reads W (N × K) once and does 2·32·N·K FLOPs:
// bound by W's bytes, not by the tensor cores. wgmma's M is always 64, so v33's tiles would waste
// half of every instruction on the 32 rows that are not there. v35 swaps the operands' roles:
// D'(n, m) = Σ_k W(n, k)·x(m, k) = C(m, n), W's 64 rows per block as wgmma's A and the batch's 32
// rows as its B (m64n32k16: nothing wasted),
// and K split over blocks until every SM has two (v12's idea), each slice's partial product summed
// in slice order by split-K's reduction (deterministic), which applies the epilogue.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v35.cu -o /tmp/v35.cubin
// The feeding is v32's: one warpgroup, thread 0 issuing TMA into a ring of 4 stages. For the
// backward's layouts the same swap holds: D' = op(B)ᵀ·op(A)ᵀ, each operand K-major or MN-major as
// it lies in memory (wgmma's transpose flags).
#pragma once

#include "tc6_tma.cuh"  // TmaTile

namespace {

constexpr int kTc9BN = 64, kTc9BM = 32, kTc9Stages = 4;
static_assert(2 * 64 * 64 * 2 == dense_kernels::tma_stage_bytes(35) && kTc9Stages == dense_kernels::tma_stages(35),
              "the launcher's dynamic shared memory is this ring of stages");

template <typename T, bool TA, bool TB>
__device__ void gemm_v35(const CUtensorMap& map_a, const CUtensorMap& map_b, T* C, const T* bias, int64_t M,
                         int64_t N, int64_t K, int kind) {
  // A stage: 64 rows of B's storage (W: n, or k if stored K×N), then A's (x: 32 rows of m, or 64
  // rows of k if stored K×M, whose 64-wide box brings 32 more m than are used).
  constexpr int kStage = 2 * 8192;
  DENSE_DYNAMIC_SMEM(smem);
  shared_window(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kTc9Stages * kStage);
  uint64_t* empty = full + kTc9Stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * kTc9BN, m0 = int64_t(blockIdx.y) * kTc9BM;
  // this block's slice of K: whole steps of 64, as even as they come (v9's rule)
  const int64_t steps = (K + 63) / 64, per_slice = (steps + gridDim.z - 1) / gridDim.z;
  const int64_t first = blockIdx.z * per_slice, last = first + per_slice < steps ? first + per_slice : steps;
  const uint32_t bytes = 8192 + (TA ? 8192 : kTc9BM * 128);
  auto issue = [&](int s, int64_t step) {
    mbarrier_arrive_expect_tx(&full[s], bytes);
    TmaTile<kTc9BN>::load(smem + s * kStage, &map_b, TB, n0, step * 64, &full[s]);
    TmaTile<kTc9BM>::load(smem + s * kStage + 8192, &map_a, !TA, m0, step * 64, &full[s]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kTc9Stages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 128);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < kTc9Stages && first + s < last; ++s) issue(s, first + s);
  float acc[kTc9BM / 2] = {};
  // region v35
  for (int64_t step = first; step < last; ++step) {
    const int s = int((step - first) % kTc9Stages);
    const unsigned parity = unsigned((step - first) / kTc9Stages) % 2;
    mbarrier_wait(&full[s], parity);
    const unsigned char *ws = smem + s * kStage, *xs = ws + 8192;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16)  // A' = W's rows (MN-major if W is stored K×N), B' = x's (if K×M)
      wgmma_m64k16<kTc9BM, T, !TB, TA>(acc, TmaTile<kTc9BN>::desc(ws, TB, 0, kk), TmaTile<kTc9BM>::desc(xs, !TA, 0, kk),
                                       1);
    wgmma_commit();
    wgmma_wait<0>();
    mbarrier_arrive(&empty[s]);
    if (threadIdx.x == 0 && step + kTc9Stages < last) {
      mbarrier_wait(&empty[s], parity);
      issue(s, step + kTc9Stages);
    }
  }
  // endregion
  // D'(n, m): register i holds n = 16·warp + g (+8 for i % 4 ≥ 2) and m = 8·(i/4) + 2t + i % 2.
  // With slices, C is the float32 workspace of partial products, summed by the reduction.
  float* const partial = gridDim.z > 1 ? reinterpret_cast<float*>(C) + int64_t(blockIdx.z) * M * N : nullptr;
#pragma unroll
  for (int i = 0; i < kTc9BM / 2; ++i) {
    const int64_t n = n0 + 16 * warp + g + 8 * ((i / 2) % 2), m = m0 + 8 * (i / 4) + 2 * t + i % 2;
    if (m >= M || n >= N) continue;
    if (partial != nullptr) partial[m * N + n] = acc[i];
    else C[m * N + n] = from_acc<T>(epilogue(acc[i], bias, n, kind));
  }
}

}  // namespace
