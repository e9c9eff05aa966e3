// v6: vectorised: 128-bit global loads, A's tile stored transposed, 128-bit shared loads.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v6.cu -o /tmp/v6.cubin
// v5 loads tiles one element at a time, and in "nt" (the forward) walks B across rows K apart.
// Here a tile is loaded along whichever direction the operand is contiguous in memory, 16 bytes
// (float4 / double2) per load where the row length and the base allow, and As is stored
// transposed, As[k][m], like Bs[k][n]: a thread's TM values of A for one k are then adjacent,
// so the inner loop reads them (and its TN values of B) with 128-bit shared loads (LDS.128).
#pragma once

#include "common.cuh"

namespace {

// Stage the BK × BX tile of an operand that starts at (x0, k0) into S[k][x]. The operand is
// contiguous along k (element (x, k) at P[x * K + k]) or along x (at P[k * X + x]); threads walk
// the contiguous direction so that neighbours read neighbouring addresses. `vec`: whole 16-byte
// vectors are safe (contiguous extent a multiple of the vector, base aligned); tails are scalars.
template <typename T, int BK, int BX, int NT>
__device__ __forceinline__ void load_tile_v6(T (&S)[BK][BX], const T* P, bool contig_k, int64_t x0, int64_t k0,
                                             int64_t X, int64_t K, bool vec) {
  constexpr int V = Vec16<T>::n;
  using VT = typename Vec16<T>::type;
  for (int u = threadIdx.x; u < BK * BX / V; u += NT) {
    const int x = contig_k ? u / (BK / V) : (u % (BX / V)) * V, k = contig_k ? (u % (BK / V)) * V : u / (BX / V);
    const int64_t gx = x0 + x, gk = k0 + k;
    T v[V];
    // region v6
    if (contig_k) {
      if (vec && gx < X && gk + V <= K) {
        const VT w = *reinterpret_cast<const VT*>(P + gx * K + gk);
        memcpy(v, &w, sizeof(w));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = (gx < X && gk + j < K) ? P[gx * K + gk + j] : T(0);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) S[k + j][x] = v[j];  // the transposing store
    // endregion
    } else {
      if (vec && gk < K && gx + V <= X) {
        const VT w = *reinterpret_cast<const VT*>(P + gk * X + gx);
        memcpy(v, &w, sizeof(w));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = (gk < K && gx + j < X) ? P[gk * X + gx + j] : T(0);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) S[k][x + j] = v[j];
    }
  }
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v6(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<6, sizeof(T)>;
  constexpr int BM = t::BM, BN = t::BN, BK = t::BK, TM = t::TM, TN = t::TN, NT = (BM / TM) * (BN / TN);
  constexpr int V = Vec16<T>::n;
  using VT = typename Vec16<T>::type;
  alignas(16) __shared__ T As[BK][BM];
  alignas(16) __shared__ T Bs[BK][BN];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int row0 = ty * TM, col0 = tx * TN;  // this thread's block of the tile
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  // A is contiguous along k unless stored K×M; B along k when stored N×K.
  const bool a_vec = aligned16(A) && (TA ? M : K) % V == 0;
  const bool b_vec = aligned16(B) && (TB ? K : N) % V == 0;
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    load_tile_v6<T, BK, BM, NT>(As, A, !TA, m0, k0, M, K, a_vec);
    load_tile_v6<T, BK, BN, NT>(Bs, B, TB, n0, k0, N, K, b_vec);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; i += V) {
        const VT w = *reinterpret_cast<const VT*>(&As[kk][row0 + i]);
        memcpy(&a[i], &w, sizeof(w));
      }
#pragma unroll
      for (int j = 0; j < TN; j += V) {
        const VT w = *reinterpret_cast<const VT*>(&Bs[kk][col0 + j]);
        memcpy(&b[j], &w, sizeof(w));
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
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
