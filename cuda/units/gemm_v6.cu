// The cuda stage's translation unit for GEMM version 6 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v6.cu -o /tmp/v6.cubin
#include "../kernels/v6_vectorized.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(6)
