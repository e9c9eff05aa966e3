//   pytest tests/test_tc_accumulation.py   (held against cuda/tensor_cores/accumulation_vectors.py)
// How a tensor core adds one instruction's products to its accumulator: D = C + Σ a_k·b_k over one
// block of K products (mma.sync m16n8k16 and wgmma m64nNk16: 16 bfloat16 or float16 products;
// m16n8k8 and m64nNk8 tf32: 8), float32 accumulator. Two models, chosen at run time:
//
// - kAccumulateExact (the default): C and the products (each exact in double) added in double in k
//   order and rounded once to float32, to nearest. For the operands of these formats the double sum
//   is exact unless the terms span more than double's 53 bits.
// - kAccumulateH100: the published model of the H100's tensor cores (below). It stays opt-in until a
//   GPU has confirmed it bit for bit (cuda/tensor_cores/accumulation_vectors.py --gpu runs the
//   vectors through mma.sync and wgmma on one); no GPU has run it yet.
//
// Chosen by emu_set_accumulation(int) (cuda/emulate/emulate.cpp), or at load by the environment:
// CUDA_EMU_TC_ACCUMULATION=h100 (anything else, or unset: exact).
//
// What the sources say, and what this model takes from them:
// - Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores" (PeerJ CS 2021;
//   V100, T4, A100; their test suite's README, github.com/north-numerical-computing/
//   tensor-cores-numerical-behavior): products of binary16 numbers are computed exactly; the tensor
//   cores "accumulate partial sums on the largest element in absolute value"; they "use round-down
//   for positive values" and "round-up for negative values" (toward zero); they "do not implement
//   guard digits" (A100 and earlier), "do not normalize" within the sum, and "implement two carry-out
//   digits". No H100 there.
// - Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores" (arXiv 2512.07004, 2025): models
//   bit-accurate against V100, A100, H100 and B200, found with test vectors for "rounding behaviour,
//   accumulator width, normalization points, extra carry bits". The paper's text past its abstract
//   was not reachable from here; its parameters were read from the authors' models
//   (github.com/north-numerical-computing/MATLAB-tensor-core, models/H100TC.m on top of
//   models/tools/Generic_BFMA_TC.m; read, not copied). For the H100, float32 output:
//     "def_params.fma  = 16;  % Number of products in one FMA group" (bfloat16, float16),
//     "def_params.fma=8;" for tf32;
//     "def_params.neab = 2;   % Number of extra alignment bits (guard precision)";
//     "def_params.frmode = 'rz';  % Final rounding mode" (round toward zero; 'rne' only for a
//       float16 output, which these kernels do not use);
//     "def_params.global_alignment  = 1;  % Align all products (and optionally c) to a common exponent",
//     "def_params.late_partial_sum  = 0;  % Add accumulation term 'c' after product summation" (off:
//       C is aligned and added inside the block, as one more term);
//     "def_params.stkbitenabled  = 0;" (no sticky bit: what is shifted out is lost);
//     in_subnormals = out_subnormals = 1 (subnormals kept on input and produced on output).
//   Their generic block FMA aligns each product by the exponent sum of its operands (a subnormal
//   operand counting as the format's smallest exponent) with its 2-bit significand product, and C
//   by its own exponent; the largest of these, M, fixes the grid: 23 + 2 bits below M's leading
//   bit, i.e. units of 2^(M-25). Each term's magnitude is cut to that grid (truncation toward
//   zero), the cut terms are added exactly (no normalisation inside the block: the carries are
//   kept), and the sum is normalised once and cut to float32 (toward zero; subnormal if small).
//   (So the block takes the operand pairs, not only their products: 1.5·1.5 and 1·2.25 are the
//   same product, aligned by exponent 0 and 1.)
// What the sources do not pin, and what is chosen here:
// - The authors' C version of the same model (models/tools/C/src/block_fma_nv.c) takes M from the
//   products' normalised exponents instead, which cuts one bit more when the largest product's
//   significand product is 2 or more. The MATLAB model, which its README calls the parameterised
//   model all GPU models are built on, is followed; accumulation_vectors.json has a vector that
//   tells the two apart (bf16 "product significand ≥ 2"), for a GPU to decide.
// - A sum of exactly zero is +0 (as their model returns it); a block with a NaN or an infinity
//   among C and the products gives what IEEE arithmetic gives (NaN, or the infinity); a result past
//   float32's range is an infinity (their model's encoding). Their min_exp_limit (-133: a floor on
//   products' alignment exponents) is not modelled: products far below float32's subnormals.
// - Each instruction here is one block (K = 16 or 8 is the block's width), so a GEMM's k-steps
//   chain blocks through the float32 accumulator, as their GEMM model does.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace emu {

