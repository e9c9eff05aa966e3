// v2: one thread per output, straight from global memory, a warp along a row of C.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v2.cu -o /tmp/v2.cubin
// threadIdx.x now runs along n: at each k a warp's lanes read one element of A (a broadcast)
// and 32 neighbouring elements of B when B is K×N ("nn", "tn": one 128-byte transaction), and
// write 32 neighbouring outputs. In "nt" (the forward) B is N×K, so B is still read K elements
// apart: only loading W's tile along k (v6) fixes that.
#pragma once

#include "common.cuh"

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v2(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  // region v2
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  T acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += A[a_index<TA>(m, k, M, K)] * B[b_index<TB>(k, n, N, K)];
  C[m * N + n] = epilogue(acc, bias, n, kind);
  // endregion
}

}  // namespace
