// Chapter 2: the Dense layer in ATen C++, registered as the ops dense_cpp::forward/backward.
//
// Build and check:  python grad_check.py cpp          (JIT build, cached in build/jit/)
// Ahead of time:    pip install --no-build-isolation .
// ATen's SIMD wrapper picks its instruction set from these macros, set where torch's own
// kernels are compiled; here they follow what the compiler was told (-march=native).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#define CPU_CAPABILITY AVX2
#endif

#include "dense_common.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

namespace {

struct CppStage {
  static constexpr const char* name = "cpp";  // the ops are dense_cpp::forward/backward
};

// The least rows a thread takes in an at::parallel_for over rows of `cols` elements: about 16K
// elements each, or waking the second thread costs more than it saves.
inline int64_t grain_rows(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// bfloat16 and float16 are storage types: every pass loads them into float vectors, computes
// and accumulates in float, and rounds once, where it stores, as ATen's own kernels for these
// types do. acc_t is the type the arithmetic runs in: float for the 16-bit types, the
// element type itself for float and double. AccVec holds as many acc_t lanes as one vector of
// the element type (two float vectors for one of bfloat16), so that each step loads and stores
// whole vectors of the element type: storing half a vector is a masked store of a whole one,
// and the next step's load, which reads the other half, would wait for it to complete.
template <typename scalar_t>
using acc_t = at::opmath_type<scalar_t>;
template <typename scalar_t>
using AccVec = at::vec::VectorizedN<acc_t<scalar_t>, at::vec::Vectorized<scalar_t>::size() /
                                                         at::vec::Vectorized<acc_t<scalar_t>>::size()>;
template <typename scalar_t>
constexpr bool kStorageOnly = at::vec::is_reduced_floating_point_v<scalar_t>;

// n elements from p (n at most AccVec::size()), as acc_t; lanes past n hold no data.
template <typename scalar_t>
inline AccVec<scalar_t> load(const scalar_t* p, int64_t n) {
  if constexpr (kStorageOnly<scalar_t>) {
    auto [lo, hi] = at::vec::convert_to_float<scalar_t>(at::vec::Vectorized<scalar_t>::loadu(p, n));
    return AccVec<scalar_t>(lo, hi);
  } else {
    return AccVec<scalar_t>::loadu(p, n);
  }
}

// The first n lanes of v to p, rounded to scalar_t (to nearest even; NaN stays NaN).
template <typename scalar_t>
inline void store(const AccVec<scalar_t>& v, scalar_t* p, int64_t n) {
  if constexpr (kStorageOnly<scalar_t>) {
    at::vec::convert_from_float<scalar_t>(v[0], v[1]).store(p, n);
  } else {
    v.store(p, n);
  }
}

// Calls body(i, k) for the chunks of one Vec each that cover 0 to n: the full-width ones in a
// loop of their own, then the tail (k < V; only k lanes are loaded and stored).
// After inlining, the full chunks' loads and stores have a constant width.
template <int64_t V, typename Body>
inline void for_each_chunk(int64_t n, const Body& body) {
  int64_t i = 0;
  for (; i + V <= n; i += V) body(i, V);
  if (i < n) body(i, n - i);
}

// y = sigmoid(z + b), in place over z, in one pass. ATen's way is two (addmm's bias
// epilogue, then sigmoid), and addmm even pre-fills its output with the broadcast bias.
// at::vec::Vectorized is ATen's own SIMD wrapper. exp_u20 is its inline polynomial exp
// (at most 20 ulp for float; plain exp for double), much cheaper than a call into Sleef.
// load() and store() widen bfloat16 and float16 to float and round back (acc_t, above).
// region bias-sigmoid
template <typename scalar_t>
void bias_sigmoid_(scalar_t* z, const scalar_t* b, int64_t rows, int64_t cols) {
  using Vec = AccVec<scalar_t>;
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t r0, int64_t r1) {
    const Vec one(1);
    for (int64_t r = r0; r < r1; ++r) {
      scalar_t* zr = z + r * cols;
      for_each_chunk<Vec::size()>(cols, [&](int64_t c, int64_t n) {
        Vec v = load(zr + c, n);
        if (b != nullptr) v = v + load(b + c, n);
        // exp_u20 clamps its argument to a finite range first, and a clamp turns NaN into a
        // number: sigmoid(NaN) would come out finite. Where v is NaN (v != v), keep v.
        // ±inf need nothing: e^-v saturates to 0 or to a huge value, and y to 1 or 0.
        const Vec y = one / (one + v.neg().exp_u20());
        store(Vec::blendv(y, v, v.isnan()), zr + c, n);
      });
    }
  });
}
// endregion

