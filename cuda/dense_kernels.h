// What the CUDA binding (cuda/binding.cpp) and the PTX loader (ptx/loader.cpp) both need to
// know about the kernels in dense_kernels.cu: their names, their parameters and the launch
// geometry of each. Plain C++, no CUDA headers, so both sides include it.
//
// Checked without a GPU by: python -m pytest tests/test_kernels.py
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;

namespace dense_kernels {

// Every GEMM entry computes C[M×N] = op(A)[M×K] · op(B)[K×N], then an epilogue:
//   kPlain:       C = acc
//   kBiasSigmoid: C = sigmoid(acc + bias[n])   (bias may be null)
// Layouts (row-major storage):
//   "nt": A is M×K, B is given as N×K  (forward:  y  = x · Wᵀ)
//   "nn": A is M×K, B is K×N           (backward: dx = dz · W)
//   "tn": A is given as K×M, B is K×N  (backward: dW = dzᵀ · x)
// Parameters: (const T* A, const T* B, T* C, const T* bias, int64 M, int64 N, int64 K, int epilogue)
enum Epilogue : int { kPlain = 0, kBiasSigmoid = 1 };

// The GEMM progression. Version 3 (register tiles) is the default for large M; version 4 is
// the same kernel with smaller tiles, for the small batches where version 3 leaves SMs idle.
constexpr int kVersions = 4;
constexpr int kDefaultVersion = 0;  // 0: choose by shape (see choose_version)

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Geometry {
  Dim3 grid, block;
};

// Tile shapes; the kernels are instantiated with the same numbers.
template <int Bytes>
struct Tiles;
template <>
struct Tiles<4> {  // float
  static constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;           // version 3
  static constexpr int SBM = 64, SBN = 64, SBK = 16, STM = 4, STN = 4;       // version 4
};
template <>
struct Tiles<8> {  // double: half the tile, the same number of registers
  static constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;
  static constexpr int SBM = 32, SBN = 32, SBK = 16, STM = 2, STN = 2;
};
constexpr int kNaiveBlock = 16;   // version 1: 16×16 threads, one output each
constexpr int kSmemTile = 32;     // version 2: 32×32 threads, one output each, 32×32 tiles

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

inline int choose_version(int64_t M, int64_t N) {
  // Version 3's 128×128 tiles need enough of them to fill the GPU (132 SMs on an H100/H200).
  return (ceil_div(M, 128) * ceil_div(N, 128) >= 132) ? 3 : 4;
}

inline Geometry gemm_geometry(int version, int element_bytes, int64_t M, int64_t N) {
  Geometry g;
  const bool f32 = element_bytes == 4;
  switch (version) {
    case 1:
      g.block = {kNaiveBlock, kNaiveBlock, 1};
      g.grid = {ceil_div(N, kNaiveBlock), ceil_div(M, kNaiveBlock), 1};
      break;
    case 2:
      g.block = {kSmemTile, kSmemTile, 1};
      g.grid = {ceil_div(N, kSmemTile), ceil_div(M, kSmemTile), 1};
      break;
    case 3: {
      const int bm = f32 ? Tiles<4>::BM : Tiles<8>::BM, bn = f32 ? Tiles<4>::BN : Tiles<8>::BN;
      const int tm = f32 ? Tiles<4>::TM : Tiles<8>::TM, tn = f32 ? Tiles<4>::TN : Tiles<8>::TN;
      g.block = {static_cast<unsigned>((bm / tm) * (bn / tn)), 1, 1};
      g.grid = {ceil_div(N, bn), ceil_div(M, bm), 1};
      break;
    }
    default: {
      const int bm = f32 ? Tiles<4>::SBM : Tiles<8>::SBM, bn = f32 ? Tiles<4>::SBN : Tiles<8>::SBN;
      const int tm = f32 ? Tiles<4>::STM : Tiles<8>::STM, tn = f32 ? Tiles<4>::STN : Tiles<8>::STN;
      g.block = {static_cast<unsigned>((bm / tm) * (bn / tn)), 1, 1};
      g.grid = {ceil_div(N, bn), ceil_div(M, bm), 1};
    }
  }
  return g;
}

// "dense_gemm_v3_nt_f32", ...: the extern "C" entry names, the same in the PTX.
inline std::string gemm_name(int version, const char* layout, int element_bytes) {
  return "dense_gemm_v" + std::to_string(version) + "_" + layout + (element_bytes == 4 ? "_f32" : "_f64");
}

// dz = g · y · (1 − y) and db = Σ_rows dz (db may be null). One block of 1024 threads per 32
// columns walks all rows, so each column's sum is made by one block in a fixed order:
// deterministic, no atomics. Parameters: (const T* g, const T* y, T* dz, T* db, int64 rows, int64 cols)
// The _x4 entry (float only) gives each thread 4 adjacent columns; it needs cols % 4 == 0
// and 16-byte aligned pointers (the PTX stage loads those 4 columns as one 128-bit load).
constexpr int kGradCols = 32, kGradThreads = 1024;

inline Geometry sigmoid_grad_geometry(int64_t cols, int cols_per_thread) {
  Geometry g;
  const unsigned x = kGradCols / cols_per_thread;
  g.block = {x, kGradThreads / x, 1};
  g.grid = {ceil_div(cols, kGradCols), 1, 1};
  return g;
}

inline std::string sigmoid_grad_name(int element_bytes, bool x4) {
  return std::string("dense_sigmoid_grad") + (x4 ? "_x4" : "") + (element_bytes == 4 ? "_f32" : "_f64");
}

// Host-side launchers, defined in dense_kernels.cu: the CUDA stage calls these. They return
// a cudaError_t (as int): the launch's own error, from cudaGetLastError.
using Stream = ::CUstream_st*;  // cudaStream_t, without including CUDA's headers

int launch_gemm(int version, const char* layout, int element_bytes, const void* A, const void* B, void* C,
                const void* bias, int64_t M, int64_t N, int64_t K, int epilogue, Stream stream);
int launch_sigmoid_grad(int element_bytes, bool x4, const void* g, const void* y, void* dz, void* db,
                        int64_t rows, int64_t cols, Stream stream);

}  // namespace dense_kernels
