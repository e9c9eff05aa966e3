//   pytest tests/test_instructions.py   (held against separate encodings of the PTX ISA's tables)
// The warp-wide matrix instructions of the tensor-core kernels, modelled on the CPU: mma.sync
// (bfloat16/float16 m16n8k16 and tf32 m16n8k8, float32 accumulators), ldmatrix (x1, x2, x4,
// .trans) and cvt.rna.tf32.f32. Included by cuda_emu.h; the kernels reach these through
// cuda/kernels/instructions.cuh, which on a GPU is inline PTX instead.
//
// A warp-collective instruction is executed by all 32 lanes together: each lane hands in its own
// registers, the warp meets at its barrier (as the shuffles do), and each lane takes its own
// result, computed from every lane's registers. Which register of which lane holds which element
// of a matrix is the PTX ISA's "matrix fragment" tables; they are written here once, as
// functions of (lane, element), and tests/test_instructions.py holds them against an encoding of
// the same tables written separately (a kernel that agreed with a wrong table here would prove
// nothing). With -DCUDA_EMU_PLANT_FRAGMENT=1 one table is deliberately wrong, to show those tests
// catch it.
//
// Arithmetic of mma: the products of bfloat16, float16 or tf32 operands are exact in float32's
// precision; each output is one block C + Σ A·B of K products, summed as tc_accumulate.h's
// selected model has it: by default in double and rounded once to float32; or as the published
// H100 model (products aligned to the largest exponent with 2 extra bits, cut toward zero, the sum
// cut to float32). NVIDIA does not document it; on integer-valued inputs, where every sum is
// exact, both models and a GPU agree bit for bit.
#pragma once

#include "tc_accumulate.h"

namespace emu {

// Position of an element in its matrix.
struct RowCol {
  int row, col;
};

// ---------------------------------------------------------------------------------------------
// The fragment tables (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "... mma.m16n8k8 ... .tf32"). g = lane / 4 is the lane's group, t = lane % 4 its place in it.
// ---------------------------------------------------------------------------------------------
// m16n8k16, A (16×16, row-major fragments): 8 elements a0..a7 in 4 registers (2 each, the lower
// index in the lower 16 bits).
inline RowCol frag_m16n8k16_a(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
#if CUDA_EMU_PLANT_FRAGMENT == 1
  return {g + 8 * (i >> 2), 2 * t + (i & 1) + 8 * ((i >> 1) & 1)};  // planted: the row and column halves swapped
#else
  return {g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)};
#endif
}
// m16n8k16, B (16×8, "col": k down, n across): 4 elements b0..b3 in 2 registers.
inline RowCol frag_m16n8k16_b(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {2 * t + (i & 1) + 8 * (i >> 1), g};
}
// m16n8kK, C and D (16×8, float32): 4 elements c0..c3, one a register.
inline RowCol frag_m16n8_c(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (i >> 1), 2 * t + (i & 1)};
}
// m16n8k8 tf32, A (16×8): 4 elements, one a register.
inline RowCol frag_m16n8k8_tf32_a(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (i & 1), t + 4 * (i >> 1)};
}
// m16n8k8 tf32, B (8×8): 2 elements, one a register.
inline RowCol frag_m16n8k8_tf32_b(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {t + 4 * i, g};
}

// ---------------------------------------------------------------------------------------------
// Warp-collective plumbing: every lane's input in the warp's wide slots, one barrier, each lane
// computes its output from all of them, one more barrier before the slots are reused.
// ---------------------------------------------------------------------------------------------
inline void require_full_warp(const char* what) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  if ((warp_id + 1) * 32 > threads) {
    std::fprintf(stderr, "cuda_emu: %s needs all 32 lanes of a warp, but warp %u of this %u-thread block has %u\n",
                 what, warp_id, threads, threads - warp_id * 32);
    std::abort();
  }
}

template <typename In, typename Out, typename Compute>
Out warp_collective(const char* what, const In& in, Compute&& compute) {
  static_assert(sizeof(In) <= sizeof(Warp::wide[0]), "a lane's operands are wider than the warp's slots");
  require_full_warp(what);
  Warp& w = current_block->warps[warp_id];
  std::memcpy(w.wide[lane_id], &in, sizeof(In));
  w.barrier.wait();
  In all[32];
  for (int l = 0; l < 32; ++l) std::memcpy(&all[l], w.wide[l], sizeof(In));
  const Out out = compute(all, int(lane_id));
  w.barrier.wait();  // nobody writes a slot again before every lane has read them all
  return out;
}

inline float bf16_bits_to_float(uint16_t b) { return emu_bits_to_float(uint32_t(b) << 16); }
inline float f16_bits_to_float(uint16_t b) { return __half2float(__half{b}); }
inline uint16_t half_of(uint32_t reg, int which) { return uint16_t(which ? reg >> 16 : reg & 0xffffu); }

struct Array4 {
  float v[4];
};

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32  d, a, b, c
// ---------------------------------------------------------------------------------------------
struct MmaIn {
  uint32_t a[4], b[2];
  float c[4];
};

template <bool Bf16>
inline Array4 mma_m16n8k16(const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  MmaIn in;
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, c, sizeof(in.c));
  return warp_collective<MmaIn, Array4>("mma.sync.m16n8k16", in, [](const MmaIn* all, int lane) {
    double A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 8; ++i) {
        const RowCol p = frag_m16n8k16_a(l, i);
        const uint16_t bits = half_of(all[l].a[i / 2], i % 2);
        A[p.row][p.col] = Bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
      }
      for (int i = 0; i < 4; ++i) {
        const RowCol p = frag_m16n8k16_b(l, i);
        const uint16_t bits = half_of(all[l].b[i / 2], i % 2);
        B[p.row][p.col] = Bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
      }
      for (int i = 0; i < 4; ++i) {
        const RowCol p = frag_m16n8_c(l, i);
        C[p.row][p.col] = all[l].c[i];
      }
    }
    Array4 d;
    for (int i = 0; i < 4; ++i) {
      const RowCol p = frag_m16n8_c(lane, i);
      double b[16];
      for (int k = 0; k < 16; ++k) b[k] = B[k][p.col];
      d.v[i] = tc_block(float(C[p.row][p.col]), A[p.row], b, 16, Bf16 ? kTcBf16 : kTcF16);
    }
    return d;
  });
}

