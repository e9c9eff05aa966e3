// v3: shared-memory tiles.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v3.cu -o /tmp/v3.cubin
// A 32×32 block of threads stages a 32×32 tile of A and of B in shared memory, then every
// thread reads its row of As and its column of Bs from there: each element loaded from global
// memory is used 32 times. No padding is needed: in the inner loop a warp (fixed ty, tx = 0..31)
// reads one word of As (a broadcast) and 32 consecutive words of Bs (32 banks).
#pragma once

#include "common.cuh"

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v3(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  constexpr int S = dense_kernels::TileOf<3, sizeof(T)>::BM;
  __shared__ T As[S][S];
  __shared__ T Bs[S][S];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m = int64_t(blockIdx.y) * S + ty, n = int64_t(blockIdx.x) * S + tx;
  T acc = 0;
  // region v3
  for (int64_t k0 = 0; k0 < K; k0 += S) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    As[ty][tx] = (m < M && ka < K) ? A[a_index<TA>(m, ka, M, K)] : T(0);
    Bs[ty][tx] = (kb < K && n < N) ? B[b_index<TB>(kb, n, N, K)] : T(0);
    __syncthreads();  // the tiles are complete before anyone reads them
#pragma unroll
    for (int kk = 0; kk < S; ++kk) acc += As[ty][kk] * Bs[kk][tx];
    __syncthreads();  // everyone is done reading before the next step overwrites them
  }
  // endregion
  if (m < M && n < N) C[m * N + n] = epilogue(acc, bias, n, kind);
}

}  // namespace
