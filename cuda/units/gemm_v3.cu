// The cuda stage's translation unit for GEMM version 3 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v3.cu -o /tmp/v3.cubin
#include "../kernels/v3_smem.cuh"
#include "../kernels/entries.cuh"

DENSE_GEMM_TYPES(3)
