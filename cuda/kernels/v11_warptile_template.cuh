// v11: warp tiling in pieces, as SGEMM_CUDA's kernel 10, written once for every tile shape.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v11.cu -o /tmp/v11.cubin
// v10's tile shape is fixed: 128×128, k-steps of 8, 256 threads of 8×8 outputs, a warp's lanes an
// 8×4 grid over a 64×32 sub-tile. Here the shape is a template parameter S (dense_kernels::WarpTile):
// the block's BM×BN tile is cut into warp tiles of WM×WN; a warp's lanes are v7's 8×4 grid, each
// lane owning a TM×TN piece, and the warp covers its tile in WMITER×WNITER steps of (8·TM)×(4·TN),
// so that a lane holds (WM/8)×(WN/4) outputs and reads WMITER·TM values of A and WNITER·TN of B
// per k. v11 itself is SGEMM_CUDA's shape (float32: 128×128, 64×64 per warp in 1×4 steps of
// 64×16, 128 threads of 8×16 outputs: 24 values read from shared memory feed 128 multiply-adds,
// where v10 reads 16 for 64) with k-steps of 8 (dense_kernels::warp_tile says why); the
// autotuning candidates (dense_kernels::kTuneCandidates) are other instantiations of the same
// code. Double buffering is v8's, the padded rows v10's.
#pragma once

#include "common.cuh"
#include "v8_double_buffer.cuh"  // TileLoaderV8, cp_async_wait_all

namespace {

template <typename T, bool TA, bool TB, class S>
__device__ void gemm_v11(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  constexpr int BM = S::BM, BN = S::BN, BK = S::BK, WM = S::WM, WN = S::WN, TM = S::TM, TN = S::TN;
  constexpr int LM = dense_kernels::kWarpLanesM, LN = dense_kernels::kWarpLanesN;  // the lanes' 8×4 grid
  constexpr int WMITER = WM / (LM * TM), WNITER = WN / (LN * TN);                  // steps over the warp tile
  constexpr int NT = (BM / WM) * (BN / WN) * 32;
  using Acc = acc_t<T>;  // the tiles in shared memory hold the accumulator's type (T but for 16-bit T)
  constexpr int V = Vec16<Acc>::n, VG = Vec16<T>::n;  // elements in 16 bytes: of the tiles, of T in global memory
  using VT = typename Vec16<Acc>::type;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % (LM * TM) == 0 && WN % (LN * TN) == 0,
                "warp tiles must cut the block tile, and pieces the warp tile, evenly");
  static_assert(TM % V == 0 && TN % V == 0 && BK % VG == 0, "pieces and k-steps are whole 16-byte vectors");
  constexpr int LDA = BM + V, LDB = BN + V;  // v10's padded rows
  alignas(16) __shared__ Acc As[2][BK][LDA];
  alignas(16) __shared__ Acc Bs[2][BK][LDB];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // region v11-mapping
  const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;  // this warp's tile
  const int lm = (lane / LN) * TM, ln = (lane % LN) * TN;                  // this lane's piece in each step
  // endregion
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // A is contiguous along k unless stored K×M; B along k when stored N×K.
  const bool a_vec = aligned16(A) && (TA ? M : K) % VG == 0;
  const bool b_vec = aligned16(B) && (TB ? K : N) % VG == 0;
  Acc acc[WMITER * TM][WNITER * TN];
#pragma unroll
  for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
    for (int j = 0; j < WNITER * TN; ++j) acc[i][j] = Acc(0);

  TileLoaderV8<T, BK, BM, NT, LDA, Acc> la;
  TileLoaderV8<T, BK, BN, NT, LDB, Acc> lb;
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
    // region v11-inner
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      Acc a[WMITER * TM], b[WNITER * TN];
#pragma unroll
      for (int i = 0; i < WMITER; ++i)
#pragma unroll
        for (int t = 0; t < TM; t += V) {
          const VT w = *reinterpret_cast<const VT*>(&As[cur][kk][wm0 + i * LM * TM + lm + t]);
          memcpy(&a[i * TM + t], &w, sizeof(w));
        }
#pragma unroll
      for (int j = 0; j < WNITER; ++j)
#pragma unroll
        for (int t = 0; t < TN; t += V) {
          const VT w = *reinterpret_cast<const VT*>(&Bs[cur][kk][wn0 + j * LN * TN + ln + t]);
          memcpy(&b[j * TN + t], &w, sizeof(w));
        }
#pragma unroll
      for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
        for (int j = 0; j < WNITER * TN; ++j) acc[i][j] += a[i] * b[j];
    }
    // endregion
    if (more) {
      la.stash(As[nxt], !TA);
      lb.stash(Bs[nxt], TB);
    }
    cp_async_wait_all();
    __syncthreads();  // nxt is complete, and nobody reads cur any more (the next step writes it)
  }

#pragma unroll
  for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
    for (int j = 0; j < WNITER * TN; ++j) {
      const int64_t m = m0 + wm0 + (i / TM) * LM * TM + lm + i % TM;
      const int64_t n = n0 + wn0 + (j / TN) * LN * TN + ln + j % TN;
      if (m < M && n < N) C[m * N + n] = from_acc<T>(epilogue(acc[i][j], bias, n, kind));
    }
}

}  // namespace