// ---------------------------------------------------------------------------------------------
// cvt.rna.tf32.f32: float32 to tf32 (float32's 8-bit exponent, 10 bits of mantissa), rounded to
// nearest with ties away from zero; the result is a float32 pattern whose low 13 bits are zero.
// NaN stays NaN (the canonical 0x7FFFFFFF), ±inf stays, and a value that rounds past the largest
// finite one becomes ±inf.
// ---------------------------------------------------------------------------------------------
inline uint32_t cvt_rna_tf32(float x) {
  const uint32_t u = emu_float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffffffu;
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // ±inf
  // Adding half of the dropped part's unit (bit 12) to the magnitude rounds ties away from zero;
  // a carry runs into the exponent, and past the largest finite value to inf.
  return (u + 0x1000u) & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32  d, a, b, c: the tensor cores read only the
// tf32 bits of each operand register (the low 13 bits are ignored).
inline Array4 mma_m16n8k8_tf32(const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  MmaIn in{};
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, c, sizeof(in.c));
  return warp_collective<MmaIn, Array4>("mma.sync.m16n8k8.tf32", in, [](const MmaIn* all, int lane) {
    double A[16][8], B[8][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 4; ++i) {
        const RowCol p = frag_m16n8k8_tf32_a(l, i);
        A[p.row][p.col] = emu_bits_to_float(all[l].a[i] & 0xffffe000u);
      }
      for (int i = 0; i < 2; ++i) {
        const RowCol p = frag_m16n8k8_tf32_b(l, i);
        B[p.row][p.col] = emu_bits_to_float(all[l].b[i] & 0xffffe000u);
      }
      for (int i = 0; i < 4; ++i) {
        const RowCol p = frag_m16n8_c(l, i);
        C[p.row][p.col] = all[l].c[i];
      }
    }
    Array4 d;
    for (int i = 0; i < 4; ++i) {
      const RowCol p = frag_m16n8_c(lane, i);
      double b[8];
      for (int k = 0; k < 8; ++k) b[k] = B[k][p.col];
      d.v[i] = tc_block(float(C[p.row][p.col]), A[p.row], b, 8, kTcTf32);
    }
    return d;
  });
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16  d, [p]: N 8×8 matrices of 16-bit
// elements, each row 16 contiguous bytes of shared memory at an address one lane gives (rows of
// matrix j: lanes 8j to 8j+7). Lane l receives, for each matrix j, one register holding row l/4,
// columns 2(l%4) and 2(l%4)+1 (the lower column in the lower 16 bits); with .trans the matrix is
// transposed first: row 2(l%4) and 2(l%4)+1, column l/4. (The PTX ISA's "ldmatrix" section.)
// ---------------------------------------------------------------------------------------------
struct Regs4 {
  uint32_t r[4];
};

// The element of matrix `j` that register j of `lane` takes, half `h` (0: lower 16 bits).
inline RowCol ldmatrix_element(int lane, int h, bool trans) {
#if CUDA_EMU_PLANT_FRAGMENT == 2
  trans = !trans;  // planted: .trans ignored (or applied where it was not asked for)
#endif
  const int row = lane / 4, col = 2 * (lane % 4) + h;
  return trans ? RowCol{col, row} : RowCol{row, col};
}

#if defined(CUDA_EMU_COUNT)
// The counters' hook for one ldmatrix (the lanes' row addresses): a weak no-op here, which
// cuda/emulate/counters.cpp replaces where it counts them.
__attribute__((weak)) void count_ldmatrix(const void* const* rows, int matrices) {
  (void)rows;
  (void)matrices;
}
#endif

// The bytes a lane reads on behalf of the warp: not instrumented in the counting build, which
// counts the instruction's rows where it is issued (count_ldmatrix), as the hardware reads them.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((no_sanitize_address, noinline))
#endif
inline uint16_t read_b16(const void* row, int col) {
  uint16_t v;
  std::memcpy(&v, static_cast<const unsigned char*>(row) + 2 * col, 2);
  return v;
}

template <int N, bool Trans>
inline Regs4 ldmatrix(const void* row_address) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  if (lane_id < 8 * N && reinterpret_cast<uintptr_t>(row_address) % 16 != 0) {
    std::fprintf(stderr, "cuda_emu: ldmatrix: lane %u's row address %p is not 16-byte aligned\n", lane_id, row_address);
    std::abort();
  }
  struct In {
    const void* row;
  };
  return warp_collective<In, Regs4>("ldmatrix", In{row_address}, [](const In* all, int lane) {
#if defined(CUDA_EMU_COUNT)
    if (lane == 0) {
      const void* rows[32];
      for (int l = 0; l < 8 * N; ++l) rows[l] = all[l].row;
      count_ldmatrix(rows, N);
    }
#endif
    Regs4 out{};
    for (int j = 0; j < N; ++j)
      for (int h = 0; h < 2; ++h) {
        const RowCol e = ldmatrix_element(lane, h, Trans);
        const uint16_t v = read_b16(all[8 * j + e.row].row, e.col);
        out.r[j] |= uint32_t(v) << (16 * h);
      }
    return out;
  });
}

}  // namespace emu
