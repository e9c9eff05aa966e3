"""Stage py under torch.compile (one graph, forward and backward, forward-mode AD kept) and in eager
mode (public APIs only: Function.apply)."""

from __future__ import annotations

import ast
import json

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import func
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn import functional as F

import modes
from conftest import ROOT, assert_compiled_step_matches


def reference(x, w, b):
    return torch.sigmoid(F.linear(x, w, b))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_compile_fullgraph_one_graph_for_every_batch_size(dtype, bias):
    """fullgraph=True fails on any graph break; the counter shows one graph for three batch sizes."""
    torch.manual_seed(0)
    layer = modes.Dense(8, 5, bias=bias, mode="py", dtype=dtype)
    counter = CompileCounterWithBackend("inductor")

    def step(x):
        return (layer(x) * 2).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=counter)
    for batch in (6, 3, 11):
        assert_compiled_step_matches(layer, step, compiled, torch.randn(batch, 8, dtype=dtype))
    assert counter.frame_count == 1


@pytest.mark.slow
def test_compile_fullgraph_with_leading_dimensions():
    layer = modes.Dense(4, 3, mode="py")
    x = torch.randn(2, 5, 4, requires_grad=True)
    y = torch.compile(layer, fullgraph=True)(x)
    torch.testing.assert_close(y, reference(x, layer.weight, layer.bias))
    (gx,) = torch.autograd.grad(y.sum(), x)
    (rx,) = torch.autograd.grad(reference(x, layer.weight, layer.bias).sum(), x)
    torch.testing.assert_close(gx, rx)


def test_the_traced_function_has_no_custom_jvp_and_the_forward_mode_one_does():
    stage = modes.stage("py")
    assert stage.DenseFunction.jvp is torch.autograd.Function.jvp  # Dynamo refuses a custom jvp
    assert stage.DenseFunctionForwardAD.jvp is not torch.autograd.Function.jvp


def _inputs():
    g = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((3, 6), (4, 6), (4,)))
    tangents = tuple(torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (x, w, b))
    return (x, w, b), tangents


def test_forward_mode_ad_in_eager_uses_the_hand_written_jvp():
    (x, w, b), (tx, tw, tb) = _inputs()
    with fwAD.dual_level():
        out = modes.dense("py")(fwAD.make_dual(x, tx), fwAD.make_dual(w, tw), fwAD.make_dual(b, tb))
        tangent = fwAD.unpack_dual(out).tangent
    _, expected = func.jvp(reference, (x, w, b), (tx, tw, tb))
    torch.testing.assert_close(tangent, expected)


@pytest.mark.slow
@pytest.mark.parametrize("fullgraph", [False, True])
def test_forward_mode_ad_under_compile(fullgraph):
    (x, w, b), tangents = _inputs()
    fn = modes.dense("py")
    out = torch.compile(lambda *a: func.jvp(fn, a, tangents), fullgraph=fullgraph)(x, w, b)
    torch.testing.assert_close(out, func.jvp(reference, (x, w, b), tangents))


def test_the_stage_names_no_private_torch_api():
    """Chapter 1 is the first file a learner reads: it uses torch's public APIs only, so no name
    it imports or looks up starts with an underscore (dunders aside)."""
    tree = ast.parse((ROOT / "py" / "dense.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(part for a in node.names for part in a.name.split("."))
    private = {n for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))}
    assert not private, f"py/dense.py uses private names: {sorted(private)}"


def test_eager_calls_go_through_the_public_function_apply(monkeypatch):
    """Outside torch.compile, dense() calls the Function's own apply (which binds the arguments
    and unwraps torch.func's tensors itself), with or without autograd recording."""
    stage = modes.stage("py")
    calls = []
    apply = stage.DenseFunctionForwardAD.apply
    monkeypatch.setattr(stage.DenseFunctionForwardAD, "apply", staticmethod(lambda *a: calls.append(a) or apply(*a)))
    (x, w, b), _ = _inputs()
    y = stage.dense(x.requires_grad_(), w, b)
    with torch.no_grad():
        stage.dense(x, w, b)
    assert len(calls) == 2 and all(c[0] is x for c in calls)
    torch.testing.assert_close(y, reference(x, w, b))


def test_the_py_stage_has_no_speed_goal_at_small_batch():
    """At B=1 the py stage pays Function.apply's Python entry on every call (chapter 2 measures
    it): the sweep sets it no goal there, and the committed sweep's summary shows none."""
    import benchmark

    point = {"batch": 1, "in": 64, "out": 64, "elementwise_share": 0.2,
             "ratios": {"py": {"ratio": 3.0, "ci": [2.9, 3.1]}}}
    assert benchmark.sweep_goals(point) == []
    record = json.loads((ROOT / "docs" / "results" / "cpu_sweep.json").read_text())
    summary = benchmark.sweep_summary(record)
    assert "py <= 1.05 at 1024^3" in summary and "B=1, I=O=64" not in summary.split("Goals met")[1]
