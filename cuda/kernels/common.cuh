// What every kernel version shares: the sigmoid, operand addressing for the three layouts, the
// fused epilogue, 16-byte vector types. Included by all.cuh.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/elementwise.cu -o /tmp/elementwise.cubin
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#include <cuda_bf16.h>  // __nv_bfloat16 (the emulation defines its own: cuda/emulate/cuda_emu.h)
#include <cuda_fp16.h>  // __half
#endif

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

// Storage types and accumulators: bfloat16 and float16 are converted to float32 as they are
// loaded, added up in float32, and rounded back once, when the result is stored (to nearest,
// ties to even, as torch rounds). torch builds CUDA code with the 16-bit types' implicit
// conversions switched off (-D__CUDA_NO_BFLOAT16_CONVERSIONS__ and the like), so every conversion
// here is a named intrinsic, and the emulation's types have none either.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v);
template <>
__device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half(v); }
template <typename T>
__device__ __forceinline__ T zero() { return from_acc<T>(acc_t<T>(0)); }

template <typename T>
constexpr dense_kernels::DType dtype_of();
template <>
constexpr dense_kernels::DType dtype_of<float>() { return dense_kernels::kF32; }
template <>
constexpr dense_kernels::DType dtype_of<double>() { return dense_kernels::kF64; }
template <>
constexpr dense_kernels::DType dtype_of<__nv_bfloat16>() { return dense_kernels::kBF16; }
template <>
constexpr dense_kernels::DType dtype_of<__half>() { return dense_kernels::kF16; }

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

// The fused epilogue: applied to the accumulator in registers, so z never touches memory. T is the
// storage type of the bias (and of the output the caller rounds the result to).
template <typename T>
__device__ __forceinline__ acc_t<T> epilogue(acc_t<T> acc, const T* bias, int64_t n, int kind) {
  if (kind == dense_kernels::kBiasSigmoid) return sigmoid(bias != nullptr ? acc + to_acc(bias[n]) : acc);
  return acc;
}

// 16-byte vectors: four floats, two doubles, eight bfloat16 or float16.
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
template <>
struct Vec16<__nv_bfloat16> {
  using type = uint4;
  static constexpr int n = 8;
};
template <>
struct Vec16<__half> {
  using type = uint4;
  static constexpr int n = 8;
};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
