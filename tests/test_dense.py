"""The semantics every stage shares, checked for each available (mode, device) pair."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import grad_check
import modes
from conftest import MODE_DEVICE


def reference(x, weight, bias):
    return torch.sigmoid(F.linear(x, weight, bias))


def tensors(device, shape_x, out_f, dtype=torch.float64, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    in_f = shape_x[-1]
    made = [torch.randn(shape_x, generator=gen, dtype=dtype), torch.randn(out_f, in_f, generator=gen, dtype=dtype)]
    if bias:
        made.append(torch.randn(out_f, generator=gen, dtype=dtype))
    return [t.to(device).requires_grad_() for t in made]


def forward_backward(fn, ts, grad_out=None):
    """Output and the gradients of every input, for fn(x, weight, bias?)."""
    ts = [t.detach().clone().requires_grad_() for t in ts]
    y = fn(*ts) if len(ts) == 3 else fn(ts[0], ts[1], None)
    y.backward(torch.ones_like(y) if grad_out is None else grad_out)
    return y.detach(), [t.grad for t in ts]


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("shape_x, out_f, bias", [
    ((4, 6), 3, True), ((4, 6), 3, False), ((2, 3, 5), 4, True), ((5,), 2, True), ((1, 1), 1, True),
])
def test_gradcheck_float64(mode, device, shape_x, out_f, bias):
    fn = modes.dense(mode)
    ts = tensors(device, shape_x, out_f, bias=bias)
    assert torch.autograd.gradcheck(lambda *t: fn(t[0], t[1], t[2] if bias else None), ts)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("shape_x, out_f", [((1, 1), 1), ((127, 131), 129), ((3, 7, 33), 65), ((64,), 17)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_linear_plus_sigmoid(mode, device, shape_x, out_f, dtype):
    ts = tensors(device, shape_x, out_f, dtype=dtype)
    grad_out = torch.randn(*shape_x[:-1], out_f, dtype=dtype, device=device)
    y, grads = forward_backward(modes.dense(mode), ts, grad_out)
    y_ref, grads_ref = forward_backward(reference, ts, grad_out)
    assert y.shape == y_ref.shape and y.dtype == dtype
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(y, y_ref, **tol)
    for g, g_ref in zip(grads, grads_ref):
        assert g.shape == g_ref.shape
        torch.testing.assert_close(g, g_ref, **tol)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("shape_x, out_f", [((1, 1), 1), pytest.param((127, 131), 129, marks=pytest.mark.slow),
                                            ((3, 7, 33), 65), ((64,), 17)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_matches_linear_plus_sigmoid_in_16_bits(mode, device, shape_x, out_f, dtype):
    """Against the float64 truth, by grad_check's rule and its bound (the rule in its docstring)."""
    ts = tensors(device, shape_x, out_f, dtype=dtype)
    grad_out = torch.randn(*shape_x[:-1], out_f, dtype=dtype, device=device)
    y, grads = forward_backward(modes.dense(mode), ts, grad_out)
    y_ref, grads_ref = forward_backward(reference, ts, grad_out)
    exact, grads_exact = forward_backward(reference, [t.double() for t in ts], grad_out.double())
    cpu = [t.detach().cpu() for t in ts]
    bounds, sizes = grad_check.error_bound(*cpu, grad_out.cpu(), dtype), grad_check.magnitudes(*cpu, grad_out.cpu())
    assert y.dtype == dtype and [g.dtype for g in grads] == [dtype] * 3
    for name, a, e, t, b, m in zip(grad_check.TENSORS, [y, *grads], [y_ref, *grads_ref], [exact, *grads_exact],
                                   bounds, sizes):
        verdict = grad_check.judge(a, e, t, dtype, b, m)
        assert verdict.passed, f"{name}: {verdict.detail()}"


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_empty_batch(mode, device):
    x, w, b = tensors(device, (0, 5), 3, dtype=torch.float32)
    y = modes.dense(mode)(x, w, b)
    assert y.shape == (0, 3)
    y.sum().backward()
    assert x.grad.shape == (0, 5)
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_non_contiguous_input(mode, device):
    x, w, b = tensors(device, (9, 6), 4)
    xt = x.detach().t().contiguous().t().requires_grad_()  # same values, column-major strides
    assert not xt.is_contiguous()
    y, grads = forward_backward(modes.dense(mode), [xt, w, b])
    y_ref, grads_ref = forward_backward(reference, [x, w, b])
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_large_values_stay_finite(mode, device, dtype):
    x = torch.tensor([[1000.0, -1000.0], [-1000.0, 1000.0]], dtype=dtype, device=device, requires_grad=True)
    w = torch.eye(2, dtype=dtype, device=device, requires_grad=True)
    b = torch.zeros(2, dtype=dtype, device=device, requires_grad=True)
    y = modes.dense(mode)(x, w, b)
    assert torch.equal(y.detach().cpu(), torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=dtype))
    y.backward(torch.ones_like(y))
    for t in (x, w, b):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_broadcast_grad_from_sum(mode, device):
    """y.sum().backward() hands the op an expanded (stride-0) gradient."""
    ts = tensors(device, (6, 5), 4)
    _, grads = forward_backward(modes.dense(mode), ts)
    _, grads_ref = forward_backward(reference, ts)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_needs_input_grad_is_honoured(mode, device):
    x, w, b = tensors(device, (4, 3), 2)
    x = x.detach()  # an input batch: no gradient wanted
    b = b.detach()
    modes.dense(mode)(x, w, b).sum().backward()
    assert x.grad is None and b.grad is None and w.grad is not None


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("make, error, message", [
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 5, device=d), None), ValueError, "in_features=4"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(8, device=d), None), ValueError, "weight must be 2-d"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 4, device=d), torch.randn(3, device=d)),
     ValueError, "bias must have shape (2,)"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 4, dtype=torch.float64, device=d), None),
     TypeError, "dtype mismatch: x is torch.float32 but weight is torch.float64"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 4, device=d), torch.randn(2, dtype=torch.float64,
                                                                                      device=d)),
     TypeError, "but bias is torch.float64"),
    (lambda d: (torch.ones(3, 4, dtype=torch.int64, device=d), torch.ones(2, 4, dtype=torch.int64, device=d), None),
     TypeError, "x has dtype torch.int64"),
    (lambda d: (torch.randn(3, 4, dtype=torch.float16, device=d), torch.randn(2, 4, device=d), None),
     TypeError, "dtype mismatch: x is torch.float16 but weight is torch.float32"),
    (lambda d: (torch.tensor(1.0, device=d), torch.randn(2, 1, device=d), None), ValueError, "x is 0-d"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 4, device="meta"), None),
     ValueError, "device mismatch: x is on"),
    (lambda d: (torch.randn(3, 4, device=d), torch.randn(2, 4, device=d), torch.randn(2, device="meta")),
     ValueError, "but bias is on meta"),
    (lambda d: ([[1.0] * 4], torch.randn(2, 4, device=d), None), TypeError, "x must be a torch.Tensor"),
])
def test_bad_input_raises_a_clear_error(mode, device, make, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        modes.dense(mode)(*make(device))


# ---------------------------------------------------------------------------
# modes: the door itself
# ---------------------------------------------------------------------------

def test_available_lists_every_mode_with_none_or_a_reason():
    reasons = modes.available()
    assert tuple(reasons) == modes.MODES
    assert reasons["py"] is None
    for reason in reasons.values():
        assert reason is None or (isinstance(reason, str) and reason)


def test_resolve_picks_the_modes_a_script_runs():
    selected, skipped = modes.resolve("all")
    assert selected == [m for m in modes.MODES if modes.available()[m] is None]
    assert set(skipped) == {m for m in modes.MODES if modes.available()[m] is not None}
    assert modes.resolve("py") == (["py"], {})
    with pytest.raises(ValueError, match="unknown mode 'fortran'"):
        modes.resolve("fortran")
    for mode in skipped:
        with pytest.raises(RuntimeError, match=f"mode '{mode}' is not available here"):
            modes.resolve(mode)


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown mode 'fortran'; choose one of py, cpp, triton, cuda, ptx"):
        modes.dense("fortran")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a CPU-only torch gives")
def test_unavailable_mode_names_the_reason():
    with pytest.raises(RuntimeError, match="mode 'cuda' is not available here: needs a CUDA build of torch"):
        modes.Dense(4, 2, mode="cuda")


# ---------------------------------------------------------------------------
# modes.Dense: one module for every stage, interchangeable with nn.Linear
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("bias", [True, False])
def test_dense_is_initialised_like_linear(mode, device, bias):
    torch.manual_seed(3)
    layer = modes.Dense(7, 5, bias=bias, mode=mode, device=device)
    torch.manual_seed(3)
    linear = torch.nn.Linear(7, 5, bias=bias, device=device)
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in linear.named_parameters()]
    for p, q in zip(layer.parameters(), linear.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_state_dict_moves_both_ways(mode, device):
    linear = torch.nn.Linear(6, 3, device=device, dtype=torch.float64)
    layer = modes.Dense(6, 3, mode=mode, device=device, dtype=torch.float64)
    layer.load_state_dict(linear.state_dict())
    x = torch.randn(4, 6, device=device, dtype=torch.float64)
    torch.testing.assert_close(layer(x), torch.sigmoid(linear(x)))
    back = torch.nn.Linear(6, 3, device=device, dtype=torch.float64)
    back.load_state_dict(layer.state_dict())
    assert torch.equal(back.weight, linear.weight) and torch.equal(back.bias, linear.bias)


def test_dense_repr_and_attributes():
    layer = modes.Dense(3, 2, bias=False, mode="py", dtype=torch.float64)
    assert repr(layer) == "Dense(in_features=3, out_features=2, bias=False, mode='py')"
    assert layer.bias is None and layer.weight.dtype == torch.float64


def test_py_stage_supports_double_backward():
    """Its backward is made of differentiable torch ops (see py/README.md, exercise 3)."""
    ts = tensors("cpu", (3, 4), 2)
    assert torch.autograd.gradgradcheck(modes.dense("py"), ts)
