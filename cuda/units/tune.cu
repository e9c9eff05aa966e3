// The cuda stage's translation unit for the autotuning candidates (dense_kernels.h's
// DENSE_TUNE_CANDIDATES: v11's template at each shape, float32, the three layouts).
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90 -Xptxas -v cuda/units/tune.cu -o /tmp/tune.cubin
#include "../kernels/entries.cuh"
#include "../kernels/v11_warptile_template.cuh"

DENSE_TUNE_CANDIDATES(DENSE_TUNE_LAYOUTS)
