// v34: split-TF32 on wgmma. v26's float32-class accuracy (each operand a tf32 big part plus a tf32
// remainder, three products, the small ones first) at the speed of Hopper's tf32 instruction,
// wgmma m64n128k8.f32.tf32.tf32, which takes both operands K-major from shared memory.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v34.cu -o /tmp/v34.cubin
// TMA brings the float32 tiles (64 and 128 rows of 32 k: 128-byte rows) into a ring of 3 stages,
// as they lie in memory; then the warpgroup splits every element once and writes three K-major,
// 128B-swizzled tiles per operand: big, small, and big with its infinities set to 0 (for the cross
// products, so that inf·w comes from big·big alone and not inf·0 = NaN from a cross product, as in
// v26). The split tiles are ordinary stores, which the tensor cores see after fence.proxy.async.
#pragma once

#include "v25_v26_tf32.cuh"  // split_tf32, finite
#include "v32_tma.cuh"  // TmaPipeline, store_d

namespace {

constexpr int kV34BM = 64, kV34BN = 128, kV34BK = 32, kV34Stages = 3;
static_assert((kV34BM + kV34BN) * kV34BK * 4 == dense_kernels::tma_stage_bytes(34) &&
                  kV34Stages == dense_kernels::tma_stages(34),
              "the launcher's dynamic shared memory is this ring of stages, then the split tiles");

// Byte offset of float (x, k) in a tile of Rows × 32 floats: K-major (rows along x) or as TMA
// brings an MN-major operand (rows along k, in blocks of 32 x, 4 KiB each); 128B-swizzled.
template <bool KMajor>
__device__ __forceinline__ int v34_offset(int x, int k) {
  const int o = KMajor ? x * 128 + k * 4 : (x / 32) * 4096 + k * 128 + (x % 32) * 4;
  return o ^ (((o >> 7) & 7) << 4);
}

template <int Rows>
struct Tf32TmaTile {
  static constexpr int kBytes = Rows * kV34BK * 4;
  __device__ __forceinline__ static void load(unsigned char* S, const CUtensorMap* map, bool k_major, int64_t x0,
                                              int64_t k0, uint64_t* bar) {
    if (k_major) {
      tma_load_2d(S, map, int(k0), int(x0), bar);
    } else {
#pragma unroll
      for (int b = 0; b < Rows / 32; ++b) tma_load_2d(S + b * 4096, map, int(x0 + 32 * b), int(k0), bar);
    }
  }
  // Split the raw tile into big, small and finite-big K-major tiles (128 threads, each a share).
  template <bool KMajor>
  __device__ __forceinline__ static void split(const unsigned char* raw, unsigned char* big, unsigned char* small,
                                               unsigned char* bigf) {
    for (int u = threadIdx.x; u < Rows * kV34BK; u += 128) {
      const int x = u / kV34BK, k = u % kV34BK;
      float v;
      memcpy(&v, raw + v34_offset<KMajor>(x, k), 4);
      const Tf32Parts p = split_tf32(v);
      const uint32_t f = finite(p.big);
      const int o = v34_offset<true>(x, k);
      memcpy(big + o, &p.big, 4);
      memcpy(small + o, &p.small, 4);
      memcpy(bigf + o, &f, 4);
    }
  }
};

template <typename T, bool TA, bool TB>
__device__ void gemm_v34(const CUtensorMap& map_a, const CUtensorMap& map_b, T* C, const T* bias, int64_t M,
                         int64_t N, int64_t K, int kind) {
  using TileA = Tf32TmaTile<kV34BM>;
  using TileB = Tf32TmaTile<kV34BN>;
  constexpr int kStage = TileA::kBytes + TileB::kBytes;
  DENSE_DYNAMIC_SMEM(smem);
  shared_window(smem);
  unsigned char* split = smem + kV34Stages * kStage;  // A big, small, finite big; then B's
  unsigned char *a_big = split, *a_small = a_big + TileA::kBytes, *a_bigf = a_small + TileA::kBytes;
  unsigned char *b_big = a_bigf + TileA::kBytes, *b_small = b_big + TileB::kBytes, *b_bigf = b_small + TileB::kBytes;
  const TmaPipeline<kV34Stages, kStage> ring(b_bigf + TileB::kBytes);
  const int64_t m0 = int64_t(blockIdx.y) * kV34BM, n0 = int64_t(blockIdx.x) * kV34BN;
  const int64_t steps = (K + kV34BK - 1) / kV34BK;
  auto load = [&](uint64_t* bar, int s, int64_t step) {
    TileA::load(smem + s * kStage, &map_a, !TA, m0, step * kV34BK, bar);
    TileB::load(smem + s * kStage + TileA::kBytes, &map_b, TB, n0, step * kV34BK, bar);
  };
  if (threadIdx.x == 0) ring.init(128);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int s = 0; s < kV34Stages && s < steps; ++s) load(ring.producer_acquire(s), s, s);
  float acc[kV34BN / 2] = {};
  // region v34
  for (int64_t step = 0; step < steps; ++step) {
    ring.consumer_wait(step);
    const unsigned char* raw = smem + ring.stage(step) * kStage;
    TileA::template split<!TA>(raw, a_big, a_small, a_bigf);
    TileB::template split<TB>(raw + TileA::kBytes, b_big, b_small, b_bigf);
    fence_proxy_async();
    __syncthreads();                // the split tiles are whole...
    ring.consumer_release(step);    // ...and the raw stage is free for the next copies
    if (threadIdx.x == 0 && step + kV34Stages < steps)
      load(ring.producer_refill(step), ring.stage(step), step + kV34Stages);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kV34BK; kk += 8) {  // k-steps of 8 tf32: 32 bytes along the rows
      auto d = [&](const unsigned char* tile) { return smem_desc(tile + kk * 4, 16, 1024, kSwizzle128B); };
      wgmma_m64n128k8_tf32(acc, d(a_small), d(b_bigf), 1);
      wgmma_m64n128k8_tf32(acc, d(a_bigf), d(b_small), 1);
      wgmma_m64n128k8_tf32(acc, d(a_big), d(b_big), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // every warp's wgmma's have read the split tiles before they are rewritten
  }
  // endregion
  store_d(acc, threadIdx.x, C, bias, M, N, m0, n0, kind);
}

}  // namespace
