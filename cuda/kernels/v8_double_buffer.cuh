// v8: double buffering: the next k-step's tiles load while this one computes.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
// v7 loads a tile, waits for everyone (__syncthreads), computes, waits again. Here As and Bs
// come twice: while the block computes on buffer `cur`, each thread has already issued the
// global loads of the next step into registers (or, on sm_80 and newer, as cp.async copies
// straight into shared memory where no transposition is needed), and stores them into buffer
// `nxt` after its FMAs: the load latency hides behind the arithmetic, and one __syncthreads per
// step is enough. Where cp.async does not exist a plain copy stands in; the CPU emulation models
// cp.async (cuda/kernels/instructions.cuh).
#pragma once

#include "common.cuh"
#include "instructions.cuh"  // cp.async

namespace {

// One thread's share of staging the BK × BX tile of an operand that starts at (x0, k0) into
// S[k][x], in two halves: fetch() issues the global loads (v7's load_tile, same directions and
// vectors), stash() stores what fetch() left in registers. The operand is contiguous along k
// (element (x, k) at P[x * K + k]; stored transposed) or along x (at P[k * X + x]; on sm_80+ a
// whole aligned vector goes by cp.async, straight into S). Loads stop at k_end (K here; the end
// of a slice of K in the split-K versions). LD, the length of a row of S, is BX here; the later
// versions pad it (v10). ST, the type S holds, is T except in v11's template for bfloat16 and
// float16 operands, which it stores as float32: stash() converts them, and cp.async, a copy of
// bytes, cannot, so they come through registers.
template <typename T, int BK, int BX, int NT, int LD = BX, typename ST = T>
struct TileLoaderV8 {
  static constexpr int V = Vec16<T>::n, R = (BK * BX / V + NT - 1) / NT;
  static constexpr bool kSameType = std::is_same<T, ST>::value;
  using VT = typename Vec16<T>::type;
  T v[R][V];
  bool in_registers[R];

  __device__ __forceinline__ void fetch(ST (&S)[BK][LD], const T* P, bool contig_k, int64_t x0, int64_t k0, int64_t X,
                                        int64_t K, int64_t k_end, bool vec) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int u = threadIdx.x + r * NT;
      in_registers[r] = false;
      if (u >= BK * BX / V) continue;
      const int x = contig_k ? u / (BK / V) : (u % (BX / V)) * V, k = contig_k ? (u % (BK / V)) * V : u / (BX / V);
      const int64_t gx = x0 + x, gk = k0 + k;
      in_registers[r] = true;
      if (contig_k) {
        if (vec && gx < X && gk + V <= k_end) {
          const VT w = *reinterpret_cast<const VT*>(P + gx * K + gk);
          memcpy(v[r], &w, sizeof(w));
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) v[r][j] = (gx < X && gk + j < k_end) ? P[gx * K + gk + j] : zero<T>();
        }
      } else if (kHasCpAsync && kSameType && vec && gk < k_end && gx + V <= X) {
        cp_async16(&S[k][x], P + gk * X + gx);
        in_registers[r] = false;
      } else if (vec && gk < k_end && gx + V <= X) {
        const VT w = *reinterpret_cast<const VT*>(P + gk * X + gx);
        memcpy(v[r], &w, sizeof(w));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[r][j] = (gk < k_end && gx + j < X) ? P[gk * X + gx + j] : zero<T>();
      }
    }
  }

  __device__ __forceinline__ void stash(ST (&S)[BK][LD], bool contig_k) const {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!in_registers[r]) continue;
      const int u = threadIdx.x + r * NT;
      const int x = contig_k ? u / (BK / V) : (u % (BX / V)) * V, k = contig_k ? (u % (BK / V)) * V : u / (BX / V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (contig_k) S[k + j][x] = ST(to_acc(v[r][j]));  // the transposing store
        else S[k][x + j] = ST(to_acc(v[r][j]));
      }
    }
  }
};

template <typename T, bool TA, bool TB>
__device__ void gemm_v8(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using t = dense_kernels::TileOf<8, sizeof(T)>;
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
  la.fetch(As[0], A, !TA, m0, 0, M, K, K, a_vec);
  lb.fetch(Bs[0], B, TB, n0, 0, N, K, K, b_vec);
  la.stash(As[0], !TA);
  lb.stash(Bs[0], TB);
  cp_async_wait_all();
  __syncthreads();
  // region v8
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
  // endregion

#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t m = m0 + row0 + i, n = n0 + col0 + j;
      if (m < M && n < N) C[m * N + n] = epilogue(acc[i][j], bias, n, kind);
    }
}

}  // namespace
