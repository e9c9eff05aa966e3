// Every kernel of the CUDA chapter and its extern "C" entry point, in one translation unit: what the
// host compiler builds for the CPU emulation (cuda/emulate/emulate.cpp). nvcc builds the same
// units one by one (cuda/units/, listed in cuda/dense.py), side by side.
#pragma once

#include "../units/gemm_v1.cu"
#include "../units/gemm_v2.cu"
#include "../units/gemm_v3.cu"
#include "../units/gemm_v4.cu"
#include "../units/gemm_v5.cu"
#include "../units/gemm_v6.cu"
#include "../units/gemm_v7.cu"
#include "../units/gemm_v8.cu"
#include "../units/gemm_v9.cu"
#include "../units/gemm_v10.cu"
#include "../units/gemm_v11.cu"
#include "../units/gemm_v12.cu"
#include "../units/tc_v21.cu"
#include "../units/tc_v22.cu"
#include "../units/tc_v23.cu"
#include "../units/tc_v24.cu"
#include "../units/tc_v25.cu"
#include "../units/tc_v26.cu"
#include "../units/tc_v31.cu"
#include "../units/tc_v32.cu"
#include "../units/tc_v33.cu"
#include "../units/tc_v35.cu"
#include "../units/tune.cu"
#include "../units/elementwise.cu"
