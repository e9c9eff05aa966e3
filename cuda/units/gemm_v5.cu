// The cuda stage's translation unit for GEMM version 5 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v5.cu -o /tmp/v5.cubin
#include "../kernels/v5_blocktile_2d.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(5)
