// v12: skinny batches: a tile as tall as the batch, and K split until every SM is full.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v12.cu -o /tmp/v12.cubin
// At B = 32, I = O = 4096 the forward reads W (64 MiB) once for 2·32·4096·4096 FLOPs: about 20 µs
// of an H100's memory bandwidth, 16 µs of its float32 peak. v9 gives it 128-row tiles, 96 rows of
// each zeros, and 5 slices of K: 160 blocks of 256 threads, on 132 SMs that hold two each. Here
// the tile is 32×128 (the batch's 32 rows; 4 warps of 32×32, 4×8 outputs a lane: v11's template
// at that shape), and dense_kernels::skinny_slices splits K until tiles × slices fills every SM
// with the blocks it holds (float32: 4, registers capped at 128 by __launch_bounds__): 32 tiles ×
// 16 slices, 512 blocks at once, each streaming its own 128×256 panel of W once. As in v9, block z
// writes its slice's partial product, and dense_splitk_reduce adds the slices in order
// (deterministic) and applies the epilogue. Correct for every shape and layout; with a large
// batch there is nothing to split and it is v11's template at a short tile.
#pragma once

#include "common.cuh"
#include "v8_double_buffer.cuh"  // TileLoaderV8 (its k_end bounds a slice), cp_async_wait_all

namespace {

template <typename T, bool TA, bool TB, class S>
__device__ void gemm_v12(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
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
  const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;  // this warp's tile
  const int lm = (lane / LN) * TM, ln = (lane % LN) * TN;                  // this lane's piece in each step
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // region v12
  // This block's slice of K: whole k-steps, as even as they come; C is its slice's partial.
  const int64_t steps = (K + BK - 1) / BK, per_slice = (steps + gridDim.z - 1) / gridDim.z;
  const int64_t k_begin = blockIdx.z * per_slice * BK;
  const int64_t k_end = k_begin + per_slice * BK < K ? k_begin + per_slice * BK : K;
  // With slices, C is the launcher's workspace of the accumulator's type (float32 for 16-bit T): this
  // block writes its slice's partial product there, unrounded, and the reduction applies the epilogue.
  Acc* const partial = gridDim.z > 1 ? reinterpret_cast<Acc*>(C) + int64_t(blockIdx.z) * M * N : nullptr;
  // endregion
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
  la.fetch(As[0], A, !TA, m0, k_begin, M, K, k_end, a_vec);
  lb.fetch(Bs[0], B, TB, n0, k_begin, N, K, k_end, b_vec);
  la.stash(As[0], !TA);
  lb.stash(Bs[0], TB);
  cp_async_wait_all();
  __syncthreads();
  for (int64_t k0 = k_begin, step = 0; k0 < k_end; k0 += BK, ++step) {
    const int cur = step & 1, nxt = cur ^ 1;
    const bool more = k0 + BK < k_end;
    if (more) {  // the next step's loads are in flight during this step's FMAs
      la.fetch(As[nxt], A, !TA, m0, k0 + BK, M, K, k_end, a_vec);
      lb.fetch(Bs[nxt], B, TB, n0, k0 + BK, N, K, k_end, b_vec);
    }
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
      if (m >= M || n >= N) continue;
      if (partial != nullptr) partial[m * N + n] = acc[i][j];
      else C[m * N + n] = from_acc<T>(epilogue(acc[i][j], bias, n, kind));
    }
}

}  // namespace
