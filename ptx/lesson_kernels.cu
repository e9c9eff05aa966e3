// The translation unit the PTX stage's PTX is generated from (bash ptx/regen.sh): only the kernels the
// PTX stage carries, so that ptx/dense_kernels.ptx stays short enough to read around its edits.
//   nvcc -ptx -arch=sm_80 -O3 -std=c++17 ptx/lesson_kernels.cu -o ptx/generated/dense_kernels.ptx
// Carried: GEMM v8 and v9 (with split-K's reduction), what version 0 chooses from; the v1
// sigmoid-grad kernels (EDIT-B is in the x4 one). The sigmoid is a real function here
// (DENSE_SIGMOID_CALL), one copy for EDIT-A, at the price of a call per output.
#define DENSE_ONLY_PTX_LESSON
#define DENSE_SIGMOID_CALL
#include "../cuda/kernels/all.cuh"
