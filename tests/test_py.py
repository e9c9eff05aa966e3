"""Stage py under torch.compile: one graph, forward and backward, and forward-mode AD kept."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import func
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn import functional as F

import modes
from conftest import assert_compiled_step_matches


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


def test_the_comment_on_apply_quotes_the_recorded_inspect_binding():
    """py/dense.py says what Function.apply's inspect binding costs; the figure is the record's."""
    import json
    import re

    from conftest import ROOT

    record = json.loads((ROOT / "docs" / "results" / "cpp_overhead.json").read_text())
    binding = next(r["median_us"] for r in record["rows"] if r["name"] == "py: inspect binding alone")
    source = (ROOT / "py" / "dense.py").read_text()
    quoted = re.search(r"with inspect \(about (\d+) µs\s*#? a call here \(docs/results/cpp_overhead\.json\)", source)
    assert quoted, "py/dense.py no longer quotes the binding's cost with its record"
    assert int(quoted.group(1)) == round(binding)
