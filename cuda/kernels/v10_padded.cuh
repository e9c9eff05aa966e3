// v10: padded tiles: the transposing store no longer conflicts on shared-memory banks.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v10.cu -o /tmp/v10.cubin
// v8 stores a tile transposed, S[k][x], from 16-byte vectors read along k: lanes 2i and 2i+1 of a
// warp hold the same x and k = 0 and 4 (float32; BK/V = 2 vectors per row of the operand), so
// for each of the vector's 4 elements they store at S[k + j][x] and S[k + 4 + j][x]: 4·BM words
// apart. With BM = 128 that is a multiple of 32 words, the same bank: every such store takes two
// passes (a 2-way bank conflict), 8 stores per warp per k-step in the forward, where both tiles
// are transposed. Here a row of S is BM + V elements long (16 bytes more): the second lane's word
// moves by 4·V = 16 banks, so the 32 lanes hit 32 different banks (float64: the 64-bit stores of
// each half-warp, 16 different bank pairs). The inner loop is v8's: its 128-bit reads stay within
// one row, whose start stays 16-byte aligned. Shared memory grows by 2·BK·V elements per operand.
#pragma once

#include "common.cuh"
#include "v8_double_buffer.cuh"  // TileLoaderV8 (its LD is the padded row), cp_async_wait_all

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v10(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<10, sizeof(T)>;
  constexpr int BM = t::BM, BN = t::BN, BK = t::BK, TM = t::TM, TN = t::TN, NT = (BM / TM) * (BN / TN);
  constexpr int V = Vec16<T>::n;
  using VT = typename Vec16<T>::type;
  // Rows of the tiles padded by 16 bytes: the transposing store's lanes then hit different banks,
  // and a row still starts on a 16-byte boundary, as the 128-bit loads below need.
  // region v10
  constexpr int LDA = BM + V, LDB = BN + V;
  alignas(16) __shared__ T As[2][BK][LDA];
  alignas(16) __shared__ T Bs[2][BK][LDB];
  // endregion
  constexpr int WM = dense_kernels::kWarpLanesM * TM, WN = dense_kernels::kWarpLanesN * TN;  // a warp's tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (warp / (BN / WN)) * WM + (lane / dense_kernels::kWarpLanesN) * TM;
  const int col0 = (warp % (BN / WN)) * WN + (lane % dense_kernels::kWarpLanesN) * TN;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // A is contiguous along k unless stored K×M; B along k when stored N×K.
  const bool a_vec = aligned16(A) && (TA ? M : K) % V == 0;
  const bool b_vec = aligned16(B) && (TB ? K : N) % V == 0;
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  TileLoaderV8<T, BK, BM, NT, LDA> la;
  TileLoaderV8<T, BK, BN, NT, LDB> lb;
  la.fetch(As[0], A, !TA, m0, 0, M, K, K, a_vec);
  lb.fetch(Bs[0], B, TB, n0, 0, N, K, K, b_vec);
  la.stash(As[0], !TA);
  lb.stash(Bs[0], TB);
  cp_async_wait_all();
  __syncthreads();
  for (int64_t k0 = 0, step = 0; k0 < K; k0 += BK, ++step) {
    const int cur = step & 1, nxt = cur ^ 1;
    const bool more = k0 + BK < K;
    if (more) {  // the next step's loads are in flight during this step's FMAs
      la.fetch(As[nxt], A, !TA, m0, k0 + BK, M, K, K, a_vec);
      lb.fetch(Bs[nxt], B, TB, n0, k0 + BK, N, K, K, b_vec);
    }
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; i += V) {
        const VT w = *reinterpret_cast<const VT*>(&As[cur][kk][row0 + i]);
        memcpy(&a[i], &w, sizeof(w));
      }
#pragma unroll
      for (int j = 0; j < TN; j += V) {
        const VT w = *reinterpret_cast<const VT*>(&Bs[cur][kk][col0 + j]);
        memcpy(&b[j], &w, sizeof(w));
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    if (more) {
      la.stash(As[nxt], !TA);
      lb.stash(Bs[nxt], TB);
    }
    cp_async_wait_all();
    __syncthreads();  // nxt is complete, and nobody reads cur any more (the next step writes it)
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
