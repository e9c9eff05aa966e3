// The cuda stage's translation unit for GEMM version 12 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v12.cu -o /tmp/v12.cubin
#include "../kernels/v12_skinny.cuh"
#include "../kernels/entries.cuh"

DENSE_WARP_TYPES(12)