// Rows per block of the blocked paths: a block of z or dz of about 256 KiB, which stays in
// cache between the GEMM that writes it and the pass that reads it (or the other way round).
inline int64_t block_rows(int64_t cols, int64_t element_size) {
  return std::max<int64_t>(32, (256 << 10) / std::max<int64_t>(1, cols * element_size));
}

// Blocking costs one GEMM call per block (a few µs each) and smaller GEMMs; it pays where
// the GEMMs are cheap next to the memory traffic of z and dz: few input features, many rows.
// Not in bfloat16 and float16: the backward's dW, a sum over the blocks, would be rounded once
// per block by 16-bit GEMMs, or need float32 GEMMs on widened copies of the blocks, slower than
// the 16-bit ones; the plain path computes it in one 16-bit GEMM, rounded once, as the reference does.
inline bool use_blocks(int64_t rows, int64_t in_f, int64_t block, at::ScalarType type) {
  return (type == at::kFloat || type == at::kDouble) && in_f <= 256 && rows >= 4 * block;
}

// ---------------------------------------------------------------------------------------------
// A few rows (B <= 4): the layer is a matrix-vector product, bound by memory. The backward's
// two GEMMs then each stream a matrix once (one reads W, one writes dW) at two flops an
// element, each GEMM call has its fixed cost (dispatch, waking the threads, choosing a kernel),
// and the elementwise pass and dz in memory come on top. Here one pass over the rows of W does
// the whole backward; each thread takes a range of output features. (The forward is one GEMM
// call either way and stays ATen's.) Measured in chapter 2's sweep (B=1).
// ---------------------------------------------------------------------------------------------
constexpr int64_t kFewRows = 4;
constexpr int64_t kGroup = 4;  // rows of W handled together

// Also needed: enough output features to share out. The threads split the rows of W, and each
// running thread fills and sums a partial dx of rows × in_f; with few output features one
// thread would do all the work, and the partials would cost as much as the work itself.
// ATen's calls split the other way (over in_f) and keep those shapes.
inline bool few_rows(int64_t rows, int64_t out_f) {
  return rows >= 1 && rows <= kFewRows && out_f >= 16 * rows * at::get_num_threads();
}

// Calls body(o, n) for o0 to o1 in groups of n = kGroup rows, then one row at a time. n is a
// std::integral_constant: the body's loops over the group have a constant trip count, so they
// unroll and keep their values in registers.
template <typename Body>
inline void for_each_group(int64_t o0, int64_t o1, const Body& body) {
  int64_t o = o0;
  for (; o + kGroup <= o1; o += kGroup) body(o, std::integral_constant<int64_t, kGroup>());
  for (; o < o1; ++o) body(o, std::integral_constant<int64_t, 1>());
}

// Calls body with the row count as a std::integral_constant (1 to kFewRows), for the same reason.
template <typename Body>
inline void with_rows(int64_t rows, const Body& body) {
  static_assert(kFewRows == 4, "one case per row count");
  switch (rows) {
    case 1: return body(std::integral_constant<int64_t, 1>());
    case 2: return body(std::integral_constant<int64_t, 2>());
    case 3: return body(std::integral_constant<int64_t, 3>());
    default: return body(std::integral_constant<int64_t, 4>());
  }
}

