// Stage 2: the Dense layer in ATen C++, registered as the ops dense_cpp::forward/backward.
//
// Build and check:  python grad_check.py cpp          (JIT build, cached in build/jit/)
// Ahead of time:    pip install --no-build-isolation .
#include "dense_common.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

namespace {

at::Tensor forward(const at::Tensor& x, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias) {
  dense::check_inputs(x, weight, bias);
  const at::Tensor x2 = x.reshape({-1, weight.size(1)});
  // The GEMM is ATen's (MKL/oneDNN on CPU, cuBLAS on GPU): nobody beats those by hand here.
  // addmm folds the bias into the GEMM's epilogue; the sigmoid then runs in place, so the
  // forward allocates exactly one tensor.
  at::Tensor z = bias ? at::addmm(*bias, x2, weight.t()) : at::mm(x2, weight.t());
  z.sigmoid_();
  return z.view(dense::out_shape(x, weight));
}

// dz = g · y · (1 − y) and db = Σ_rows dz in one pass over g and y, where the plain ATen
// version takes two (sigmoid_backward, then sum) and re-reads dz from memory.
// Threads split the columns, so each owns its slice of db: no atomics, no partial sums.
template <typename scalar_t, bool kBias>
void sigmoid_grad_and_bias_sum(const scalar_t* g, const scalar_t* y, scalar_t* dz, scalar_t* db,
                               int64_t rows, int64_t cols) {
  // Sums over many rows in float lose digits; accumulate in double and round once.
  using acc_t = double;
  const int64_t grain = std::max<int64_t>(16, 32768 / std::max<int64_t>(rows, 1));
  at::parallel_for(0, cols, grain, [&](int64_t c0, int64_t c1) {
    std::vector<acc_t> acc(kBias ? c1 - c0 : 0, acc_t(0));
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* gr = g + r * cols;
      const scalar_t* yr = y + r * cols;
      scalar_t* dzr = dz + r * cols;
      // A branch-free inner loop over contiguous memory: the compiler vectorises it.
      for (int64_t c = c0; c < c1; ++c) {
        const scalar_t d = gr[c] * yr[c] * (scalar_t(1) - yr[c]);
        dzr[c] = d;
        if constexpr (kBias) acc[c - c0] += d;
      }
    }
    if constexpr (kBias) {
      for (int64_t c = c0; c < c1; ++c) db[c] = static_cast<scalar_t>(acc[c - c0]);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out,
                                                        const at::Tensor& x,
                                                        const at::Tensor& weight,
                                                        const at::Tensor& out,
                                                        std::array<bool, 3> output_mask) {
  dense::check_inputs(x, weight, std::nullopt);
  const int64_t in_f = weight.size(1), out_f = weight.size(0);
  // grad_out may be a broadcast view (y.sum().backward() passes expanded ones): the fused
  // loop wants plain rows.
  const at::Tensor g = grad_out.reshape({-1, out_f}).contiguous();
  const at::Tensor y = out.reshape({-1, out_f}).contiguous();
  TORCH_CHECK_VALUE(g.sizes() == y.sizes(), "grad_out has shape ", grad_out.sizes(),
                    " but the output had shape ", out.sizes());

  at::Tensor dz, grad_b;
  if (y.is_cpu()) {
    dz = at::empty_like(y);
    grad_b = output_mask[2] ? at::empty({out_f}, y.options()) : dense::unused(y);
    AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "dense_cpp_backward", [&] {
      auto kernel = output_mask[2] ? sigmoid_grad_and_bias_sum<scalar_t, true>
                                   : sigmoid_grad_and_bias_sum<scalar_t, false>;
      kernel(g.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dz.data_ptr<scalar_t>(),
             output_mask[2] ? grad_b.data_ptr<scalar_t>() : nullptr, y.size(0), out_f);
    });
  } else {
    // On a GPU this stage leans on ATen's kernels; the fused ones are stage 3's job.
    dz = at::sigmoid_backward(g, y);
    grad_b = output_mask[2] ? dz.sum(0) : dense::unused(y);
  }

  // The two GEMMs of a linear layer's backward, again through ATen.
  at::Tensor grad_x = output_mask[0] ? at::mm(dz, weight).view(x.sizes()) : dense::unused(x);
  at::Tensor grad_w = output_mask[1] ? at::mm(dz.t(), x.reshape({-1, in_f})) : dense::unused(x);
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

DENSE_PYTHON_MODULE(dense_cpp_ext)
