// The cuda stage's translation unit for GEMM version 10 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v10.cu -o /tmp/v10.cubin
#include "../kernels/v10_padded.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(10)
