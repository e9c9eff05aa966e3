// The cuda stage's translation unit for tensor-core version 32 (Hopper, sm_90a; cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v32.cu -o /tmp/v32.cubin
#include "../tensor_cores/v32_tma.cuh"
#include "../kernels/entries.cuh"

DENSE_TMA16_TYPES(32)
