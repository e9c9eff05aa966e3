// v1: one thread per output, straight from global memory, with the index that makes it slow.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v1.cu -o /tmp/v1.cubin
// threadIdx.x (the fast index: the 32 lanes of a warp) runs along m. At each k a warp's lanes
// read A at 32 different rows (addresses K elements apart: 32 memory transactions) and B at
// one address; at the end they write C at 32 different rows. Next version: swap the two.
#pragma once

#include "common.cuh"

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v1(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  // region v1
  const int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  T acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += A[a_index<TA>(m, k, M, K)] * B[b_index<TB>(k, n, N, K)];
  C[m * N + n] = epilogue(acc, bias, n, kind);
  // endregion
}

}  // namespace