enum Accumulation : int { kAccumulateExact = 0, kAccumulateH100 = 1, kAccumulationModels };
// The operands' format: it sets the exponent a subnormal operand is aligned by.
enum TcFormat : int { kTcBf16 = 0, kTcF16 = 1, kTcTf32 = 2 };

inline int accumulation_from_environment() {
  const char* v = std::getenv("CUDA_EMU_TC_ACCUMULATION");
  return v != nullptr && std::strcmp(v, "h100") == 0 ? kAccumulateH100 : kAccumulateExact;
}
// The model mma and wgmma use. Set between launches (emu_set_accumulation), never during one.
inline int tc_accumulation = accumulation_from_environment();

// C + Σ a_k·b_k in double, in k order, rounded once to float32 (to nearest).
inline float tc_block_exact(float c, const double* a, const double* b, int n) {
  double s = c;
  for (int k = 0; k < n; ++k) s += a[k] * b[k];
  return float(s);
}

// The exponent of |v|'s leading bit; a subnormal's is its format's smallest (emin).
inline int tc_exponent(double v, int emin) {
  int e = 0;
  std::frexp(v, &e);  // v = f·2^e, 0.5 ≤ |f| < 1
  return std::max(e - 1, emin);
}

constexpr int kTcKeptBits = 23 + 2;  // float32's fraction bits and the H100's 2 extra alignment bits

// The H100's block FMA (the model above): the terms cut to units of 2^(M-25), added exactly, the
// sum cut to float32.
inline float tc_block_h100(float c, const double* a, const double* b, int n, int format) {
  bool finite = std::isfinite(c);
  for (int k = 0; k < n; ++k) finite = finite && std::isfinite(a[k] * b[k]);
  if (!finite) return tc_block_exact(c, a, b, n);  // NaN and infinities as IEEE arithmetic has them
  const int emin = format == kTcF16 ? -14 : -126;  // float16's; bfloat16 and tf32 have float32's
  int M = INT_MIN;
  if (c != 0) M = tc_exponent(c, -126);
  for (int k = 0; k < n; ++k)
    if (a[k] != 0 && b[k] != 0) M = std::max(M, tc_exponent(a[k], emin) + tc_exponent(b[k], emin));
  if (M == INT_MIN) return 0.0f;  // C and every product zero
  const int unit = M - kTcKeptBits;  // the grid: multiples of 2^unit
  // Each term below 2^(M+2) (a significand product under 4), so below 2^27 units: 17 fit in 32 bits.
  int64_t sum = 0;
  auto add = [&](double v) {
    const auto units = int64_t(std::floor(std::ldexp(std::fabs(v), -unit)));  // cut toward zero
    sum += v < 0 ? -units : units;
  };
  add(c);
  for (int k = 0; k < n; ++k) add(a[k] * b[k]);
  if (sum == 0) return 0.0f;
  uint64_t mag = uint64_t(sum < 0 ? -sum : sum);
  const int top = unit + 63 - __builtin_clzll(mag);  // the exponent of the sum's leading bit
  const int last = std::max(top - 23, -149);         // float32's last bit there (subnormals: 2^-149)
  const int drop = last - unit;
  if (drop >= 64) mag = 0;
  else if (drop > 0) mag = (mag >> drop) << drop;  // cut toward zero
  const float r = float(std::ldexp(double(mag), unit));  // exact, or past float32's range: inf
  return sum < 0 ? -r : r;
}

// The block as the selected model has it; `format` a TcFormat.
inline float tc_block(float c, const double* a, const double* b, int n, int format) {
  return tc_accumulation == kAccumulateH100 ? tc_block_h100(c, a, b, n, format) : tc_block_exact(c, a, b, n);
}

}  // namespace emu
