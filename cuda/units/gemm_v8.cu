// The cuda stage's translation unit for GEMM version 8 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v8.cu -o /tmp/v8.cubin
#include "../kernels/v8_double_buffer.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(8)
