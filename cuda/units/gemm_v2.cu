// The cuda stage's translation unit for GEMM version 2 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v2.cu -o /tmp/v2.cubin
#include "../kernels/v2_coalesced.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(2)
