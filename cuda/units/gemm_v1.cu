// The cuda stage's translation unit for GEMM version 1 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v1.cu -o /tmp/v1.cubin
#include "../kernels/v1_naive.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(1)
