"""Inputs at the edges, checked against the reference sigmoid(F.linear(...)) in every mode:
NaN and ±inf, zero-sized shapes, in-place ops on the output, forward-mode AD and torch.func
transforms, pickling a Dense module. In bfloat16 and float16 the answers are judged as
grad_check.py judges them: NaN and ±inf where nn.Linear has them, the finite values against the
float64 truth within 4× of nn.Linear's own error (grad_check.judge)."""

from __future__ import annotations

import io
import pickle
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import func

import grad_check
import modes
from conftest import MODE_DEVICE


def reference(x, weight, bias=None):
    return torch.sigmoid(F.linear(x, weight, bias))


def outputs_and_grads(fn, ts, grad_out):
    ts = [t.detach().clone().requires_grad_() for t in ts]
    y = fn(*ts)
    y.backward(grad_out)
    return [y.detach()] + [t.grad for t in ts]


def layer_tensors(device, dtype, shape_x=(4, 5), out_f=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [shape_x, (out_f, shape_x[-1]), (out_f,), (*shape_x[:-1], out_f)]  # x, weight, bias, grad_out
    return [torch.randn(s, generator=gen, dtype=dtype).to(device) for s in shapes]


def tolerance(dtype):
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}


LOW = (torch.bfloat16, torch.float16)
DTYPES = [torch.float32, torch.float64, torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)]


def assert_like_linear(names, got, linear, inputs, grad_out, dtype):
    """Each of ``got`` as nn.Linear's answer ``linear``: in float32 and float64 within the tolerance
    (NaN where it has NaN), in bfloat16 and float16 by grad_check's rule against the float64 truth
    of the same inputs."""
    if dtype not in LOW:
        for name, a, e in zip(names, got, linear):
            torch.testing.assert_close(a, e, equal_nan=True, **tolerance(dtype), msg=lambda m, n=name: f"{n}: {m}")
        return
    exact = outputs_and_grads(reference, [t.double() for t in inputs], grad_out.double())
    for name, a, e, t in zip(names, got, linear, exact):
        assert a.dtype == e.dtype == dtype and a.shape == e.shape, name
        verdict = grad_check.judge(a, e, t, dtype)
        assert verdict.passed, f"{name}: {verdict.detail()}"


# ---------------------------------------------------------------------------
# NaN and ±inf: the reference's NaN pattern and values, forward and backward
# ---------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


def place(where, value, x, w, b):
    if where == "x":
        x[1, 2] = value
    elif where == "weight":
        w[2, 1] = value
    elif where == "bias":
        b[0] = value
    else:  # "z": finite inputs whose products overflow, so z itself is ±inf (or NaN: inf - inf)
        x[2] = 1e30 if value > 0 else -1e30
        w[0], w[1] = 1.0, -1.0


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where, value", [(w, v) for w in ("x", "weight", "bias") for v in (NAN, INF, -INF)]
                         + [("z", INF), ("z", -INF)])  # z = NaN: NaN in x, weight or bias
def test_nan_and_inf_give_the_references_answer(mode, device, dtype, where, value):
    x, w, b, g = layer_tensors(device, dtype)
    place(where, value, x, w, b)
    got = outputs_and_grads(modes.dense(mode), [x, w, b], g)
    expected = outputs_and_grads(reference, [x, w, b], g)
    # NaN exactly where the reference has NaN; ±inf must match exactly too.
    assert_like_linear(["output", "grad x", "grad weight", "grad bias"], got, expected, [x, w, b], g, dtype)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_nan_in_x_reaches_the_output(mode, device):
    """The smallest case: a NaN input gives a NaN output (a vectorised exp that clamps its
    argument would turn it into a number)."""
    y = modes.dense(mode)(torch.tensor([[NAN]], device=device), torch.ones(1, 1, device=device))
    assert torch.isnan(y).all()


