// Every kernel of stage 3, as one include: nvcc builds it through cuda/dense_kernels.cu, the
// host compiler through cuda/emulate/emulate.cpp (the CPU emulation of the execution model).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense.cubin
#pragma once

#include <cstdint>
#include <cstring>

#include "../dense_kernels.h"

namespace {

using dense_kernels::Tiles;

// ---------------------------------------------------------------------------------------
// Maths. Overloads, never expf/fminf on a template type: a float function silently applied
// to a double (extension-cpp issue #27) is exactly what gradcheck catches too late.
// ---------------------------------------------------------------------------------------

}  // namespace

// Not inlined, and with C names, so that the PTX holds exactly one copy of each, easy to find
// and to hand-edit (ptx/README.md). 1/(1 + e^-z) has no NaN: e^-z saturates to 0 or to inf.
extern "C" __device__ __noinline__ float dense_sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }
extern "C" __device__ __noinline__ double dense_sigmoid_f64(double z) { return 1.0 / (1.0 + exp(-z)); }

namespace {

__device__ __forceinline__ float sigmoid(float z) { return dense_sigmoid_f32(z); }
__device__ __forceinline__ double sigmoid(double z) { return dense_sigmoid_f64(z); }

// Operand access for the three layouts (see dense_kernels.h). TA: A is stored K×M;
// TB: B is stored N×K. Indices are int64: 4096² elements overflow nothing, larger may.
template <bool TA>
__device__ __forceinline__ int64_t a_index(int64_t m, int64_t k, int64_t M, int64_t K) {
  return TA ? k * M + m : m * K + k;
}
template <bool TB>
__device__ __forceinline__ int64_t b_index(int64_t k, int64_t n, int64_t N, int64_t K) {
  return TB ? n * K + k : k * N + n;
}

template <typename T>
__device__ __forceinline__ T epilogue(T acc, const T* bias, int64_t n, int kind) {
  if (kind == dense_kernels::kBiasSigmoid) return sigmoid(bias != nullptr ? acc + bias[n] : acc);
  return acc;
}

// ---------------------------------------------------------------------------------------
// v1: one thread per output
// ---------------------------------------------------------------------------------------
template <typename T, bool TA, bool TB>
__device__ void gemm_v1(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K,
                        int kind) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  T acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += A[a_index<TA>(m, k, M, K)] * B[b_index<TB>(k, n, N, K)];
  C[m * N + n] = epilogue(acc, bias, n, kind);
}

// ---------------------------------------------------------------------------------------
// v2: shared-memory tiles. A 32×32 block of threads stages a 32×32 tile of A and of B, then
// every thread reads its row of A and column of B from shared memory: each global element
// is loaded once per tile instead of once per output.
// ---------------------------------------------------------------------------------------
template <typename T, bool TA, bool TB>
__device__ void gemm_v2(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K,
                        int kind) {
  constexpr int S = dense_kernels::kSmemTile;
  __shared__ T As[S][S + 1];  // +1: rows land in different banks when read down a column
  __shared__ T Bs[S][S];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m = int64_t(blockIdx.y) * S + ty, n = int64_t(blockIdx.x) * S + tx;
  T acc = 0;
  for (int64_t k0 = 0; k0 < K; k0 += S) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    As[ty][tx] = (m < M && ka < K) ? A[a_index<TA>(m, ka, M, K)] : T(0);
    Bs[ty][tx] = (kb < K && n < N) ? B[b_index<TB>(kb, n, N, K)] : T(0);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < S; ++kk) acc += As[ty][kk] * Bs[kk][tx];
    __syncthreads();
  }
  if (m < M && n < N) C[m * N + n] = epilogue(acc, bias, n, kind);
}

// ---------------------------------------------------------------------------------------
// v3 / v4: register tiles (siboehm's "2-D block tiling" with vectorised loads)
// ---------------------------------------------------------------------------------------

// 16-byte vectors: four floats or two doubles.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  using type = float4;
  static constexpr int n = 4;
};
template <>
struct Vec16<double> {
  using type = double2;
  static constexpr int n = 2;
};

