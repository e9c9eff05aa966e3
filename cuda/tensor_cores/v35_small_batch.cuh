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
// it lies in memory (wgmma's transpose flags). x stored K×M (the tn layout) is an MN-major B only
// 32 wide: it lands as one block of 64 rows of k × 32 m under the 64-byte swizzle, the PTX ISA's
// canonical MN-major layout for 32 elements of 16 bits (TmaTile in v32_tma.cuh; the 128-byte
// swizzle's MN-major atom is 64 wide).
#pragma once

#include "v32_tma.cuh"  // TmaTile, TmaPipeline, for_each_d

namespace {

constexpr int kV35BN = 64, kV35BM = 32, kV35Stages = 4;
static_assert(2 * 64 * 64 * 2 == dense_kernels::tma_stage_bytes(35) && kV35Stages == dense_kernels::tma_stages(35),
              "the launcher's dynamic shared memory is this ring of stages");

template <typename T, bool TA, bool TB>
__device__ void gemm_v35(const CUtensorMap& map_a, const CUtensorMap& map_b, T* C, const T* bias, int64_t M,
                         int64_t N, int64_t K, int kind) {
  using TileW = TmaTile<kV35BN>;  // wgmma's A: 64 rows of W (n), K-major, or MN-major if W is stored K×N
  using TileX = TmaTile<kV35BM>;  // wgmma's B: 32 rows of x (m), K-major, or MN-major if x is stored K×M
  // A stage: W's tile (8192 bytes), then x's (4096) at 8192, in the 2 × 8192 the launcher reserves.
  constexpr int kStage = 2 * 8192;
  DENSE_DYNAMIC_SMEM(smem);
  shared_window(smem);
  const TmaPipeline<kV35Stages, TileW::kBytes + TileX::kBytes> ring(smem + kV35Stages * kStage);
  const int64_t n0 = int64_t(blockIdx.x) * kV35BN, m0 = int64_t(blockIdx.y) * kV35BM;
  // this block's slice of K: whole steps of 64, as even as they come (v9's rule)
  const int64_t steps = (K + 63) / 64, per_slice = (steps + gridDim.z - 1) / gridDim.z;
  const int64_t first = blockIdx.z * per_slice, last = first + per_slice < steps ? first + per_slice : steps;
  auto load = [&](uint64_t* bar, int s, int64_t step) {
    TileW::load(smem + s * kStage, &map_b, TB, n0, step * 64, bar);
    TileX::load(smem + s * kStage + 8192, &map_a, !TA, m0, step * 64, bar);
  };
  if (threadIdx.x == 0) ring.init(128);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < kV35Stages && first + s < last; ++s) load(ring.producer_acquire(s), s, first + s);
  float acc[kV35BM / 2] = {};
  // region v35
  for (int64_t step = first; step < last; ++step) {
    const int64_t j = step - first;  // the ring counts the slice's own steps
    ring.consumer_wait(j);
    const unsigned char *ws = smem + ring.stage(j) * kStage, *xs = ws + 8192;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16)  // A' = W's rows (MN-major if W is stored K×N), B' = x's (if K×M)
      wgmma_m64k16<kV35BM, T, !TB, TA>(acc, TileW::desc(ws, TB, 0, kk), TileX::desc(xs, !TA, 0, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    ring.consumer_release(j);
    if (threadIdx.x == 0 && step + kV35Stages < last) load(ring.producer_refill(j), ring.stage(j), step + kV35Stages);
  }
  // endregion
  // D'(n, m): D's row is n, its column m. With slices, C is the float32 workspace of partial
  // products, summed by the reduction.
  float* const partial = gridDim.z > 1 ? reinterpret_cast<float*>(C) + int64_t(blockIdx.z) * M * N : nullptr;
  for_each_d(acc, threadIdx.x, n0, m0, [&](int64_t n, int64_t m, float v) {
    if (m >= M || n >= N) return;
    if (partial != nullptr) partial[m * N + n] = v;
    else C[m * N + n] = from_acc<T>(epilogue(v, bias, n, kind));
  });
}

}  // namespace
