// The cuda stage's translation unit for tensor-core version 26 (cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v26.cu -o /tmp/v26.cubin
#include "../tensor_cores/v25_v26_tf32.cuh"
#include "../kernels/entries.cuh"

DENSE_F32_TYPES(26)
