// What every kernel version shares: the sigmoid, operand addressing for the three layouts, the
// fused epilogue, 16-byte vector types. Included by all.cuh.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/dense_kernels.cu -o /tmp/dense.cubin
#pragma once

#include <cstdint>
#include <cstring>

#include "../dense_kernels.h"

// The sigmoid. Overloads, never expf/fminf on a template type: a float function applied to a
// double silently rounds it to float, and only a float64 gradcheck notices.
// NaN in gives NaN out (exp(NaN) is NaN), as torch.sigmoid does; ±inf gives 0 or 1 (e^-z
// saturates to inf or 0), and so does any finite z however large.
//
// In the CUDA stage it is inlined into each kernel's epilogue. The PTX stage builds with
// -DDENSE_SIGMOID_CALL (ptx/regen.sh): then it is one real function with a C name, a single
// copy in the PTX to hand-edit, at the price of a call per output.
#ifdef DENSE_SIGMOID_CALL
#define DENSE_SIGMOID_LINKAGE __noinline__
#else
#define DENSE_SIGMOID_LINKAGE __forceinline__
#endif
extern "C" __device__ DENSE_SIGMOID_LINKAGE float dense_sigmoid_f32(float z) { return 1.0f / (1.0f + expf(-z)); }
extern "C" __device__ DENSE_SIGMOID_LINKAGE double dense_sigmoid_f64(double z) { return 1.0 / (1.0 + exp(-z)); }

namespace {

__device__ __forceinline__ float sigmoid(float z) { return dense_sigmoid_f32(z); }
__device__ __forceinline__ double sigmoid(double z) { return dense_sigmoid_f64(z); }

// Operand addressing for the three layouts (dense_kernels.h). TA: A is stored K×M; TB: B is
// stored N×K. Indices are int64: M·K may exceed 2³¹ elements.
template <bool TA>
__device__ __forceinline__ int64_t a_index(int64_t m, int64_t k, int64_t M, int64_t K) {
  return TA ? k * M + m : m * K + k;
}
template <bool TB>
__device__ __forceinline__ int64_t b_index(int64_t k, int64_t n, int64_t N, int64_t K) {
  return TB ? n * K + k : k * N + n;
}

// The fused epilogue: applied to the accumulator in registers, so z never touches memory.
template <typename T>
__device__ __forceinline__ T epilogue(T acc, const T* bias, int64_t n, int kind) {
  if (kind == dense_kernels::kBiasSigmoid) return sigmoid(bias != nullptr ? acc + bias[n] : acc);
  return acc;
}

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

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
