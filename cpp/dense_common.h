// What every compiled stage (cpp, cuda, ptx) shares: the op schema, the input checks, the
// shape bookkeeping and the autograd formula. Each stage includes this and registers the same
// two ops under its own namespace, plus one line for their autograd kernel:
//   TORCH_LIBRARY_IMPL(dense_<stage>, Autograd, m) { dense::implement_autograd<Stage>(m); }
// modes.register_dense_op() adds what only Python can: fake kernels and vmap rules.
//
// Built as part of each stage: python grad_check.py cpp   (JIT), or
//                               pip install --no-build-isolation .   (ahead of time)
#pragma once

#include <Python.h>  // first, as Python asks: only for the module stub at the bottom

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/FuncTorchTLS.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
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

// A tensor's shape, dtype and device as text, built from plain integers and C strings, for the
// error messages below. Streaming t.sizes() (a c10::ArrayRef) into an error message crashed the
// process on the GPU machine's image (torch 2.11 and that image's compiler: a segfault in
// c10::detail::_str_wrapper, on CPU and CUDA tensors alike) instead of raising the error;
// integers and strings stream safely, so no c10 type is streamed into a message here.
// shape(): "[2, 5]", as ATen prints a shape.
inline std::string shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// "Float", "Double", "Int"...: ATen's name of the dtype.
inline std::string dtype_name(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

// "cpu", "cuda:0": as torch prints a device.
inline std::string device_name(const at::Tensor& t) {
  const c10::Device device = t.device();
  std::string s = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  return device.has_index() ? s + ":" + std::to_string(device.index()) : s;
}

// The element types a stage takes. Every stage takes float32 and float64; bfloat16 and float16
// are storage types that the stages which take them accumulate in float32, as nn.Linear does.
struct DtypeSet {
  bool f32, f64, bf16, f16;
  const char* names;  // for the error message
  bool has(const at::Tensor& t) const {
    switch (t.scalar_type()) {
      case at::kFloat: return f32;
      case at::kDouble: return f64;
      case at::kBFloat16: return bf16;
      case at::kHalf: return f16;
      default: return false;
    }
  }
};
constexpr DtypeSet kEveryFloat{true, true, true, true, "float32, float64, bfloat16 and float16"};
constexpr DtypeSet kFloat32And64{true, true, false, false, "float32 and float64"};

// The same contract as modes.check_inputs(), for callers who reach the op through
// torch.ops directly. TORCH_CHECK_TYPE/VALUE raise Python's TypeError/ValueError. `stage` names
// the stage in the message for a floating type it does not take (modes.check_inputs, which runs
// when the op refuses its inputs, adds which modes do take it).
inline void check_inputs(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const char* stage = "cpp", const DtypeSet& types = kEveryFloat) {
  TORCH_CHECK_TYPE(kEveryFloat.has(x), "x has dtype ", dtype_name(x), "; Dense supports ", kEveryFloat.names);
  TORCH_CHECK_TYPE(types.has(x), "x has dtype ", dtype_name(x), "; the ", stage, " stage takes ", types.names);
  TORCH_CHECK_VALUE(x.dim() >= 1, "x is 0-d; Dense needs x of shape (*, in_features)");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must be 2-d (out_features, in_features), got shape ",
                    shape(weight));
  TORCH_CHECK_VALUE(x.size(-1) == weight.size(1), "x has in_features=", x.size(-1),
                    " (its last dimension) but weight ", shape(weight), " expects in_features=",
                    weight.size(1));
  TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), "dtype mismatch: x is ", dtype_name(x),
                   " but weight is ", dtype_name(weight));
  TORCH_CHECK_VALUE(weight.device() == x.device(), "device mismatch: x is on ", device_name(x),
                    " but weight is on ", device_name(weight));
  if (bias) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "bias must have shape (",
                      weight.size(0), ",) to match weight ", shape(weight), ", got ", shape(*bias));
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), "dtype mismatch: x is ", dtype_name(x),
                     " but bias is ", dtype_name(*bias));
    TORCH_CHECK_VALUE(bias->device() == x.device(), "device mismatch: x is on ", device_name(x),
                      " but bias is on ", device_name(*bias));
  }
}

// x of shape (*, in) -> output of shape (*, out).
inline std::vector<int64_t> out_shape(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(weight.size(0));
  return shape;
}

// The number of rows x folds into: the product of its leading dimensions. (reshape({-1, in})
// cannot say it: with in_features = 0 every row count fits zero elements.)
inline int64_t rows(const at::Tensor& x) {
  return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
}

inline at::Tensor unused(const at::Tensor& like) { return at::empty({0}, like.options()); }


// ---------------------------------------------------------------------------------------------
// Autograd, in C++: the formula runs with no Python on the hot path (chapter 2 measures what a
// Python formula cost per call). `Stage::name` is "cpp", "cuda" or "ptx"; the ops it uses are
// dense_<name>::forward/backward, called through the dispatcher below the Autograd key, so
// that FakeTensors (torch.compile) reach the fake kernels and real tensors the device kernels.
// ---------------------------------------------------------------------------------------------

using ForwardFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);
using BackwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, const at::Tensor&,
                                                                  std::array<bool, 3>);

