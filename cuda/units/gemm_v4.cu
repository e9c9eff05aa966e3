// The cuda stage's translation unit for GEMM version 4 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v4.cu -o /tmp/v4.cubin
#include "../kernels/v4_blocktile_1d.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(4)
