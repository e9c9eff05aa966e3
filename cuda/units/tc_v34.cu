// The cuda stage's translation unit for tensor-core version 34 (Hopper, sm_90a; cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v34.cu -o /tmp/v34.cubin
#include "../tensor_cores/v34_split_tf32_wgmma.cuh"
#include "../kernels/entries.cuh"

DENSE_TMA_F32_TYPES(34)
