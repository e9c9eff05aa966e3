// The cuda stage's translation unit for tensor-core version 31 (Hopper, sm_90a; cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v31.cu -o /tmp/v31.cubin
#include "../tensor_cores/v31_wgmma.cuh"
#include "../kernels/entries.cuh"

DENSE_TC16_TYPES(31)
