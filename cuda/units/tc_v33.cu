// The cuda stage's translation unit for tensor-core version 33 (Hopper, sm_90a; cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v33.cu -o /tmp/v33.cubin
#include "../tensor_cores/v33_warp_specialized.cuh"
#include "../kernels/entries.cuh"

DENSE_TMA16_TYPES(33)
