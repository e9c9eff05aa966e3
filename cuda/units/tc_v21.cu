// The cuda stage's translation unit for tensor-core version 21 (cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v21.cu -o /tmp/v21.cubin
#include "../tensor_cores/v21_mma.cuh"
#include "../kernels/entries.cuh"

DENSE_TC16_TYPES(21)
