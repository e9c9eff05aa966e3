// The translation unit the PTX stage's PTX is generated from (bash ptx/regen.sh): only the kernels the
// PTX stage carries, so that ptx/dense_kernels.ptx stays short enough to read around its edits.
//   nvcc -ptx -arch=sm_80 -O3 -std=c++17 ptx/lesson_kernels.cu -o ptx/generated/dense_kernels.ptx
// Carried: GEMM v8 and v9 (with split-K's reduction), what version 0 chooses from, in float32 and
// float64; the v1 sigmoid-grad kernels (EDIT-B is in the x4 one). The sigmoid is a real function
// here (DENSE_SIGMOID_CALL), one copy for EDIT-A, at the price of a call per output.
#define DENSE_SIGMOID_CALL
#include "../cuda/units/gemm_v8.cu"
#include "../cuda/units/gemm_v9.cu"

DENSE_REDUCE_ENTRY(float, f32)
DENSE_REDUCE_ENTRY(double, f64)
#include "../cuda/kernels/sigmoid_grad.cuh"
DENSE_GRAD_ENTRY(kGradEntry, 1, dense_sigmoid_grad_v1_f32, (sigmoid_grad_v1<float, 1>), float)
DENSE_GRAD_ENTRY(kGradEntry, 1, dense_sigmoid_grad_v1_f64, (sigmoid_grad_v1<double, 1>), double)
DENSE_GRAD_ENTRY(kGradX4Entry, 1, dense_sigmoid_grad_v1_x4_f32, (sigmoid_grad_v1<float, 4>), float)
