// The cuda stage's translation unit for tensor-core version 24 (cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v24.cu -o /tmp/v24.cubin
#include "../tensor_cores/v24_pipeline.cuh"
#include "../kernels/entries.cuh"

DENSE_TC16_TYPES(24)
