// The cuda stage's translation unit for GEMM version 11 (one unit a version: nvcc compiles them side by side).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/gemm_v11.cu -o /tmp/v11.cubin
#include "../kernels/v11_warptile_template.cuh"
#include "../kernels/entries.cuh"

DENSE_WARP_TYPES(11)
