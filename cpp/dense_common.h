// What every compiled stage (cpp, cuda, ptx) shares: the op schema, the input checks and
// the shape bookkeeping. Each stage includes this and registers the same two ops under its
// own namespace, so modes.register_dense_op() can give all of them one autograd formula.
//
// Built as part of each stage: python grad_check.py cpp   (JIT), or
//                               pip install --no-build-isolation .   (ahead of time)
#pragma once

#include <Python.h>  // first, as Python asks: only for the module stub at the bottom

#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

namespace dense {

// Gradients that output_mask does not ask for come back as empty tensors, so the schema
// can return plain Tensors (ATen's convolution_backward uses the same mask convention).
inline void define_ops(torch::Library& m) {
  m.def("forward(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("backward(Tensor grad_out, Tensor x, Tensor weight, Tensor out, bool[3] output_mask)"
        " -> (Tensor, Tensor, Tensor)");
}

// The same contract as modes.check_inputs(), for callers who reach the op through
// torch.ops directly. TORCH_CHECK_TYPE/VALUE raise Python's TypeError/ValueError.
inline void check_inputs(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias) {
  auto floating = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble;
  };
  TORCH_CHECK_TYPE(floating(x), "x has dtype ", x.scalar_type(), "; Dense supports float32 and float64");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x is 0-d; Dense needs x of shape (*, in_features)");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-d (out_features, in_features), got shape ",
                    weight.sizes());
  TORCH_CHECK_VALUE(x.size(-1) == weight.size(1), "x has in_features=", x.size(-1),
                    " (its last dimension) but weight ", weight.sizes(), " expects in_features=",
                    weight.size(1));
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), "dtype mismatch: x is ",
                   x.scalar_type(), " but weight is ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == x.device(), "device mismatch: x is on ", x.device(),
                    " but weight is on ", weight.device());
  if (bias) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "bias must have shape (",
                      weight.size(0), ",) to match weight ", weight.sizes(), ", got ", bias->sizes());
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), "dtype mismatch: x is ",
                     x.scalar_type(), " but bias is ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->device() == x.device(), "device mismatch: x is on ", x.device(),
                      " but bias is on ", bias->device());
  }
}

// x of shape (*, in) -> output of shape (*, out).
inline std::vector<int64_t> out_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(weight.size(0));
  return shape;
}

inline at::Tensor unused(const at::Tensor& like) { return at::empty({0}, like.options()); }

}  // namespace dense

// `import <name>` of an ahead-of-time build loads the library, which runs its
// TORCH_LIBRARY blocks; the module itself is empty. A JIT build is loaded without it.
#define DENSE_PYTHON_MODULE(name)                                              \
  extern "C" PyObject* PyInit_##name() {                                       \
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, #name, nullptr, -1, nullptr}; \
    return PyModule_Create(&def);                                              \
  }