// The backward for the kN rows of W from o, with dz[r] = g[r, o] y (1 − y):
//   db[o] = Σ_r dz[r],   dW[o, :] = Σ_r dz[r] x[r, :],   dx_part[r, :] += dz[r] W[o, :]
// dW is written a row at a time, one forward stream of stores. dx_part takes the kN rows of W
// at once: each chunk of it is loaded and stored once per kN rows instead of once per row.
// Null gw, gb or dx_part: that gradient was not asked for (or is empty). dz, the sums and
// dx_part are acc_t: bfloat16 and float16 are rounded only where dW and db are stored.
template <typename scalar_t, int64_t kRows, int64_t kN>
inline void few_rows_backward_group(const scalar_t* __restrict g, const scalar_t* __restrict y,
                                    const scalar_t* __restrict x, const scalar_t* __restrict w,
                                    scalar_t* __restrict gw, scalar_t* __restrict gb,
                                    acc_t<scalar_t>* __restrict dx_part, int64_t in_f, int64_t out_f, int64_t o) {
  using acc = acc_t<scalar_t>;
  using Vec = AccVec<scalar_t>;
  acc dz[kN][kRows];
  for (int64_t q = 0; q < kN; ++q) {
    acc sum = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const acc yv = y[r * out_f + o + q];
      dz[q][r] = acc(g[r * out_f + o + q]) * yv * (acc(1) - yv);
      sum += dz[q][r];
    }
    if (gb) gb[o + q] = scalar_t(sum);
  }
  if (gw) {
    for (int64_t q = 0; q < kN; ++q) {
      scalar_t* row = gw + (o + q) * in_f;
      for_each_chunk<Vec::size()>(in_f, [&](int64_t i, int64_t k) {
        Vec v = Vec(dz[q][0]) * load(x + i, k);
        for (int64_t r = 1; r < kRows; ++r) v = at::vec::fmadd(Vec(dz[q][r]), load(x + r * in_f + i, k), v);
        store(v, row + i, k);
      });
    }
  }
  if (dx_part) {
    for_each_chunk<Vec::size()>(in_f, [&](int64_t i, int64_t k) {
      for (int64_t r = 0; r < kRows; ++r) {  // W's chunks are in L1 after the first row of x
        acc* p = dx_part + r * in_f + i;
        Vec sum = Vec::loadu(p, k);
        for (int64_t q = 0; q < kN; ++q) sum = at::vec::fmadd(Vec(dz[q][r]), load(w + (o + q) * in_f + i, k), sum);
        sum.store(p, k);
      }
    });
  }
}

// dx is a sum over all o: each thread adds into a partial dx of its own, and the partials
// are added at the end in a fixed order. W is read once and dW written once.
// Null gx, gw or gb: that gradient was not asked for (or is empty).
template <typename scalar_t>
void few_rows_backward(const scalar_t* g, const scalar_t* y, const scalar_t* x, const scalar_t* w, scalar_t* gx,
                       scalar_t* gw, scalar_t* gb, int64_t rows, int64_t in_f, int64_t out_f) {
  const int64_t threads = at::get_num_threads(), part_size = rows * in_f;
  std::vector<acc_t<scalar_t>> gx_parts(gx ? threads * part_size : 0, 0);
  with_rows(rows, [&](auto kRows) {
    at::parallel_for(0, out_f, grain_rows(in_f), [&](int64_t o0, int64_t o1) {
      acc_t<scalar_t>* part = gx ? gx_parts.data() + at::get_thread_num() * part_size : nullptr;
      for_each_group(o0, o1, [&](int64_t o, auto kN) {
        few_rows_backward_group<scalar_t, kRows, kN>(g, y, x, w, gw, gb, part, in_f, out_f, o);
      });
    });
  });
  if (gx) {
    for (int64_t j = 0; j < part_size; ++j) {
      acc_t<scalar_t> sum = gx_parts[j];
      for (int64_t t = 1; t < threads; ++t) sum += gx_parts[t * part_size + j];
      gx[j] = scalar_t(sum);
    }
  }
}

