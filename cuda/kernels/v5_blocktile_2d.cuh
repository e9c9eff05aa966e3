// v5: 2-D register blocking: each thread computes a TM×TN block of outputs (8×8; f64 4×4).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v5.cu -o /tmp/v5.cubin
// Per k a thread reads TM values of As and TN of Bs into registers and does TM·TN multiply-adds
// with them: 64 FMAs for 16 shared-memory reads (v4: 8 for 9). The block's tile of C grows to
// 128×128 (f64 64×64) with 256 threads, so each element loaded from global memory serves 128
// outputs.
#pragma once

#include "common.cuh"

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v5(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<5, sizeof(T)>;
  constexpr int BM = t::BM, BN = t::BN, BK = t::BK, TM = t::TM, TN = t::TN, NT = (BM / TM) * (BN / TN);
  __shared__ T As[BM][BK];
  __shared__ T Bs[BK][BN];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int row0 = ty * TM, col0 = tx * TN;  // this thread's block of the tile
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

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
    // region v5
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[row0 + i][kk];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[kk][col0 + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    // endregion
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t m = m0 + row0 + i, n = n0 + col0 + j;
      if (m < M && n < N) C[m * N + n] = epilogue(acc[i][j], bias, n, kind);
    }
}

}  // namespace
