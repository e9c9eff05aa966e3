// v21: tensor cores, one warp, one instruction: each warp computes a 16×8 tile of C with
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, K in steps of 16, its fragments loaded
// straight from global memory, element by element, where the PTX ISA's fragment tables put them.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v21.cu -o /tmp/v21.cubin
// A warp's 32 lanes are a 8 × 4 grid: g = lane / 4 (its group), t = lane % 4. For one 16×16×8
// step a lane holds 8 elements of A (rows g and g+8, columns 2t, 2t+1, 2t+8, 2t+9), 4 of B (rows
// 2t, 2t+1, 2t+8, 2t+9 of column g) and 4 accumulators of C (rows g and g+8, columns 2t, 2t+1):
// cuda/tensor_cores/README.md draws them. Two 16-bit elements travel in one 32-bit register,
// the lower k in the lower half. Every load here is 2 bytes and scattered: the instruction is
// fast, feeding it this way is not (v22 stages the tiles in shared memory).
#pragma once

#include "../kernels/common.cuh"
#include "../kernels/instructions.cuh"

namespace {

constexpr int kV21Warps = 4;  // a block of 4 warps, 2 × 2 tiles of 16×8: 32×16 of C

// Two elements of an operand as one register (zeros outside the matrix).
template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  uint16_t a, b;
  memcpy(&a, &lo, 2);
  memcpy(&b, &hi, 2);
  return uint32_t(a) | (uint32_t(b) << 16);
}
template <typename T, bool TA>
__device__ __forceinline__ T load_a(const T* A, int64_t m, int64_t k, int64_t M, int64_t K) {
  return m < M && k < K ? A[a_index<TA>(m, k, M, K)] : zero<T>();
}
template <typename T, bool TB>
__device__ __forceinline__ T load_b(const T* B, int64_t k, int64_t n, int64_t N, int64_t K) {
  return k < K && n < N ? B[b_index<TB>(k, n, N, K)] : zero<T>();
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v21(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t m0 = int64_t(blockIdx.y) * 32 + (warp / 2) * 16, n0 = int64_t(blockIdx.x) * 16 + (warp % 2) * 8;
  float acc[4] = {0, 0, 0, 0};
  // region v21
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b[2];
    // A: a0a1 row g, a2a3 row g+8 (columns 2t, 2t+1); a4..a7 the same eight columns on
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t m = m0 + g + 8 * (r % 2), k = k0 + 2 * t + 8 * (r / 2);
      a[r] = pack2(load_a<T, TA>(A, m, k, M, K), load_a<T, TA>(A, m, k + 1, M, K));
    }
    // B: b0b1 rows 2t, 2t+1 of column g; b2b3 rows 2t+8, 2t+9
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t k = k0 + 2 * t + 8 * r, n = n0 + g;
      b[r] = pack2(load_b<T, TB>(B, k, n, N, K), load_b<T, TB>(B, k + 1, n, N, K));
    }
    mma_m16n8k16<T>(acc, a, b, acc);
  }
  // endregion
  // c0c1: row g, columns 2t and 2t+1; c2c3: row g+8
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + g + 8 * (i / 2), n = n0 + 2 * t + i % 2;
    if (m < M && n < N) C[m * N + n] = from_acc<T>(epilogue(acc[i], bias, n, kind));
  }
}

}  // namespace