// Stage the BK × BX tile of an operand that starts at (x0, k0) into S[k][x] (k-major, so the
// inner product reads rows of S). The operand is contiguous along k (element (x, k) at
// P[x * K + k]) or along x (element at P[k * X + x]); threads walk the contiguous direction
// so that neighbours read neighbouring addresses. `vec`: whole 16-byte vectors are safe
// (contiguous extent a multiple of the vector, base aligned); tails fall back to scalars.
template <typename T, int BK, int BX, int NT>
__device__ __forceinline__ void load_tile(T (&S)[BK][BX], const T* P, bool contig_k, int64_t x0, int64_t k0,
                                          int64_t X, int64_t K, bool vec) {
  constexpr int V = Vec16<T>::n;
  using VT = typename Vec16<T>::type;
  if (contig_k) {
    for (int u = threadIdx.x; u < BX * (BK / V); u += NT) {
      const int x = u / (BK / V), k = (u % (BK / V)) * V;
      const int64_t gx = x0 + x, gk = k0 + k;
      T v[V];
      if (vec && gx < X && gk + V <= K) {
        const VT w = *reinterpret_cast<const VT*>(P + gx * K + gk);
        memcpy(v, &w, sizeof(w));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = (gx < X && gk + j < K) ? P[gx * K + gk + j] : T(0);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) S[k + j][x] = v[j];
    }
  } else {
    for (int u = threadIdx.x; u < BK * (BX / V); u += NT) {
      const int k = u / (BX / V), x = (u % (BX / V)) * V;
      const int64_t gx = x0 + x, gk = k0 + k;
      T v[V];
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

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Each of the (BM/TM)·(BN/TN) threads owns TM×TN outputs, strided across the tile
// (rows ty + i·BM/TM, columns tx + j·BN/TN): neighbouring threads then read neighbouring
// shared-memory words (no bank conflicts) and write neighbouring outputs (coalesced).
template <typename T, bool TA, bool TB, int BM, int BN, int BK, int TM, int TN>
__device__ void gemm_tiled(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K,
                           int kind) {
  constexpr int NT = (BM / TM) * (BN / TN), V = Vec16<T>::n;
  __shared__ T As[BK][BM];
  __shared__ T Bs[BK][BN];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
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
    load_tile<T, BK, BM, NT>(As, A, !TA, m0, k0, M, K, a_vec);
    load_tile<T, BK, BN, NT>(Bs, B, TB, n0, k0, N, K, b_vec);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      T a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + ty + i * (BM / TM);
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t n = n0 + tx + j * (BN / TN);
      if (m < M && n < N) C[m * N + n] = epilogue(acc[i][j], bias, n, kind);
    }
  }
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v3(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using P = Tiles<sizeof(T)>;
  gemm_tiled<T, TA, TB, P::BM, P::BN, P::BK, P::TM, P::TN>(A, B, C, bias, M, N, K, kind);
}

template <typename T, bool TA, bool TB>
__device__ void gemm_v4(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, int64_t K, int kind) {
  using P = Tiles<sizeof(T)>;
  gemm_tiled<T, TA, TB, P::SBM, P::SBN, P::SBK, P::STM, P::STN>(A, B, C, bias, M, N, K, kind);
}

// ---------------------------------------------------------------------------------------
// The backward's elementwise part: dz = g · y · (1 − y), and db = Σ_rows dz, in one pass.
// A block owns 32 columns and walks every row; the partial sums of its row lanes meet in
// shared memory and are added in a fixed order.
// ---------------------------------------------------------------------------------------
template <typename T, int CPT>
__device__ void sigmoid_grad(const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols) {
  constexpr int kCols = dense_kernels::kGradCols, kLanes = dense_kernels::kGradThreads / (kCols / CPT);
  __shared__ T partial[kLanes][kCols];
  const int lane = threadIdx.y;
  const int64_t c0 = int64_t(blockIdx.x) * kCols + int64_t(threadIdx.x) * CPT;
  T sum[CPT];
#pragma unroll
  for (int j = 0; j < CPT; ++j) sum[j] = T(0);
  if (c0 < cols) {
    for (int64_t r = lane; r < rows; r += kLanes) {
      const int64_t at = r * cols + c0;
      // CPT adjacent columns, CPT scalar loads: the compiler cannot prove 16-byte alignment,
      // so it will not fuse them. The PTX stage does (ld.global.v4.f32).
      // (CPT > 1 needs cols % CPT == 0: then a group that starts inside a row ends inside it.)
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        const T yv = y[at + j];
        const T d = g[at + j] * yv * (T(1) - yv);
        dz[at + j] = d;
        sum[j] += d;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CPT; ++j) partial[lane][threadIdx.x * CPT + j] = sum[j];
  __syncthreads();
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = int64_t(blockIdx.x) * kCols + t;
  if (db != nullptr && t < kCols && c < cols) {
    T total = 0;
    for (int l = 0; l < kLanes; ++l) total += partial[l][t];
    db[c] = total;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Entry points with C names, so that the PTX stage can find them by name.
// ---------------------------------------------------------------------------------------
// __launch_bounds__ tells the compiler the block size, so it can budget registers for it.
#define DENSE_GEMM_THREADS_1 (dense_kernels::kNaiveBlock * dense_kernels::kNaiveBlock)
#define DENSE_GEMM_THREADS_2 (dense_kernels::kSmemTile * dense_kernels::kSmemTile)
#define DENSE_GEMM_THREADS_3 256
#define DENSE_GEMM_THREADS_4 256
#define DENSE_GEMM_ENTRY(V, LAYOUT, TA, TB, T, SUFFIX)                                                   \
  extern "C" __global__ void __launch_bounds__(DENSE_GEMM_THREADS_##V)                                   \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const T* A, const T* B, T* C, const T* bias, int64_t M,     \
                                            int64_t N, int64_t K, int epilogue) {                       \
    gemm_v##V<T, TA, TB>(A, B, C, bias, M, N, K, epilogue);                                             \
  }
#define DENSE_GEMM_LAYOUTS(V, T, SUFFIX)           \
  DENSE_GEMM_ENTRY(V, nt, false, true, T, SUFFIX)  \
  DENSE_GEMM_ENTRY(V, nn, false, false, T, SUFFIX) \
  DENSE_GEMM_ENTRY(V, tn, true, false, T, SUFFIX)
#define DENSE_GEMM_VERSIONS(T, SUFFIX) \
  DENSE_GEMM_LAYOUTS(1, T, SUFFIX)     \
  DENSE_GEMM_LAYOUTS(2, T, SUFFIX)     \
  DENSE_GEMM_LAYOUTS(3, T, SUFFIX)     \
  DENSE_GEMM_LAYOUTS(4, T, SUFFIX)

DENSE_GEMM_VERSIONS(float, f32)
DENSE_GEMM_VERSIONS(double, f64)

extern "C" __global__ void __launch_bounds__(dense_kernels::kGradThreads) dense_sigmoid_grad_f32(const float* g, const float* y, float* dz, float* db,
                                                  int64_t rows, int64_t cols) {
  sigmoid_grad<float, 1>(g, y, dz, db, rows, cols);
}
extern "C" __global__ void __launch_bounds__(dense_kernels::kGradThreads) dense_sigmoid_grad_f64(const double* g, const double* y, double* dz, double* db,
                                                  int64_t rows, int64_t cols) {
  sigmoid_grad<double, 1>(g, y, dz, db, rows, cols);
}
extern "C" __global__ void __launch_bounds__(dense_kernels::kGradThreads) dense_sigmoid_grad_x4_f32(const float* g, const float* y, float* dz, float* db,
                                                     int64_t rows, int64_t cols) {
  sigmoid_grad<float, 4>(g, y, dz, db, rows, cols);
}


// The entry for (version, layout): the CUDA launcher and the CPU emulation look kernels up here.
namespace dense_kernels {
namespace {
template <typename T>
using GemmFn = void (*)(const T*, const T*, T*, const T*, int64_t, int64_t, int64_t, int);

template <typename T>
GemmFn<T> gemm_entry(int version, const char* layout);

#define DENSE_TABLE_ROW(V, T, SUFFIX) \
  {dense_gemm_v##V##_nt_##SUFFIX, dense_gemm_v##V##_nn_##SUFFIX, dense_gemm_v##V##_tn_##SUFFIX}

int layout_index(const char* layout) {
  return std::strcmp(layout, "nt") == 0 ? 0 : std::strcmp(layout, "nn") == 0 ? 1 : std::strcmp(layout, "tn") == 0 ? 2 : -1;
}

template <>
GemmFn<float> gemm_entry<float>(int version, const char* layout) {
  static const GemmFn<float> table[4][3] = {DENSE_TABLE_ROW(1, float, f32), DENSE_TABLE_ROW(2, float, f32),
                                            DENSE_TABLE_ROW(3, float, f32), DENSE_TABLE_ROW(4, float, f32)};
  const int l = layout_index(layout);
  return (version >= 1 && version <= 4 && l >= 0) ? table[version - 1][l] : nullptr;
}
template <>
GemmFn<double> gemm_entry<double>(int version, const char* layout) {
  static const GemmFn<double> table[4][3] = {DENSE_TABLE_ROW(1, double, f64), DENSE_TABLE_ROW(2, double, f64),
                                             DENSE_TABLE_ROW(3, double, f64), DENSE_TABLE_ROW(4, double, f64)};
  const int l = layout_index(layout);
  return (version >= 1 && version <= 4 && l >= 0) ? table[version - 1][l] : nullptr;
}

}  // namespace
}  // namespace dense_kernels