# ---------------------------------------------------------------------------
# Zero-sized shapes: what nn.Linear + sigmoid gives
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("in_f, out_f, batch", [(0, 3, 2), (4, 0, 2), (4, 3, 0), (0, 0, 2), (0, 3, 0)])
def test_zero_sizes_match_linear(mode, device, dtype, in_f, out_f, batch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Initializing zero-element tensors is a no-op", for both
        torch.manual_seed(0)
        layer = modes.Dense(in_f, out_f, mode=mode, device=device, dtype=dtype)
        torch.manual_seed(0)
        linear = torch.nn.Linear(in_f, out_f, device=device, dtype=dtype)
    x = torch.randn(batch, in_f, device=device, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = layer(x), torch.sigmoid(linear(x_ref))
    g = torch.randn_like(y_ref)
    y.backward(g)
    y_ref.backward(g)
    assert y.shape == y_ref.shape
    got = [y.detach(), x.grad, layer.weight.grad, layer.bias.grad]
    expected = [y_ref.detach(), x_ref.grad, linear.weight.grad, linear.bias.grad]
    assert [a.shape for a in got] == [e.shape for e in expected]
    assert_like_linear(["output", "grad x", "grad weight", "grad bias"], got, expected,
                       [x.detach(), linear.weight.detach(), linear.bias.detach()], g, dtype)


# ---------------------------------------------------------------------------
# The output is a tensor of its own
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("shape_x", [(4, 5), (2, 3, 5), (5,)])
def test_in_place_op_on_the_output_behaves_like_the_references(mode, device, shape_x):
    x, w, b, _ = layer_tensors(device, torch.float64, shape_x)
    results = []
    for fn in (modes.dense(mode), reference):
        ts = [t.clone().requires_grad_() for t in (x, w, b)]
        y = fn(*ts)
        y.mul_(2)  # allowed for the reference, so it must be for every stage
        assert y._base is None, "the output is a view"
        # ... and both then refuse the backward: the saved output was modified.
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        results.append(y.detach())
    torch.testing.assert_close(results[0], results[1])


# ---------------------------------------------------------------------------
# Forward-mode AD and torch.func: right, or a clear error; never zero tangents
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_ad_tangents_match_the_reference(mode, device, bias):
    x, w, b, _ = layer_tensors(device, torch.float64, (3, 2, 5))
    tangents = [torch.randn_like(t) for t in (x, w, b)]
    answers = []
    for fn in (modes.dense(mode), reference):
        with fwAD.dual_level():
            duals = [fwAD.make_dual(p, t) for p, t in zip((x, w, b), tangents)]
            y = fn(duals[0], duals[1], duals[2] if bias else None)
            primal, tangent = fwAD.unpack_dual(y)
            answers.append((primal.clone(), tangent.clone()))
    (p, t), (p_ref, t_ref) = answers
    assert t.abs().sum() > 0
    torch.testing.assert_close(p, p_ref)
    torch.testing.assert_close(t, t_ref)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_gradcheck_forward_and_reverse_with_requires_grad(mode, device):
    """Forward-mode AD on inputs that also require grad, checked numerically."""
    x, w, b, _ = layer_tensors(device, torch.float64, (3, 4), out_f=2)
    ts = [t.requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradcheck(modes.dense(mode), ts, check_forward_ad=True)


TRANSFORMS = ["vmap", "vmap over weight", "grad", "vmap of grad", "jacrev", "jacfwd", "jvp"]


def transform(name, fn, x, w, b):
    """fn under one torch.func transform; returns its result."""
    if name == "vmap":
        return func.vmap(lambda xi: fn(xi, w, b))(x)
    if name == "vmap over weight":
        return func.vmap(lambda wi: fn(x, wi, b))(torch.stack([w, 2 * w, -w]))
    if name == "grad":
        return func.grad(lambda x, w, b: fn(x, w, b).sum(), argnums=(0, 1, 2))(x, w, b)
    if name == "vmap of grad":  # per-sample gradients
        return func.vmap(func.grad(lambda xi, w, b: fn(xi, w, b).pow(2).sum(), argnums=(0, 1, 2)),
                         in_dims=(0, None, None))(x, w, b)
    if name == "jacrev":
        return func.jacrev(fn, argnums=(0, 1, 2))(x, w, b)
    if name == "jacfwd":
        return func.jacfwd(fn, argnums=(0, 1, 2))(x, w, b)
    if name == "jvp":
        return func.jvp(fn, (x, w, b), tuple(torch.ones_like(t) for t in (x, w, b)))
    raise ValueError(name)


@pytest.mark.parametrize("mode, device", MODE_DEVICE)
@pytest.mark.parametrize("name", TRANSFORMS)
def test_torch_func_transform_matches_the_reference(mode, device, name):
    """Every cell of the torch.func tables in py/README.md and cpp/README.md."""
    x, w, b, _ = layer_tensors(device, torch.float64, (4, 5))
    got = transform(name, modes.dense(mode), x, w, b)
    expected = transform(name, reference, x, w, b)
    flat, flat_ref = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)
    assert len(flat) == len(flat_ref)
    for a, e in zip(flat, flat_ref):
        torch.testing.assert_close(a, e)
    assert any(a.abs().sum() > 0 for a in flat)


# ---------------------------------------------------------------------------
# A Dense module saves whole, like nn.Linear
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, device", MODE_DEVICE)
def test_dense_module_pickles_and_saves_whole(mode, device):
    layer = modes.Dense(5, 3, mode=mode, device=device, dtype=torch.float64)
    x = torch.randn(4, 5, device=device, dtype=torch.float64)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    for loaded in (torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(layer))):
        assert isinstance(loaded, modes.Dense) and loaded.mode == mode
        torch.testing.assert_close(loaded(x), layer(x))
        loaded(x).sum().backward()
        assert loaded.weight.grad is not None
