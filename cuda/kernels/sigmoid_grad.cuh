// The backward's elementwise kernel, dz = g · y · (1 − y) and db = Σ_rows dz, in three versions
// (llm.c's matmul_backward_bias progression, for our layout). Every version adds in a fixed
// order: the bias gradient is the same bit for bit on every run (tests/test_emulate.py).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/elementwise.cu -o /tmp/elementwise.cubin
#pragma once

#include "common.cuh"

namespace {

constexpr int kGradCols = dense_kernels::kGradCols;

// dz for CPT adjacent columns of the rows lane, lane + stride, ...; returns the columns' sums.
// (CPT > 1 needs cols % CPT == 0: then a group that starts inside a row ends inside it.) The
// arithmetic and the sums are in the accumulator's type (float32 for 16-bit T); dz is rounded to T
// as it is stored, the sums are not.
template <typename T, int CPT>
__device__ __forceinline__ void dz_rows(const T* g, const T* y, T* dz, int64_t rows, int64_t cols, int64_t c0,
                                        int64_t first_row, int64_t stride, acc_t<T> (&sum)[CPT]) {
  using Acc = acc_t<T>;
#pragma unroll
  for (int j = 0; j < CPT; ++j) sum[j] = Acc(0);
  if (c0 >= cols) return;
  for (int64_t r = first_row; r < rows; r += stride) {
    const int64_t at = r * cols + c0;
    // CPT adjacent columns, CPT scalar loads: the compiler cannot prove 16-byte alignment, so it
    // will not fuse them. The PTX stage does (ld.global.v4.f32, EDIT-B in ptx/dense_kernels.ptx).
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const Acc yv = to_acc(y[at + j]);
      const Acc d = to_acc(g[at + j]) * yv * (Acc(1) - yv);
      dz[at + j] = from_acc<T>(d);
      sum[j] += d;
    }
  }
}

// v1: a block owns 32 columns and walks every row with 1024 / (32 / CPT) row lanes; the lanes'
// partial sums meet in shared memory and one thread per column adds them, in lane order.
template <typename T, int CPT>
__device__ void sigmoid_grad_v1(const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols) {
  using Acc = acc_t<T>;
  constexpr int kLanes = dense_kernels::kGradThreads / (kGradCols / CPT);
  __shared__ Acc partial[kLanes][kGradCols];
  const int lane = threadIdx.y;
  const int64_t c0 = int64_t(blockIdx.x) * kGradCols + int64_t(threadIdx.x) * CPT;
  Acc sum[CPT];
  dz_rows<T, CPT>(g, y, dz, rows, cols, c0, lane, kLanes, sum);
  // region grad-v1
#pragma unroll
  for (int j = 0; j < CPT; ++j) partial[lane][threadIdx.x * CPT + j] = sum[j];
  __syncthreads();
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t c = int64_t(blockIdx.x) * kGradCols + t;
  if (db != nullptr && t < kGradCols && c < cols) {
    Acc total = 0;
    for (int l = 0; l < kLanes; ++l) total += partial[l][t];  // 32 (or 128) adds in a row, one thread
    db[c] = from_acc<T>(total);
  }
  // endregion
}

// region grad-v2
// Σ of the 32 lanes' values with a shuffle tree: 5 steps, the same pairing every run.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// v2: as v1 (32×32 threads), but the 32 partial sums of a column are added by a warp: warp w
// (the threads with threadIdx.y = w) reads column w of `partial`, one lane per row lane, and
// reduces with shuffles. Reading a column is where padding matters: with 33 words per row the
// 32 lanes hit 32 different banks (without it all 32 would queue on one). Out is the bias gradient's type, or the
// accumulator's for v3's partial sums.
template <typename Acc, typename Out>
__device__ __forceinline__ void column_sums_v2(Acc (&partial)[32][kGradCols + 1], Out* out, int64_t cols) {
  const int w = threadIdx.y, l = threadIdx.x;
  const Acc total = warp_sum(partial[l][w]);  // every lane of every warp takes part
  const int64_t c = int64_t(blockIdx.x) * kGradCols + w;
  if (l == 0 && out != nullptr && c < cols) out[c] = from_acc<Out>(total);
}
// endregion

template <typename T>
__device__ void sigmoid_grad_v2(const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols) {
  using Acc = acc_t<T>;
  __shared__ Acc partial[32][kGradCols + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kGradCols + threadIdx.x;
  Acc sum[1];
  dz_rows<T, 1>(g, y, dz, rows, cols, c0, threadIdx.y, 32, sum);
  partial[threadIdx.y][threadIdx.x] = sum[0];
  __syncthreads();
  column_sums_v2(partial, db, cols);
}

// v3: v1 and v2 give each group of 32 columns one block, which walks all the rows: with 64
// output columns that is 2 blocks on a GPU of 132 SMs. Here gridDim.y blocks share the rows of a
// column group (chosen from the SM count, dense_kernels::grad_row_blocks); block y writes its
// column sums to row y of a workspace `partial` (gridDim.y × cols), and dense_bias_grad_v3 adds
// those rows in order: a deterministic second pass instead of atomics. With one block per group
// the sums go straight to db; with more, `out` is the launcher's workspace of partial sums in the
// accumulator's type (float32 for 16-bit T: rounding them before the second pass would round twice).
template <typename T>
__device__ void sigmoid_grad_v3(const T* g, const T* y, T* dz, T* out, int64_t rows, int64_t cols) {
  using Acc = acc_t<T>;
  __shared__ Acc partial[32][kGradCols + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kGradCols + threadIdx.x;
  Acc sum[1];
  // region grad-v3
  dz_rows<T, 1>(g, y, dz, rows, cols, c0, int64_t(blockIdx.y) * 32 + threadIdx.y, int64_t(gridDim.y) * 32, sum);
  partial[threadIdx.y][threadIdx.x] = sum[0];
  __syncthreads();
  if (gridDim.y == 1) column_sums_v2(partial, out, cols);
  else column_sums_v2(partial, out != nullptr ? reinterpret_cast<Acc*>(out) + int64_t(blockIdx.y) * cols : nullptr, cols);
  // endregion
}

template <typename T>
__device__ void bias_grad_v3(const acc_t<T>* partial, T* db, int64_t parts, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  acc_t<T> total = 0;
  for (int64_t p = 0; p < parts; ++p) total += partial[p * cols + c];
  db[c] = from_acc<T>(total);
}

}  // namespace
