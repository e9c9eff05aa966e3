// v22 and v23: shared memory and ldmatrix. A block of 4 warps computes a 64×64 tile of C; per
// k-step of 64 it stages A's and B's 64×64 tiles in shared memory once, with 16-byte loads, and
// every warp takes its fragments from there with ldmatrix: one instruction hands the warp four
// 8×8 matrices (ldmatrix.x4), 16 bytes a lane, in exactly the registers mma wants.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v22.cu -o /tmp/v22.cubin
// A tile is staged as it lies in global memory: rows along k ([x][k], a "row" operand) or along
// x ([k][x], A of the tn layout and B of nn); ldmatrix's .trans turns the second kind into the
// same registers. Each ldmatrix reads 8 rows of 16 bytes a matrix. The rows are 128 bytes long,
// so in v22 those 8 rows start at the same bank: eight 16-byte reads queue on the same 4 banks.
// v23 stores 16-byte chunk c of row r at chunk c ^ (r % 8) (an XOR swizzle): the 8 rows of any
// matrix then lie in 8 different groups of banks, and the stores stay 16-byte aligned.
#pragma once

#include "v21_mma.cuh"  // pack2

namespace {

constexpr int kV22Tile = 64;  // BM = BN = BK = 64: 64 bf16 = 128 bytes a row, 8 chunks of 16 bytes

// region v23
// Byte offset of element (r, c) of a 64×64 16-bit tile: chunk c/8 of row r, swizzled or not.
template <bool Swizzle>
__device__ __forceinline__ int v22_offset(int r, int c) {
  const int chunk = Swizzle ? (c / 8) ^ (r % 8) : c / 8;
  return r * 128 + chunk * 16 + (c % 8) * 2;
}
// endregion

// Stage the 64×64 tile of P at (x0, k0) into S: rows along k if contig_k (P is X×K), else along x
// (P is K×X); zeros outside. 512 chunks of 16 bytes, 4 for each of the 128 threads.
template <typename T, bool Swizzle>
__device__ __forceinline__ void v22_stage(unsigned char* S, const T* P, bool contig_k, int64_t x0, int64_t k0,
                                          int64_t X, int64_t K, bool vec) {
  for (int u = threadIdx.x; u < kV22Tile * 8; u += 128) {
    const int r = u / 8, c = (u % 8) * 8;  // row of the tile, first column of the chunk
    const int64_t gr = (contig_k ? x0 : k0) + r, gc = (contig_k ? k0 : x0) + c;
    const int64_t rows = contig_k ? X : K, cols = contig_k ? K : X;
    const T* src = P + gr * cols + gc;
    uint4 chunk;
    if (vec && gr < rows && gc + 8 <= cols) {
      chunk = *reinterpret_cast<const uint4*>(src);
    } else {
      T v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = gr < rows && gc + j < cols ? src[j] : zero<T>();
      memcpy(&chunk, v, 16);
    }
    *reinterpret_cast<uint4*>(S + v22_offset<Swizzle>(r, c)) = chunk;
  }
}

template <typename T, bool TA, bool TB, bool Swizzle>
__device__ void gemm_v22_v23(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  alignas(128) __shared__ unsigned char As[kV22Tile * 128], Bs[kV22Tile * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // this warp's 32×32 of the 64×64 tile
  const int64_t m0 = int64_t(blockIdx.y) * kV22Tile, n0 = int64_t(blockIdx.x) * kV22Tile;
  const bool a_vec = aligned16(A) && (TA ? M : K) % 8 == 0, b_vec = aligned16(B) && (TB ? K : N) % 8 == 0;
  float acc[2][4][4] = {};  // 2 × 4 tiles of 16×8
  for (int64_t k0 = 0; k0 < K; k0 += kV22Tile) {
    v22_stage<T, Swizzle>(As, A, !TA, m0, k0, M, K, a_vec);
    v22_stage<T, Swizzle>(Bs, B, TB, n0, k0, N, K, b_vec);
    __syncthreads();
    // region v22
#pragma unroll
    for (int kk = 0; kk < kV22Tile; kk += 16) {
      // Lane l gives the address of row l % 8 of matrix q = l / 8. A's four matrices make one
      // 16×16 fragment: q = (m block q % 2, k block q / 2); B's make two k16×n8 fragments:
      // q = (n block q / 2, k block q % 2). Stored along x ([k][x]), a matrix's rows run along k
      // and .trans hands out its transpose.
      const int q = lane / 8, r = lane % 8;
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int m = wm + 16 * i + 8 * (q % 2), k = kk + 8 * (q / 2);
        if (!TA) ldmatrix<4, false>(a[i], As + v22_offset<Swizzle>(m + r, k));
        else ldmatrix<4, true>(a[i], As + v22_offset<Swizzle>(k + r, m));
      }
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        const int n = wn + 8 * j + 8 * (q / 2), k = kk + 8 * (q % 2);
        uint32_t d[4];
        if (TB) ldmatrix<4, false>(d, Bs + v22_offset<Swizzle>(n + r, k));
        else ldmatrix<4, true>(d, Bs + v22_offset<Swizzle>(k + r, n));
        b[j][0] = d[0], b[j][1] = d[1], b[j + 1][0] = d[2], b[j + 1][1] = d[3];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_m16n8k16<T>(acc[i][j], a[i], b[j], acc[i][j]);
    }
    // endregion
    __syncthreads();  // everyone is done with the tiles before the next step overwrites them
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + wm + 16 * i + g + 8 * (e / 2), n = n0 + wn + 8 * j + 2 * t + e % 2;
        if (m < M && n < N) C[m * N + n] = from_acc<T>(epilogue(acc[i][j][e], bias, n, kind));
      }
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v22(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  gemm_v22_v23<T, TA, TB, false>(A, B, C, bias, M, N, K, kind);
}
template <typename T, bool TA, bool TB>
__device__ void gemm_v23(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  gemm_v22_v23<T, TA, TB, true>(A, B, C, bias, M, N, K, kind);
}

}  // namespace