// dense_<stage>::<op> from the dispatcher, typed; each caller keeps it in a static (looked up once).
template <class Fn>
c10::TypedOperatorHandle<Fn> find_op(const char* stage, const char* op) {
  const std::string name = std::string("dense_") + stage + "::" + op;
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").template typed<Fn>();
}

template <class Stage>
const c10::TypedOperatorHandle<ForwardFn>& forward_op() {
  static const auto op = find_op<ForwardFn>(Stage::name, "forward");
  return op;
}

template <class Stage>
const c10::TypedOperatorHandle<BackwardFn>& backward_op() {
  static const auto op = find_op<BackwardFn>(Stage::name, "backward");
  return op;
}

template <class Stage>
struct DenseFunction : public torch::autograd::Function<DenseFunction<Stage>> {
  // Called as apply(x, weight) or apply(x, weight, bias): autograd tracks Tensor arguments,
  // and an undefined Tensor standing for "no bias" is not one it accepts.
  template <class... Bias>
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const Bias&... bias) {
    static_assert(sizeof...(Bias) <= 1);
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = forward_op<Stage>().call(x, weight, std::optional<at::Tensor>(bias...));
    }
    // sigmoid'(z) = y (1 - y): the output is all the backward needs besides x and W.
    ctx->save_for_backward({x, weight, out});
    ctx->saved_data["has_bias"] = sizeof...(Bias) == 1;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // Autograd runs a backward with grad mode on only for create_graph=True. The backward op
    // has no derivative of its own: say so rather than return silently wrong zeros.
    TORCH_CHECK(!at::GradMode::is_enabled(), "dense_", Stage::name,
                ": double backward (create_graph=True) is not implemented for this stage; mode 'py' supports it");
    const auto saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      has_bias && ctx->needs_input_grad(2)};
    auto [gx, gw, gb] = backward_op<Stage>().call(grads[0], saved[0], saved[1], saved[2], mask);
    torch::autograd::variable_list out = {mask[0] ? gx : at::Tensor(), mask[1] ? gw : at::Tensor()};
    if (has_bias) out.push_back(mask[2] ? gb : at::Tensor());
    return out;
  }

  static at::Tensor call(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    return bias.defined() ? DenseFunction::apply(x, weight, bias) : DenseFunction::apply(x, weight);
  }
};

// The Autograd kernel of dense_<stage>::forward.
//
// torch.func's transforms (grad, jacrev, jacfwd, jvp) refuse a C++ autograd::Function: under
// them this kernel computes sigmoid(linear(x, W, b)) with ATen's differentiable ops, which
// every transform understands (the same values the reference gives). vmap alone never gets
// here: its batching rule (modes.register_dense_op) runs first and calls the op per batch.
//
// Forward-mode AD outside torch.func (torch.autograd.forward_ad) is done by hand, since a C++
// autograd::Function cannot carry tangents. With tangents dx, dW, db of the inputs:
//   dz = dx Wᵀ + x dWᵀ + db,   dy = y (1 − y) · dz
// computed from the primal output with ATen ops and attached to it as its tangent. Level 0 is
// the only level torch.autograd.forward_ad opens.
// Whether a torch.func transform is active, by the very test autograd::Function::apply makes.
inline bool under_torch_func() {
  const auto& tls = at::functorch::functorchTLSAccessor();
  if (!tls) return false;  // torch.func never ran on this thread
  try {
    tls->checkSupportsCppAutogradFunction();
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

template <class Stage>
at::Tensor autograd_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (under_torch_func()) return at::sigmoid(at::linear(x, weight, bias));
  const at::Tensor b = bias.value_or(at::Tensor());
  auto tangent = [](const at::Tensor& t) { return t.defined() ? t._fw_grad(0) : at::Tensor(); };
  const at::Tensor dx = tangent(x), dw = tangent(weight), db = tangent(b);
  if (!dx.defined() && !dw.defined() && !db.defined()) return DenseFunction<Stage>::call(x, weight, b);

  auto primal = [](const at::Tensor& t) { return t.defined() ? t._fw_primal(0) : t; };
  const at::Tensor xp = primal(x), wp = primal(weight), bp = primal(b);
  const at::Tensor y = DenseFunction<Stage>::call(xp, wp, bp);
  at::Tensor dz = at::zeros_like(y);
  if (dx.defined()) dz = dz + at::linear(dx, wp);
  if (dw.defined()) dz = dz + at::linear(xp, dw);
  if (db.defined()) dz = dz + db;
  return at::_make_dual(y, dz * y * (1 - y), /*level=*/0);
}

template <class Stage>
void implement_autograd(torch::Library& m) {
  m.impl("forward", &autograd_forward<Stage>);
}

}  // namespace dense

// `import <name>` of an ahead-of-time build loads the library, which runs its
// TORCH_LIBRARY blocks; the module itself is empty. A JIT build is loaded without it.
#define DENSE_PYTHON_MODULE(name)                                              \
  extern "C" PyObject* PyInit_##name() {                                       \
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, #name, nullptr, -1, nullptr}; \
    return PyModule_Create(&def);                                              \
  }
