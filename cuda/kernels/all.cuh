// Every kernel of the CUDA chapter and its extern "C" entry point. nvcc builds this through
// cuda/dense_kernels.cu; the host compiler through cuda/emulate/emulate.cpp (the CPU emulation).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense.cubin
// DENSE_ONLY_PTX_LESSON (ptx/regen.sh) keeps the versions the PTX stage carries: v8, v9 and the
// v1 sigmoid-grad kernels.
#pragma once

#include "common.cuh"
#ifndef DENSE_ONLY_PTX_LESSON
#include "v1_naive.cuh"
#include "v2_coalesced.cuh"
#include "v3_smem.cuh"
#include "v4_blocktile_1d.cuh"
#include "v5_blocktile_2d.cuh"
#include "v6_vectorized.cuh"
#include "v7_warptile.cuh"
#endif
#include "v8_double_buffer.cuh"
#include "v9_splitk.cuh"
#include "sigmoid_grad.cuh"

// __launch_bounds__ tells the compiler the block size, so it can budget registers for it.
#define DENSE_GEMM_ENTRY(V, LAYOUT, TA, TB, T, SUFFIX)                                                         \
  extern "C" __global__ void __launch_bounds__(dense_kernels::threads(V, sizeof(T)))                           \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, \
                                            int64_t K, int epilogue) {                                          \
    gemm_v##V<T, TA, TB>(A, B, C, bias, M, N, K, epilogue);                                                   \
  }
#define DENSE_GEMM_LAYOUTS(V, T, SUFFIX)           \
  DENSE_GEMM_ENTRY(V, nt, false, true, T, SUFFIX)  \
  DENSE_GEMM_ENTRY(V, nn, false, false, T, SUFFIX) \
  DENSE_GEMM_ENTRY(V, tn, true, false, T, SUFFIX)
#define DENSE_GEMM_TYPES(V)           \
  DENSE_GEMM_LAYOUTS(V, float, f32) \
  DENSE_GEMM_LAYOUTS(V, double, f64)

#ifndef DENSE_ONLY_PTX_LESSON
DENSE_GEMM_TYPES(1)
DENSE_GEMM_TYPES(2)
DENSE_GEMM_TYPES(3)
DENSE_GEMM_TYPES(4)
DENSE_GEMM_TYPES(5)
DENSE_GEMM_TYPES(6)
DENSE_GEMM_TYPES(7)
#endif
DENSE_GEMM_TYPES(8)
DENSE_GEMM_TYPES(9)

#define DENSE_REDUCE_ENTRY(T, SUFFIX)                                                                       \
  extern "C" __global__ void __launch_bounds__(dense_kernels::kReduceThreads) dense_splitk_reduce_##SUFFIX( \
      const T* partial, T* C, const T* bias, int64_t M, int64_t N, int slices, int epilogue) {              \
    splitk_reduce<T>(partial, C, bias, M, N, slices, epilogue);                                              \
  }
DENSE_REDUCE_ENTRY(float, f32)
DENSE_REDUCE_ENTRY(double, f64)

#define DENSE_GRAD_ENTRY(NAME, CALL, T)                                                                         \
  extern "C" __global__ void __launch_bounds__(dense_kernels::kGradThreads)                                    \
      NAME(const T* g, const T* y, T* dz, T* db, int64_t rows, int64_t cols) {                                 \
    CALL(g, y, dz, db, rows, cols);                                                                             \
  }
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v1_f32, (sigmoid_grad_v1<float, 1>), float)
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v1_f64, (sigmoid_grad_v1<double, 1>), double)
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v1_x4_f32, (sigmoid_grad_v1<float, 4>), float)
#ifndef DENSE_ONLY_PTX_LESSON
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v2_f32, sigmoid_grad_v2<float>, float)
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v2_f64, sigmoid_grad_v2<double>, double)
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v3_f32, sigmoid_grad_v3<float>, float)
DENSE_GRAD_ENTRY(dense_sigmoid_grad_v3_f64, sigmoid_grad_v3<double>, double)
extern "C" __global__ void __launch_bounds__(dense_kernels::kReduceThreads)
    dense_bias_grad_v3_f32(const float* partial, float* db, int64_t parts, int64_t cols) {
  bias_grad_v3(partial, db, parts, cols);
}
extern "C" __global__ void __launch_bounds__(dense_kernels::kReduceThreads)
    dense_bias_grad_v3_f64(const double* partial, double* db, int64_t parts, int64_t cols) {
  bias_grad_v3(partial, db, parts, cols);
}
#endif
