// The cuda stage's translation unit for GEMM version 9 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v9.cu -o /tmp/v9.cubin
#include "../kernels/v9_splitk.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(9)