at::Tensor forward(const at::Tensor& x, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias) {
  dense::check_inputs(x, weight, bias, "cpp", dense::kEveryFloat);
  // A 2-d x is used as it is: at B=1 even a view (a new tensor header) is a measurable cost.
  const bool flat = x.dim() == 2;
  const at::Tensor x2 = flat ? x : x.reshape({dense::rows(x), weight.size(1)});
  // The GEMM is ATen's (MKL/oneDNN on CPU, cuBLAS on GPU): nobody beats those by hand here.
  // In bfloat16 and float16 it accumulates in float and rounds z once, as nn.Linear's does.
  // The output is allocated once, in its final shape, and the GEMM writes into a 2-d view of
  // it; everything after the GEMM happens in place. (Returning a view of an internal tensor
  // instead would make autograd track that view.)
  at::Tensor out = at::empty(dense::out_shape(x, weight), x.options());
  at::Tensor z = flat ? out : out.view({x2.size(0), weight.size(0)});
  if (!x.is_cpu()) {  // on a GPU this stage leans on ATen; fused kernels are chapter 3's job
    bias ? at::addmm_out(z, *bias, x2, weight.t()) : at::mm_out(z, x2, weight.t());
    z.sigmoid_();
    return out;
  }
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();
  const at::Tensor wt = weight.t();
  const int64_t rows = x2.size(0), cols = weight.size(0), block = block_rows(cols, x.element_size());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, z.scalar_type(), "dense_cpp_forward", [&] {
    const scalar_t* bp = b.defined() ? b.data_ptr<scalar_t>() : nullptr;
    if (!use_blocks(rows, x2.size(1), block, x.scalar_type())) {
      // A 16-bit z is rounded once, after the bias: addmm adds it to the float accumulator, as
      // F.linear does. (mm then a separate bias pass would round x·Wᵀ to 16 bits first.)
      if (std::is_same_v<scalar_t, acc_t<scalar_t>> || bp == nullptr) {
        at::mm_out(z, x2, wt);
        bias_sigmoid_(z.data_ptr<scalar_t>(), bp, rows, cols);
      } else {
        at::addmm_out(z, b, x2, wt);
        bias_sigmoid_(z.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), rows, cols);
      }
      return;
    }
    // Blocked: the sigmoid pass over a block of rows right after its GEMM, while it is in
    // cache. (Inside a parallel region bias_sigmoid_'s own parallel_for runs serially.)
    at::parallel_for(0, rows, block, [&](int64_t r0, int64_t r1) {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;  // as in blocked_backward
      for (int64_t r = r0; r < r1; r += block) {
        const int64_t n = std::min(block, r1 - r);
        at::Tensor zb = z.narrow(0, r, n);
        at::mm_out(zb, x2.narrow(0, r, n), wt);
        bias_sigmoid_(zb.data_ptr<scalar_t>(), bp, n, cols);
      }
    });
  });
  return out;
}

// dz = g · y · (1 − y) and db = Σ_rows dz in one pass over g and y, where the plain ATen
// version takes two (sigmoid_backward, then sum) and reads dz back from memory.
// Memory is walked in order, row after row (the prefetcher's favourite pattern: after the
// GEMMs nothing of g or y is left in cache). Threads take disjoint row ranges and keep
// their own column sums, added together at the end in a fixed order.
// Column sums run in acc_t over kSumRows rows (a row of them stays in L1), then the
// blocks add up in double: a float sum over a million rows keeps its digits. dz itself is
// stored in the element type, as the reference's sigmoid_backward stores it.
constexpr int64_t kSumRows = 64;

// One thread's share: rows of g and y in, rows of dz out, column sums added to total[].
// region sigmoid-grad-rows
template <typename scalar_t, bool kBias>
void sigmoid_grad_rows(const scalar_t* g, const scalar_t* y, scalar_t* dz, double* total, acc_t<scalar_t>* part,
                       int64_t rows, int64_t cols) {
  using Vec = AccVec<scalar_t>;
  const Vec one(1);
  for (int64_t rb = 0; rb < rows; rb += kSumRows) {
    if constexpr (kBias) std::fill(part, part + cols, 0);
    for (int64_t r = rb; r < std::min(rows, rb + kSumRows); ++r) {
      const int64_t row = r * cols;
      for_each_chunk<Vec::size()>(cols, [&](int64_t c, int64_t n) {
        const Vec yv = load(y + row + c, n);
        const Vec d = load(g + row + c, n) * yv * (one - yv);
        store(d, dz + row + c, n);
        if constexpr (kBias) (Vec::loadu(part + c, n) + d).store(part + c, n);
      });
    }
    if constexpr (kBias) for (int64_t c = 0; c < cols; ++c) total[c] += part[c];
  }
}
// endregion

