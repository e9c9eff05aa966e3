// v9: split-K, for small batches: the k loop is split over gridDim.z blocks per tile of C.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v9.cu -o /tmp/v9.cubin
// At B = 32 the forward has ceil(32/128)·ceil(O/128) tiles: 32 for O = 4096, a quarter of an
// H100's 132 SMs. v9 is v8 where block z of a tile walks only its slice of K and writes a
// partial product; dense_kernels::splitk_slices picks the number of slices from the SM count the
// caller queried on the device (never a constant), and dense_splitk_reduce adds the partials in
// slice order (deterministic) and applies the epilogue. With one slice it is v8.
#pragma once

#include "common.cuh"
#include "v8_double_buffer.cuh"  // TileLoaderV8 (its k_end bounds a slice), cp_async_wait_all

namespace {

template <typename T, bool TA, bool TB>
__device__ void gemm_v9(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<9, sizeof(T)>;
  constexpr int BM = t::BM, BN = t::BN, BK = t::BK, TM = t::TM, TN = t::TN, NT = (BM / TM) * (BN / TN);
  constexpr int V = Vec16<T>::n;
  using VT = typename Vec16<T>::type;
  alignas(16) __shared__ T As[2][BK][BM];
  alignas(16) __shared__ T Bs[2][BK][BN];
  constexpr int WM = dense_kernels::kWarpLanesM * TM, WN = dense_kernels::kWarpLanesN * TN;  // a warp's tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (warp / (BN / WN)) * WM + (lane / dense_kernels::kWarpLanesN) * TM;
  const int col0 = (warp % (BN / WN)) * WN + (lane % dense_kernels::kWarpLanesN) * TN;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // This block's slice of K: whole k-steps, as even as they come; C is its slice's partial.
  // region v9
  const int64_t steps = (K + BK - 1) / BK, per_slice = (steps + gridDim.z - 1) / gridDim.z;
  const int64_t k_begin = blockIdx.z * per_slice * BK;
  const int64_t k_end = k_begin + per_slice * BK < K ? k_begin + per_slice * BK : K;
  C += int64_t(blockIdx.z) * M * N;
  // endregion
  // A is contiguous along k unless stored K×M; B along k when stored N×K.
  const bool a_vec = aligned16(A) && (TA ? M : K) % V == 0;
  const bool b_vec = aligned16(B) && (TB ? K : N) % V == 0;
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  TileLoaderV8<T, BK, BM, NT> la;
  TileLoaderV8<T, BK, BN, NT> lb;
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

// C = epilogue(Σ_s partial[s]) over `slices` partial M×N products, added in slice order.
// The partials are in the accumulator's type (float32 for bfloat16 and float16 outputs).
template <typename T>
__device__ void splitk_reduce(const acc_t<T>* partial, T* C, const T* bias, int64_t M, int64_t N, int slices,
                              int kind) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  acc_t<T> acc = 0;
  for (int s = 0; s < slices; ++s) acc += partial[s * M * N + i];
  C[i] = from_acc<T>(epilogue(acc, bias, i % N, kind));
}

}  // namespace
