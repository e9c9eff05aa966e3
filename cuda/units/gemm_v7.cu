// The cuda stage's translation unit for GEMM version 7 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v7.cu -o /tmp/v7.cubin
#include "../kernels/v7_warptile.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(7)
