// The cuda stage's translation unit for tensor-core version 35 (Hopper, sm_90a; cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v35.cu -o /tmp/v35.cubin
#include "../tensor_cores/v35_small_batch.cuh"
#include "../kernels/entries.cuh"

DENSE_TMA16_TYPES(35)
