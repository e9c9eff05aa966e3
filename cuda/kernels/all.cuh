// Every kernel of the CUDA chapter and its extern "C" entry point. nvcc builds this through
// cuda/dense_kernels.cu; the host compiler through cuda/emulate/emulate.cpp (the CPU emulation).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense.cubin
// DENSE_ONLY_PTX_LESSON (ptx/regen.sh) keeps the versions the PTX stage carries: v8, v9 and the
// v1 sigmoid-grad kernels (no autotuning candidates either).
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
#ifndef DENSE_ONLY_PTX_LESSON
#include "v10_padded.cuh"
#include "v11_warptile_template.cuh"
#include "v12_skinny.cuh"
#endif
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

#ifndef DENSE_ONLY_PTX_LESSON
DENSE_GEMM_TYPES(10)

// The warp-tiled versions take their shape as a template argument (dense_kernels::WarpTile), and
// __launch_bounds__ asks for its MINB blocks per SM too: the compiler then keeps the registers
// under 65536 / (MINB · threads).
#define DENSE_WARP_ENTRY(V, LAYOUT, TA, TB, T, SUFFIX)                                                         \
  extern "C" __global__ void __launch_bounds__(dense_kernels::threads(V, sizeof(T)),                          \
                                               dense_kernels::warp_tile(V, sizeof(T)).MINB)                   \
      dense_gemm_v##V##_##LAYOUT##_##SUFFIX(const T* A, const T* B, T* C, const T* bias, int64_t M, int64_t N, \
                                            int64_t K, int epilogue) {                                          \
    gemm_v##V<T, TA, TB, dense_kernels::WarpTileOf<V, sizeof(T)>>(A, B, C, bias, M, N, K, epilogue);          \
  }
#define DENSE_WARP_TYPES(V)                             \
  DENSE_WARP_ENTRY(V, nt, false, true, float, f32)      \
  DENSE_WARP_ENTRY(V, nn, false, false, float, f32)     \
  DENSE_WARP_ENTRY(V, tn, true, false, float, f32)      \
  DENSE_WARP_ENTRY(V, nt, false, true, double, f64)     \
  DENSE_WARP_ENTRY(V, nn, false, false, double, f64)    \
  DENSE_WARP_ENTRY(V, tn, true, false, double, f64)
DENSE_WARP_TYPES(11)
DENSE_WARP_TYPES(12)

// The autotuning candidates: v11's template at each shape of dense_kernels::kTuneCandidates,
// float32, the three layouts.
#define DENSE_TUNE_ENTRY(I, LAYOUT, TA, TB)                                                                     \
  extern "C" __global__ void __launch_bounds__(dense_kernels::warp_threads(dense_kernels::kTuneCandidates[I]),  \
                                               dense_kernels::kTuneCandidates[I].MINB)                          \
      dense_gemm_tune##I##_##LAYOUT##_f32(const float* A, const float* B, float* C, const float* bias, int64_t M, \
                                          int64_t N, int64_t K, int epilogue) {                                   \
    gemm_v11<float, TA, TB, dense_kernels::TuneShape<I>>(A, B, C, bias, M, N, K, epilogue);                     \
  }
#define DENSE_TUNE_LAYOUTS(I)                 \
  DENSE_TUNE_ENTRY(I, nt, false, true)        \
  DENSE_TUNE_ENTRY(I, nn, false, false)       \
  DENSE_TUNE_ENTRY(I, tn, true, false)
DENSE_TUNE_LAYOUTS(0)
DENSE_TUNE_LAYOUTS(1)
DENSE_TUNE_LAYOUTS(2)
DENSE_TUNE_LAYOUTS(3)
DENSE_TUNE_LAYOUTS(4)
DENSE_TUNE_LAYOUTS(5)
DENSE_TUNE_LAYOUTS(6)
DENSE_TUNE_LAYOUTS(7)
static_assert(dense_kernels::kTuneCount == 8, "one DENSE_TUNE_LAYOUTS line per candidate (and a row in launch.cuh)");
#endif

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
