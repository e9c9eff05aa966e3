// v4: 1-D register blocking: each thread computes a column of TM = 8 outputs.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v4.cu -o /tmp/v4.cubin
// In v3 every multiply-add needs two shared-memory reads. Here a thread keeps TM accumulators
// in registers; per k it reads one value of Bs and TM of As: TM multiply-adds for TM + 1 reads,
// and the 64×64 tile of C per block halves global traffic per output again (each loaded
// element now serves 64 outputs). 512 threads, k-steps of BK = 8.
#pragma once

#include "common.cuh"

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v4(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<4, sizeof(T)>;
  constexpr int BM = t::BM, BN = t::BN, BK = t::BK, TM = t::TM, NT = (BM / TM) * BN;
  __shared__ T As[BM][BK];
  __shared__ T Bs[BK][BN];
  const int tx = threadIdx.x % BN, ty = threadIdx.x / BN;  // a warp: one ty, 32 neighbouring tx
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  T acc[TM];
#pragma unroll
  for (int i = 0; i < TM; ++i) acc[i] = T(0);

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    for (int u = threadIdx.x; u < BM * BK; u += NT) {
      const int64_t m = m0 + u / BK, k = k0 + u % BK;
      As[u / BK][u % BK] = (m < M && k < K) ? A[a_index<TA>(m, k, M, K)] : T(0);
    }
    for (int u = threadIdx.x; u < BK * BN; u += NT) {
      const int64_t k = k0 + u / BN, n = n0 + u % BN;
      Bs[u / BN][u % BN] = (k < K && n < N) ? B[b_index<TB>(k, n, N, K)] : T(0);
    }
    __syncthreads();
    // region v4
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      const T b = Bs[kk][tx];
#pragma unroll
      for (int i = 0; i < TM; ++i) acc[i] += As[ty * TM + i][kk] * b;
    }
    // endregion
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + ty * TM + i, n = n0 + tx;
    if (m < M && n < N) C[m * N + n] = epilogue(acc[i], bias, n, kind);
  }
}

}  // namespace