// The threads' column sums, added in a fixed order (the same answer on every run).
template <typename scalar_t>
void sum_totals(const std::vector<double>& totals, scalar_t* db, int64_t threads, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t t = 0; t < threads; ++t) sum += totals[t * cols + c];
    db[c] = static_cast<scalar_t>(sum);
  }
}

template <typename scalar_t, bool kBias>
void sigmoid_grad_and_bias_sum(const scalar_t* g, const scalar_t* y, scalar_t* dz, scalar_t* db,
                               int64_t rows, int64_t cols) {
  const int64_t threads = at::get_num_threads();
  std::vector<double> totals(kBias ? threads * cols : 0, 0.0);
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t r0, int64_t r1) {
    std::vector<acc_t<scalar_t>> part(kBias ? cols : 0);
    sigmoid_grad_rows<scalar_t, kBias>(g + r0 * cols, y + r0 * cols, dz + r0 * cols,
                                       totals.data() + (kBias ? at::get_thread_num() * cols : 0), part.data(),
                                       r1 - r0, cols);
  });
  if constexpr (kBias) sum_totals(totals, db, threads, cols);
}

// The blocked backward: each thread takes a block of rows at a time, computes its dz into a
// buffer of its own, and runs both GEMMs on it at once, while it is still in cache: dz is
// never written to memory. Each thread accumulates its own dW (dW = Σ_blocks dz_blockᵀ x_block),
// and the threads' dW add up at the end in a fixed order. (float32 and float64: use_blocks.)
template <typename scalar_t, bool kBias>
void blocked_backward(const at::Tensor& g, const at::Tensor& y, const at::Tensor& x2, const at::Tensor& weight,
                      at::Tensor* grad_x2, at::Tensor* grad_w, scalar_t* db, int64_t block) {
  const int64_t rows = y.size(0), out_f = y.size(1), in_f = weight.size(1);
  const int64_t threads = at::get_num_threads();
  std::vector<double> totals(kBias ? threads * out_f : 0, 0.0);
  at::Tensor dw_parts = grad_w ? at::zeros({threads, out_f, in_f}, y.options()) : at::Tensor();
  const scalar_t* gp = g.data_ptr<scalar_t>();
  const scalar_t* yp = y.data_ptr<scalar_t>();
  at::parallel_for(0, rows, block, [&](int64_t r0, int64_t r1) {
    // ATen calls from the worker threads: their thread-local dispatch state is not the caller's,
    // so say again that this runs below autograd (as the caller's thread already does).
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const int64_t tid = at::get_thread_num();
    at::Tensor dz = at::empty({std::min(block, r1 - r0), out_f}, y.options());
    std::vector<acc_t<scalar_t>> part(kBias ? out_f : 0);
    for (int64_t r = r0; r < r1; r += block) {
      const int64_t n = std::min(block, r1 - r);
      at::Tensor dzb = dz.narrow(0, 0, n);
      sigmoid_grad_rows<scalar_t, kBias>(gp + r * out_f, yp + r * out_f, dzb.data_ptr<scalar_t>(),
                                         totals.data() + (kBias ? tid * out_f : 0), part.data(), n, out_f);
      if (grad_x2) {
        at::Tensor dxb = grad_x2->narrow(0, r, n);
        at::mm_out(dxb, dzb, weight);
      }
      if (grad_w) dw_parts.select(0, tid).addmm_(dzb.t(), x2.narrow(0, r, n));
    }
  });
  if (grad_w) *grad_w = dw_parts.sum(0);
  if constexpr (kBias) sum_totals(totals, db, threads, out_f);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out,
                                                        const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const at::Tensor& out,
                                                        std::array<bool, 3> output_mask) {
  dense::check_inputs(x, weight, std::nullopt, "cpp", dense::kEveryFloat);
  const int64_t in_f = weight.size(1), out_f = weight.size(0);
  TORCH_CHECK_VALUE(grad_out.sizes() == out.sizes(), "grad_out has shape ", dense::shape(grad_out),
                    " but the output had shape ", dense::shape(out));
  // grad_out may be a broadcast view (y.sum().backward() passes expanded ones): the fused
  // loop wants plain rows.
  const int64_t rows = dense::rows(x);
  const bool flat = x.dim() == 2;  // then no reshape (and no new tensor header) is needed
  const at::Tensor g = (flat ? grad_out : grad_out.reshape({rows, out_f})).contiguous();
  const at::Tensor y = (flat ? out : out.reshape({rows, out_f})).contiguous();

  at::Tensor dz, grad_b;
  if (y.is_cpu()) {
    grad_b = output_mask[2] ? at::empty({out_f}, y.options()) : dense::unused(y);
    if (few_rows(rows, out_f)) {
      at::Tensor grad_x = output_mask[0] ? at::empty(x.sizes(), x.options()) : dense::unused(x);
      at::Tensor grad_w = output_mask[1] ? at::empty({out_f, in_f}, x.options()) : dense::unused(x);
      const at::Tensor x2 = (flat ? x : x.reshape({rows, in_f})).contiguous();
      const at::Tensor w = weight.contiguous();
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "dense_cpp_backward_few_rows", [&] {
        auto ptr = [](const at::Tensor& t, bool wanted) { return wanted ? t.data_ptr<scalar_t>() : nullptr; };
        few_rows_backward(g.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x2.data_ptr<scalar_t>(),
                          w.data_ptr<scalar_t>(), ptr(grad_x, output_mask[0]), ptr(grad_w, output_mask[1]),
                          ptr(grad_b, output_mask[2]), rows, in_f, out_f);
      });
      return {grad_x, grad_w, grad_b};
    }
    const int64_t block = block_rows(out_f, y.element_size());
    if (use_blocks(rows, in_f, block, y.scalar_type()) && (output_mask[0] || output_mask[1])) {
      at::Tensor grad_x2 = output_mask[0] ? at::empty({rows, in_f}, x.options()) : dense::unused(x);
      at::Tensor grad_w = dense::unused(x);
      const at::Tensor x2 = flat ? x : x.reshape({rows, in_f});
      AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "dense_cpp_backward_blocked", [&] {
        auto kernel = output_mask[2] ? blocked_backward<scalar_t, true> : blocked_backward<scalar_t, false>;
        kernel(g, y, x2, weight, output_mask[0] ? &grad_x2 : nullptr, output_mask[1] ? &grad_w : nullptr,
               output_mask[2] ? grad_b.data_ptr<scalar_t>() : nullptr, block);
      });
      return {output_mask[0] ? grad_x2.view(x.sizes()) : grad_x2, grad_w, grad_b};
    }
    dz = at::empty_like(y);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "dense_cpp_backward", [&] {
      auto kernel = output_mask[2] ? sigmoid_grad_and_bias_sum<scalar_t, true>
                                   : sigmoid_grad_and_bias_sum<scalar_t, false>;
      kernel(g.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dz.data_ptr<scalar_t>(),
             output_mask[2] ? grad_b.data_ptr<scalar_t>() : nullptr, y.size(0), out_f);
    });
  } else {
    // On a GPU this stage leans on ATen's kernels; the fused ones are chapter 3's job.
    dz = at::sigmoid_backward(g, y);
    grad_b = output_mask[2] ? dz.sum(0) : dense::unused(y);
  }

  // The two GEMMs of a linear layer's backward, again through ATen.
  at::Tensor grad_x = !output_mask[0] ? dense::unused(x)
                      : flat          ? at::mm(dz, weight)
                                      : at::mm(dz, weight).view(x.sizes());
  at::Tensor grad_w = output_mask[1] ? at::mm(dz.t(), flat ? x : x.reshape({rows, in_f})) : dense::unused(x);
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY(dense_cpp, m) { dense::define_ops(m); }

// ATen calls work on both devices, so one implementation serves CPU and CUDA tensors.
TORCH_LIBRARY_IMPL(dense_cpp, CPU, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
}
TORCH_LIBRARY_IMPL(dense_cpp, CUDA, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
}
TORCH_LIBRARY_IMPL(dense_cpp, Autograd, m) { dense::implement_autograd<CppStage>(m); }

DENSE_PYTHON_MODULE(dense_cpp_ext)
