// The cuda stage's translation unit for the kernels around the GEMMs: split-K's reduction (v9,
// v12) and the backward's elementwise kernels (sigmoid_grad.cuh), in every element type.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/elementwise.cu -o /tmp/elementwise.cubin
#include "../kernels/entries.cuh"
#include "../kernels/sigmoid_grad.cuh"
#include "../kernels/v9_splitk.cuh"

DENSE_REDUCE_ENTRY(float, f32)
DENSE_REDUCE_ENTRY(double, f64)
DENSE_REDUCE_ENTRY(__nv_bfloat16, bf16)
DENSE_REDUCE_ENTRY(__half, f16)

#define DENSE_GRAD_TYPES(T, SUFFIX)                                                                         \
  DENSE_GRAD_ENTRY(kGradEntry, 1, dense_sigmoid_grad_v1_##SUFFIX, (sigmoid_grad_v1<T, 1>), T)               \
  DENSE_GRAD_ENTRY(kGradEntry, 2, dense_sigmoid_grad_v2_##SUFFIX, sigmoid_grad_v2<T>, T)                    \
  DENSE_GRAD_ENTRY(kGradEntry, 3, dense_sigmoid_grad_v3_##SUFFIX, sigmoid_grad_v3<T>, T)                    \
  DENSE_BIAS_GRAD_ENTRY(T, SUFFIX)
DENSE_GRAD_TYPES(float, f32)
DENSE_GRAD_TYPES(double, f64)
DENSE_GRAD_TYPES(__nv_bfloat16, bf16)
DENSE_GRAD_TYPES(__half, f16)
// v1 with 4 adjacent columns a thread (float32; chapter 4's EDIT-B makes its loads 128-bit)
DENSE_GRAD_ENTRY(kGradX4Entry, 1, dense_sigmoid_grad_v1_x4_f32, (sigmoid_grad_v1<float, 4>), float)
