// The cuda stage's translation unit for tensor-core version 22 (cuda/tensor_cores/).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tc_v22.cu -o /tmp/v22.cubin
#include "../tensor_cores/v22_v23_ldmatrix.cuh"
#include "../kernels/entries.cuh"

DENSE_TC16_TYPES(22)
