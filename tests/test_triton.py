"""Stage triton (chapter 6): the op's registration, the interpreter, determinism, its scripts, and
what the compiler did for sm_90. The contract every stage meets is in test_dense.py and
test_edge_cases.py; here is what is the triton stage's own."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import modes
from conftest import GPU, NO_GPU, REASONS, ROOT, load_script, run_script

# Where Triton is missing, what needs it skips with the reason; the rest (Triton missing, the
# records, the tables) runs.
needs_triton = pytest.mark.skipif(REASONS["triton"] is not None, reason=f"mode triton: {REASONS['triton']}")
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason=NO_GPU)]


@pytest.fixture(scope="module")
def stage():
    if REASONS["triton"] is not None:
        pytest.skip(f"mode triton: {REASONS['triton']}")
    modes.dense("triton")  # loads the stage and registers its ops
    return modes.stage("triton")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=needs_gpu)])
def device(request, stage):
    """The kernel tests run once per device: on CPU tensors through Triton's interpreter (where
    there is no GPU, always), and compiled on CUDA tensors (gpu-marked). The stage runs one way
    per process (tiles/dense.py), so on a GPU machine one of the two skips."""
    if request.param == "cpu" and GPU and not stage.INTERPRETED:
        pytest.skip("the stage compiles its kernels for the GPU in this process (TRITON_INTERPRET=1 would run "
                    "the interpreter on CPU tensors)")
    if request.param == "cuda" and stage.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the stage runs Triton's interpreter on CPU tensors")
    return request.param


def _tensors(shape_x, out_f, device, bias=True, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape_x, generator=gen, dtype=dtype).to(device)
    w = torch.randn(out_f, shape_x[-1], generator=gen, dtype=dtype).to(device)
    b = torch.randn(out_f, generator=gen, dtype=dtype).to(device) if bias else None
    return x, w, b


def _reference(x, w, b):
    return torch.sigmoid(torch.nn.functional.linear(x, w, b))


# ---------------------------------------------------------------------------
# How the stage runs here
# ---------------------------------------------------------------------------

def test_the_kernels_run_interpreted_on_cpu_and_compiled_on_cuda(stage, device):
    """Without a GPU the kernels are Python functions run by Triton's interpreter on CPU tensors;
    on a GPU they are compiled and take CUDA tensors. Either way, the reference's answer."""
    from triton.runtime.interpreter import InterpretedFunction

    for kernel in (stage.forward_kernel, stage.grad_x_kernel, stage.grad_w_kernel):
        assert isinstance(kernel, InterpretedFunction) == (device == "cpu"), type(kernel)
    x, w, b = _tensors((5, 4), 3, device)
    y = modes.dense("triton")(x, w, b)
    assert y.device.type == device
    torch.testing.assert_close(y, _reference(x, w, b))


@pytest.mark.slow
@needs_triton
@pytest.mark.skipif(GPU, reason="the interpreter's order of imports matters only without a GPU")
def test_the_interpreter_is_chosen_before_torch_compile_imports_triton():
    """Triton decorates tl.zeros & co. at its first import, interpreted or not, for good. modes
    chooses the interpreter as it loads, so torch.compile may run first; a process that imported
    Triton before modes gets one clear line, not a failure deep inside a kernel."""
    compile_first = ("import torch; torch.compile(lambda x: x.sin(), fullgraph=True)(torch.randn(3)); "
                     "import sys; assert 'triton' in sys.modules; ")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's shell has it

    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env)

    after = run("import modes; " + compile_first +
                "y = modes.dense('triton')(torch.randn(3, 4), torch.randn(2, 4), None); print(tuple(y.shape))")
    assert after.returncode == 0 and after.stdout.strip() == "(3, 2)", after.stderr[-2000:]
    before = run(compile_first + "import modes; modes.dense('triton')")
    assert before.returncode != 0
    assert "Triton was imported before TRITON_INTERPRET=1 was set" in before.stderr.splitlines()[-1]


def test_float32_is_ieee_unless_torch_allows_tf32(stage):
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert stage.precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        # The interpreter multiplies in NumPy, in full precision, whatever tl.dot is told.
        assert stage.precision(torch.float32) == ("ieee" if stage.INTERPRETED else "tf32")
        assert stage.precision(torch.float64) == "ieee"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.skipif(GPU, reason="checks the interpreter's device rule; on a GPU the next test checks the other")
def test_interpreted_stage_refuses_a_tensor_on_another_device(stage):
    with pytest.raises(ValueError, match="interpreter in this process, on CPU tensors; x is on meta"):
        stage._check_device(torch.empty(2, device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=NO_GPU)
def test_compiled_stage_refuses_cpu_tensors_with_the_way_out(stage):
    if stage.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the stage runs the interpreter")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        modes.dense("triton")(torch.randn(3, 4), torch.randn(2, 4))


# ---------------------------------------------------------------------------
# The ops: torch.library's checks, torch.compile
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape_x, bias, dtype", [((5, 4), True, torch.float32), ((5, 4), False, torch.float32),
                                                  ((2, 3, 4), True, torch.float32), ((4,), True, torch.float32),
                                                  ((5, 4), True, torch.bfloat16)])
def test_opcheck(stage, device, shape_x, bias, dtype):
    x, w, b = _tensors(shape_x, 3, device, bias, dtype=dtype)
    ops = torch.ops.dense_triton
    torch.library.opcheck(ops.forward.default, (x.requires_grad_(), w.requires_grad_(),
                                                b.requires_grad_() if bias else None))
    y = ops.forward(x, w, b).detach()
    for mask in ([True, True, bias], [False, True, False], [True, False, bias], [False, False, bias]):
        torch.library.opcheck(ops.backward.default, (torch.randn_like(y), x.detach(), w.detach(), y, mask))


@pytest.mark.parametrize("bias", [True, False])
def test_the_op_called_directly_gets_the_references_tangents(stage, device, bias):
    """torch.ops.dense_triton.forward itself, not only modes.dense, under forward-mode AD: the
    reference's tangents from torch.func.jvp and torch.autograd.forward_ad, also with a tangent
    on one input alone; never zeros or none."""
    from torch.autograd import forward_ad

    primals = _tensors((2, 3, 8), 5, device, bias, dtype=torch.float64)
    tangents = _tensors((2, 3, 8), 5, device, bias, dtype=torch.float64, seed=1)
    op = torch.ops.dense_triton.forward
    given = [i for i, t in enumerate(primals) if t is not None]

    def call(fn, *tensors):  # jvp takes tensors only: no bias is no argument
        args = [None, None, None]
        for i, t in zip(given, tensors):
            args[i] = t
        return fn(*args)

    pick = tuple(primals[i] for i in given), tuple(tangents[i] for i in given)
    want_y, want_t = torch.func.jvp(lambda *a: call(_reference, *a), *pick)
    got_y, got_t = torch.func.jvp(lambda *a: call(op, *a), *pick)
    torch.testing.assert_close(got_y, want_y)
    torch.testing.assert_close(got_t, want_t)
    assert got_t.abs().max() > 0.1  # the check can fail: zero tangents are far from these
    argnums = tuple(range(len(given)))
    for got, want in zip(torch.func.jacfwd(lambda *a: call(op, *a), argnums=argnums)(*pick[0]),
                         torch.func.jacfwd(lambda *a: call(_reference, *a), argnums=argnums)(*pick[0])):
        torch.testing.assert_close(got, want)
    for only in given:  # one input's tangent at a time, through torch.autograd.forward_ad
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(p, t) if i == only else p
                     for i, (p, t) in enumerate(zip(primals, tangents))]
            got = forward_ad.unpack_dual(op(*duals)).tangent
            duals = [forward_ad.make_dual(p, t) if i == only else p
                     for i, (p, t) in enumerate(zip(primals, tangents))]
            want = forward_ad.unpack_dual(_reference(*duals)).tangent
        assert got is not None, f"no tangent with one on input {only}"
        torch.testing.assert_close(got, want)


def test_the_op_called_directly_passes_gradcheck_forward_and_reverse(stage, device):
    x, w, b = (t.requires_grad_() for t in _tensors((4, 3), 2, device, dtype=torch.float64))
    assert torch.autograd.gradcheck(torch.ops.dense_triton.forward, (x, w, b), check_forward_ad=True,
                                    check_backward_ad=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_torch_compile_fullgraph_matches_eager(stage, device, dtype):
    torch._dynamo.reset()
    layer = modes.Dense(8, 5, mode="triton", device=device, dtype=dtype)

    def step(x):
        return (layer(x) * 2).sum()

    x = torch.randn(6, 8, device=device, dtype=dtype)
    eager = step(x)
    eager.backward()
    eager_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    compiled = torch.compile(step, fullgraph=True)(x)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    for p, g in zip(layer.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd:UserWarning")  # torch's own test backend
def test_compiled_graph_calls_the_ops(stage, device):
    """Whether torch.compile keeps the op whole (interpreter: a custom_op) or traces into its
    kernels (GPU: a triton_op), the forward and the backward of the stage are in the graph."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    layer = modes.Dense(8, 5, mode="triton", device=device)
    loss = torch.compile(lambda x: layer(x).sum(), backend=backend, fullgraph=True)(torch.randn(4, 8, device=device))
    loss.backward()
    forward = "\n".join(g.code for g in backend.fw_graphs)
    backward = "\n".join(g.code for g in backend.bw_graphs)
    if stage.INTERPRETED:
        assert "dense_triton.forward" in forward and "dense_triton.backward" in backward
    else:
        assert "triton_kernel_wrapper" in forward and "triton_kernel_wrapper" in backward


# ---------------------------------------------------------------------------
# What the kernels compute
# ---------------------------------------------------------------------------

def test_bias_gradient_is_bit_identical_run_to_run(stage, device):
    x, w, b = _tensors((257, 33), 19, device)
    y = modes.dense("triton")(x, w, b)
    g = torch.randn_like(y)
    runs = [torch.ops.dense_triton.backward(g, x, w, y, [True, True, True]) for _ in range(3)]
    for later in runs[1:]:
        for a, e in zip(runs[0], later):
            assert torch.equal(a, e)


def test_one_rows_bias_gradient_is_torch_sigmoid_backward_bit_for_bit(stage, device):
    """dz = g · (1 − y) · y in the order ATen multiplies: the same bits, not just close."""
    x, w, b = _tensors((1, 7), 45, device)
    y = modes.dense("triton")(x, w, b)
    g = torch.randn_like(y)
    _, _, db = torch.ops.dense_triton.backward(g, x, w, y, [False, False, True])
    assert torch.equal(db, torch.ops.aten.sigmoid_backward(g, y)[0])


@pytest.mark.parametrize("mask", [[False, False, True], [False, True, False], [True, False, False]])
def test_each_gradient_alone_matches_all_together(stage, device, mask):
    x, w, b = _tensors((37, 45), 29, device, dtype=torch.float64)
    y = modes.dense("triton")(x, w, b)
    g = torch.randn_like(y)
    together = torch.ops.dense_triton.backward(g, x, w, y, [True, True, True])
    alone = torch.ops.dense_triton.backward(g, x, w, y, mask)
    for want, a, t in zip(mask, alone, together):
        assert torch.equal(a, t) if want else a.numel() == 0


def test_strided_inputs_need_no_copy_and_give_the_same_answer(stage, device):
    """x, W and the gradient transposed, W and b with stride 2, g expanded: the kernels take
    every tensor's two strides."""
    x, w, b = _tensors((23, 17), 11, device, dtype=torch.float64)
    wide = torch.randn(11, 34, dtype=torch.float64, device=device)
    wide[:, ::2] = w
    bias2 = torch.zeros(22, dtype=torch.float64, device=device)
    bias2[::2] = b
    xt = x.t().contiguous().t()
    for args in ((xt, w, b), (x, wide[:, ::2], bias2[::2])):
        torch.testing.assert_close(modes.dense("triton")(*args), torch.sigmoid(torch.nn.functional.linear(x, w, b)))
    y = modes.dense("triton")(x, w, b)
    g = torch.ones(1, 1, dtype=torch.float64, device=device).expand_as(y)
    got = torch.ops.dense_triton.backward(g, xt, w, y, [True, True, True])
    want = torch.ops.dense_triton.backward(g.contiguous(), x, w, y, [True, True, True])
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_double_backward_works(stage, device):
    """create_graph=True (and so torch.func.grad, which always asks for it) gets a backward
    made of torch's differentiable ops: gradients of gradients are right."""
    ts = [t.requires_grad_() for t in _tensors((3, 4), 2, device, dtype=torch.float64)]
    assert torch.autograd.gradgradcheck(modes.dense("triton"), ts)


def test_every_launch_runs_inside_the_guard_for_its_inputs_device(stage, device, monkeypatch):
    """Triton launches on the current CUDA device, whatever device the tensors are on: each
    launch of both ops runs inside _device_guard(x.device), which makes x's GPU current."""
    guard_for_cuda1 = stage._device_guard(torch.device("cuda", 1))
    assert isinstance(guard_for_cuda1, torch.cuda.device) and guard_for_cuda1.idx == 1
    assert isinstance(stage._device_guard(torch.device("cpu")), contextlib.nullcontext)

    inside, launches = [], []
    real_guard, real_wrap = stage._device_guard, stage.wrap_triton

    @contextlib.contextmanager
    def guard(dev):
        with real_guard(dev):
            inside.append(dev)
            try:
                yield
            finally:
                inside.pop()

    class Launcher:
        def __init__(self, kernel):
            self.wrapped = real_wrap(kernel)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(list(inside))
                return self.wrapped[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(stage, "_device_guard", guard)
    monkeypatch.setattr(stage, "wrap_triton", Launcher)
    x, w, b = _tensors((7, 5), 3, device)
    y = torch.ops.dense_triton.forward(x, w, b)
    torch.ops.dense_triton.backward(torch.ones_like(y), x, w, y, [True, True, True])
    assert launches == [[x.device]] * 3  # the forward, grad x, grad W and b


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: x on cuda:1 while cuda:0 is current")
def test_tensors_on_the_second_gpu_are_computed_there(stage):
    if stage.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the stage runs Triton's interpreter on CPU tensors")
    torch.cuda.set_device(0)
    x, w, b = (t.requires_grad_() for t in _tensors((37, 45), 29, "cuda:1", dtype=torch.float64))
    y = modes.dense("triton")(x, w, b)
    got = (y, *torch.autograd.grad(y.sum(), (x, w, b)))
    want = _reference(x, w, b)
    want = (want, *torch.autograd.grad(want.sum(), (x, w, b)))
    for a, e in zip(got, want):
        assert a.device == torch.device("cuda", 1)
        torch.testing.assert_close(a, e)
    assert torch.cuda.current_device() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason=NO_GPU)
@pytest.mark.parametrize("operand", ["x", "weight"])
def test_offsets_past_two_to_the_31_elements(stage, operand):
    """Columns 2²⁷ elements apart (16 GiB of float32): the forward kernel's step along K,
    BLOCK_K · stride, is 2³¹ or more, which wraps in 32 bits."""
    if stage.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the stage runs Triton's interpreter on CPU tensors")
    stride, k = 2 ** 27, 33  # K = 33: a second step along K, at least 2³¹ elements on
    x, w, b = _tensors((3, k), 5, "cpu")
    small = x if operand == "x" else w
    store = torch.empty((k - 1) * stride + small.shape[0], device="cuda")
    big = store.as_strided(small.shape, (1, stride))
    big.copy_(small)
    args = (big, w.cuda(), b.cuda()) if operand == "x" else (x.cuda(), big, b.cuda())
    y = modes.dense("triton")(*args)
    del store, big, args
    torch.testing.assert_close(y.cpu(), _reference(x, w, b), atol=1e-5, rtol=1e-4)


# Every kernel compiled for sm_90 (no GPU needed), printed as Triton's first IR (TTIR). The
# strides are 37: neither 1 nor a multiple of 16, so Triton specialises none of them away.
TTIR_OF_THE_KERNELS = """
import importlib.util, json, os
os.environ["TRITON_INTERPRET"] = "0"  # read as kernels.py runs: compile, do not interpret
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

spec = importlib.util.spec_from_file_location("kernels", "tiles/kernels.py")
kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernels)
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
t, n = torch.empty(16, 16), 37
tiles = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1, "PRECISION": "ieee"}
launches = {"forward_kernel": ((t,) * 4 + (n,) * 10, {"HAS_BIAS": True}),
            "grad_x_kernel": ((t,) * 4 + (n,) * 11, {}),
            "grad_w_kernel": ((t,) * 5 + (n,) * 11, {"DW": True, "DB": True})}
ttir = {}
for name, (args, constants) in launches.items():
    fn, kwargs = getattr(kernels, name), {**constants, **tiles}
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    ttir[name] = {"strides": [a for a in fn.arg_names if a.startswith("stride_")],
                  "ttir": triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                         options=options.__dict__).asm["ttir"]}
print(json.dumps(ttir))
"""


@needs_triton
@pytest.mark.slow
def test_compiled_kernels_widen_every_stride_to_64_bits_first():
    """Offsets are 64-bit (tiles/kernels.py): each use of a 32-bit stride argument is its sign
    extension to i64, so no product with a stride (BLOCK_K · stride included) is 32-bit."""
    result = run_script("-c", TTIR_OF_THE_KERNELS, env={"TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    for kernel, compiled in json.loads(result.stdout).items():
        lines = [line.strip() for line in compiled["ttir"].splitlines()]
        signature = next(line for line in lines if line.startswith("tt.func"))
        assert re.findall(r"%(stride_\w+): i32", signature) == compiled["strides"], signature
        for stride in compiled["strides"]:
            uses = [line.split(" loc(")[0] for line in lines if re.search(rf"%{stride}\b", line) and line != signature]
            assert uses, (kernel, stride)
            for use in uses:
                assert re.fullmatch(rf"%\w+ = arith\.extsi %{stride} : i32 to i64", use), (kernel, use)


@pytest.mark.slow
def test_torch_compile_of_jvp_runs_it_eagerly_or_says_why(stage, device):
    """A graph cannot hold the forward-mode formula (tiles/dense.py: NO_FORWARD_MODE_GRAPH), so
    torch.compile runs torch.func.jvp of the stage eagerly, with the reference's tangents; with
    fullgraph=True it fails with that reason, not with zero tangents."""
    primals = _tensors((6, 8), 5, device, dtype=torch.float64)
    tangents = _tensors((6, 8), 5, device, dtype=torch.float64, seed=1)
    dense = modes.dense("triton")

    def jvp(x, w, b):
        return torch.func.jvp(dense, (x, w, b), tangents)

    want = torch.func.jvp(_reference, primals, tangents)
    torch._dynamo.reset()
    for got, expected in zip(torch.compile(jvp)(*primals), want):
        torch.testing.assert_close(got, expected)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(stage.NO_FORWARD_MODE_GRAPH)):
        torch.compile(jvp, fullgraph=True)(*primals)



@pytest.mark.slow
def test_torch_compile_of_jvp_of_the_op_called_directly_says_why(stage, device):
    """Dynamo cannot leave a direct call of the op out of its graph, and a graph cannot hold the
    forward-mode formula: the compiled jvp fails with the way out (NO_FORWARD_MODE_GRAPH_OP)
    instead of returning zero tangents; eager jvp afterwards is unaffected."""
    primals = _tensors((6, 8), 5, device, dtype=torch.float64)
    tangents = _tensors((6, 8), 5, device, dtype=torch.float64, seed=1)
    op = torch.ops.dense_triton.forward

    def jvp(x, w, b):
        return torch.func.jvp(op, (x, w, b), tangents)

    for fullgraph in (False, True):
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match=re.escape(stage.NO_FORWARD_MODE_GRAPH_OP)):
            torch.compile(jvp, fullgraph=fullgraph)(*primals)
    torch.testing.assert_close(jvp(*primals)[1], torch.func.jvp(_reference, primals, tangents)[1])


# ---------------------------------------------------------------------------
# bfloat16 and float16: float32 accumulators, one rounding, and the interpreter's bfloat16
# ---------------------------------------------------------------------------

LOW = [torch.bfloat16, torch.float16]


def _run(fn, x, w, b, g, dtype=None):
    """fn's y and its gradients (x, W, then b if any) for the output gradient g, on fresh leaves
    (in ``dtype`` if given: float64 makes the truth from the same rounded inputs)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (x, w, b) if t is not None]
    y = fn(*leaves) if b is not None else fn(*leaves, None)
    return (y, *torch.autograd.grad(y, leaves, g.to(y.dtype)))


def _assert_within_eager_rule(got, eager, truth, dtype=None):
    """The stage's error against the float64 truth is at most 4× eager's own error in the same
    dtype, plus one rounding of the largest output (half the dtype's eps times it): the error of
    any result rounded once to that dtype, which 4× a lucky eager error of 0 would deny. Where
    the truth is NaN or ±inf the stage's result must be the same."""
    dtype = dtype or got.dtype
    got, eager = got.double(), eager.double()
    finite = truth.isfinite()
    torch.testing.assert_close(got[~finite], truth[~finite], rtol=0, atol=0, equal_nan=True)
    g, e, t = got[finite], eager[finite], truth[finite]
    if t.numel() == 0:
        return
    stage_error, eager_error = (g - t).abs().max().item(), (e - t).abs().max().item()
    floor = torch.finfo(dtype).eps / 2 * t.abs().max().item()
    assert stage_error <= 4 * eager_error + floor, (stage_error, eager_error, floor)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("shape_x, out_f, bias", [((37, 45), 29, True), ((3, 5, 19), 7, False)])
def test_low_precision_forward_and_gradients_within_4x_eager(stage, device, dtype, shape_x, out_f, bias):
    """bfloat16 and float16 in, the same type out, forward and backward, as nn.Linear + sigmoid;
    each result as close to the float64 truth as the rule allows (_assert_within_eager_rule)."""
    x, w, b = _tensors(shape_x, out_f, device, bias, dtype=dtype)
    g = torch.randn((*shape_x[:-1], out_f), generator=torch.Generator().manual_seed(3), dtype=dtype).to(device)
    got = _run(modes.dense("triton"), x, w, b, g)
    eager = _run(_reference, x, w, b, g)
    truth = _run(_reference, x, w, b, g, dtype=torch.float64)
    for name, a, e, t in zip(("y", "dx", "dW", "db"), got, eager, truth):
        assert a.dtype == dtype, name
        _assert_within_eager_rule(a, e, t)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_dz_is_float32_maths_rounded_once(stage, device, dtype):
    """dz = g · (1 − y) · y in float32, rounded once to the input's type, as torch's sigmoid
    backward returns it: one row's bias gradient is that, bit for bit (bfloat16's and float16's
    subnormal g included)."""
    x, w, b = _tensors((1, 7), 300, device, dtype=dtype)
    y = modes.dense("triton")(x, w, b)
    g = torch.randn_like(y)
    g[0, :40] *= torch.finfo(dtype).tiny  # subnormal gradients
    _, _, db = torch.ops.dense_triton.backward(g, x, w, y, [False, False, True])
    want = (g.float() * (1 - y.float()) * y.float()).to(dtype)[0]
    assert db.dtype == dtype and torch.equal(db, want)
    if dtype == torch.bfloat16:  # torch's own bfloat16 sigmoid backward computes in float32 too
        assert torch.equal(db, torch.ops.aten.sigmoid_backward(g, y)[0])


def test_the_interpreters_bfloat16_dot_needs_the_workaround(stage):
    """Triton 3.6's interpreter multiplies bfloat16 tl.dot operands as raw bit patterns. Launched
    without the workaround (INTERPRETED=False, the compiled path), grad x's dz W is off by more
    than 1e9 where the truth is of order 1; with it, right to bfloat16's precision. When this
    fails on the first assertion, the interpreter's bfloat16 dot has been fixed."""
    if not stage.INTERPRETED:
        pytest.skip("the stage compiles its kernels in this process: no interpreter to check")
    x, w, b = _tensors((16, 32), 16, "cpu", dtype=torch.bfloat16)
    y = modes.dense("triton")(x, w, b)
    g = torch.randn_like(y)
    truth = (torch.ops.aten.sigmoid_backward(g, y).double() @ w.double())

    def grad_x(interpreted: bool) -> torch.Tensor:
        dx = torch.empty_like(x)
        with stage._quiet():
            stage.grad_x_kernel[(1, 1)](g, y, w, dx, 16, 16, 32, *g.stride(), *y.stride(), *w.stride(), *dx.stride(),
                                        PRECISION="ieee", INTERPRETED=interpreted, **stage.BACKWARD)
        return dx.double()

    assert (grad_x(False) - truth).abs().max() > 1e9
    assert (grad_x(True) - truth).abs().max() <= torch.finfo(torch.bfloat16).eps * truth.abs().max()


CONVERSIONS = '''
import sys

import triton
import triton.language as tl

_widen, _narrow = (getattr(sys.modules["tiles_kernels"], f) for f in ("_widen", "_narrow"))


@triton.jit
def widen(src, dst, INTERPRETED: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + r, _widen(tl.load(src + r), INTERPRETED))


@triton.jit
def narrow(src, dst, INTERPRETED: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + r, _narrow(tl.load(src + r), tl.bfloat16, INTERPRETED))
'''


def _conversion_kernels(tmp_path):
    # A file of their own: Triton reads a kernel's source, so it cannot be made from a string here.
    (tmp_path / "conversions.py").write_text(CONVERSIONS)
    spec = importlib.util.spec_from_file_location("triton_test_conversions", tmp_path / "conversions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same_bits_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return (a.view(bits) == b.view(bits)) | (a.isnan() & b.isnan())


@pytest.mark.parametrize("interpreted", [True, False])
def test_bfloat16_conversions_are_exact_with_the_workaround(stage, device, tmp_path, interpreted):
    """The kernels' bfloat16 ↔ float32 conversions against torch's: every bfloat16 bit pattern
    widened, and 65536 float32 values (ties to even, the largest, subnormals, ±inf, NaN, then
    random bit patterns) rounded to nearest even. INTERPRETED=True: exact everywhere. False, the
    compiled path: exact on a GPU; in Triton 3.6's interpreter, wrong (the workaround's reason),
    subnormals widened wrong and float32 truncated. When this fails there, the interpreter's
    conversions have been fixed."""
    if device == "cuda" and interpreted:
        pytest.skip("the compiled stage never sets INTERPRETED")
    kernels = _conversion_kernels(tmp_path)
    block, n = 1024, 65536
    patterns = torch.arange(n, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(device)
    wide = torch.empty(n, dtype=torch.float32, device=device)
    ties = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -9, -(1 + 2 ** -8 + 2 ** -9), 3.4028235e38, -3.4e38,
            float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40, 2.0 ** -133, 2.0 ** -149, 0.0, -0.0]
    values = torch.randint(-2 ** 31, 2 ** 31, (n,), generator=torch.Generator().manual_seed(0)).to(torch.int32)
    values = values.view(torch.float32)
    values[:len(ties)] = torch.tensor(ties)
    values = values.to(device)
    narrow = torch.empty(n, dtype=torch.bfloat16, device=device)
    with stage._quiet():
        kernels.widen[(n // block,)](patterns, wide, INTERPRETED=interpreted, BLOCK=block)
        kernels.narrow[(n // block,)](values, narrow, INTERPRETED=interpreted, BLOCK=block)
    widened_right = _same_bits_or_both_nan(wide, patterns.float())
    rounded_right = _same_bits_or_both_nan(narrow, values.to(torch.bfloat16))
    if interpreted or not stage.INTERPRETED:
        assert widened_right.all() and rounded_right.all(), (patterns[~widened_right][:5], values[~rounded_right][:5])
        return
    subnormal = (patterns.view(torch.int16) & 0x7F80 == 0) & (patterns.view(torch.int16) & 0x7F != 0)
    assert torch.equal(~widened_right, subnormal), "the interpreter widens bfloat16 subnormals right now"
    assert narrow[2].item() == 1.0, "the interpreter rounds float32 to bfloat16 to nearest now"  # 1 + 2⁻⁸ + 2⁻⁹


def test_special_values_in_bfloat16(stage, device):
    """NaN, +inf and -inf in x, NaN in the bias, in bfloat16: NaN where the float64 truth has NaN,
    0 and 1 where it saturates, forward and backward; finite results by the 4× rule."""
    x, w, b = _tensors((5, 6), 4, device, dtype=torch.bfloat16)
    x[0, 2], x[1, 0], x[2, 0] = float("nan"), float("inf"), float("-inf")
    w[:, 0] = torch.tensor([1.0, -2.0, 0.5, -0.25])  # no zero: ±inf · w is ±inf, never NaN
    b[3] = float("nan")
    g = torch.randn(5, 4, generator=torch.Generator().manual_seed(3), dtype=torch.bfloat16).to(device)
    got = _run(modes.dense("triton"), x, w, b, g)
    truth = _run(_reference, x, w, b, g, dtype=torch.float64)
    assert got[0][0].isnan().all() and torch.equal(got[0][1:3, :3], truth[0][1:3, :3].to(torch.bfloat16))
    for a, e, t in zip(got, _run(_reference, x, w, b, g), truth):
        _assert_within_eager_rule(a, e, t)


@pytest.mark.parametrize("shape_x, out_f", [((0, 5), 3), ((4, 0), 3), ((4, 5), 0), ((2, 0, 5), 3)])
def test_zero_sized_in_bfloat16(stage, device, shape_x, out_f):
    """Empty batches, zero in_features (y = sigmoid(b)), zero out_features: bfloat16 results of
    the right shapes, and the truth's values."""
    x, w, b = _tensors(shape_x, out_f, device, dtype=torch.bfloat16)
    g = torch.ones((*shape_x[:-1], out_f), dtype=torch.bfloat16, device=device)
    got = _run(modes.dense("triton"), x, w, b, g)
    for a, e, t in zip(got, _run(_reference, x, w, b, g), _run(_reference, x, w, b, g, dtype=torch.float64)):
        assert a.dtype == torch.bfloat16 and a.shape == t.shape
        _assert_within_eager_rule(a, e, t)


def test_strided_bfloat16_inputs_give_the_contiguous_bits(stage, device):
    """x transposed, W and b with stride 2, g expanded, in bfloat16: the kernels read through the
    strides, so every result is the contiguous inputs' result, bit for bit."""
    x, w, b = _tensors((23, 17), 11, device, dtype=torch.bfloat16)
    wide = torch.zeros(11, 34, dtype=torch.bfloat16, device=device)
    wide[:, ::2] = w
    bias2 = torch.zeros(22, dtype=torch.bfloat16, device=device)
    bias2[::2] = b
    xt = x.t().contiguous().t()
    g = torch.full((1, 1), 0.75, dtype=torch.bfloat16, device=device).expand(23, 11)
    want = _run(modes.dense("triton"), x, w, b, g.contiguous())
    for args in ((xt, w, b), (x, wide[:, ::2], bias2[::2])):
        assert torch.equal(modes.dense("triton")(*args), want[0])
    got = torch.ops.dense_triton.backward(g, xt, wide[:, ::2], want[0], [True, True, True])
    for a, e in zip(got, want[1:]):
        assert torch.equal(a, e)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("shape_x", [(5, 19), (2, 3, 19)])
def test_autocast_gives_the_low_precision_out_and_float32_weight_grads(stage, device, dtype, shape_x):
    """Under torch.autocast, float32 parameters and input: y in the autocast type, as nn.Linear's
    is, and float32 parameter gradients; values by the 4× rule against eager under autocast, with
    the truth from the inputs autocast rounds."""
    layer = modes.Dense(19, 7, mode="triton", device=device)
    twin = torch.nn.Linear(19, 7, device=device)
    twin.load_state_dict(layer.state_dict())
    x = torch.randn(shape_x, generator=torch.Generator().manual_seed(1)).to(device)
    g = torch.randn((*shape_x[:-1], 7), generator=torch.Generator().manual_seed(2)).to(device)
    results = []
    for module, act in ((layer, lambda z: z), (twin, torch.sigmoid)):
        with torch.autocast(device, dtype=dtype):
            y = act(module(x))
        assert y.dtype == dtype
        (y.float() * g).sum().backward()
        assert module.weight.grad.dtype == module.bias.grad.dtype == torch.float32
        results.append((y, module.weight.grad, module.bias.grad))
    cast = [t.detach().to(dtype) for t in (x, layer.weight, layer.bias)]
    _, *truth = _run(_reference, *cast, g.to(dtype), dtype=torch.float64)
    y_truth = _reference(*(t.double() for t in cast))
    for got, eager, t in zip(results[0], results[1], (y_truth, *truth[1:])):
        _assert_within_eager_rule(got, eager, t, dtype=dtype)


def test_every_launch_says_how_the_kernels_run(stage, device, monkeypatch):
    """The stage passes its own INTERPRETED to each launch: the workaround in the interpreter,
    the bfloat16 dot itself compiled."""
    seen, real_wrap = [], stage.wrap_triton

    class Launcher:
        def __init__(self, kernel):
            self.wrapped = real_wrap(kernel)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs.get("INTERPRETED"))
                return self.wrapped[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(stage, "wrap_triton", Launcher)
    x, w, b = _tensors((7, 5), 3, device, dtype=torch.bfloat16)
    y = torch.ops.dense_triton.forward(x, w, b)
    torch.ops.dense_triton.backward(torch.ones_like(y), x, w, y, [True, True, True])
    assert seen == [stage.INTERPRETED] * 3


def test_a_type_no_mode_takes_is_named_with_those_dense_takes(stage, device):
    with pytest.raises(TypeError, match="^x has dtype torch.int32; Dense supports float32, float64, bfloat16 and "
                                        "float16$"):
        torch.ops.dense_triton.forward(*(t.to(torch.int32) for t in _tensors((3, 4), 2, device)))


# ---------------------------------------------------------------------------
# Triton missing: a folder named triton/ must not pass for it
# ---------------------------------------------------------------------------

WITHOUT_TRITON = """
import importlib.machinery, sys
STRAY = {stray!r}
if STRAY:  # "triton" found only in STRAY's folder: an empty triton/ there, a namespace package
    sys.modules.pop("triton", None)
    class Stray(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "triton":
                return importlib.machinery.PathFinder.find_spec(name, [STRAY], target)
            return None
    sys.meta_path.insert(0, Stray)
else:  # no Triton at all
    sys.modules["triton"] = None
from torch.utils._triton import has_triton_package
print(has_triton_package())
import modes
print(modes.available()["triton"])
try:
    modes.Dense(4, 2, mode="triton")
except RuntimeError as e:
    print(e)
"""


def test_the_repository_root_holds_nothing_importable_as_triton():
    """A folder triton/ there would be imported as Triton wherever Triton is missing."""
    assert importlib.machinery.PathFinder.find_spec("triton", [str(ROOT)]) is None


@pytest.mark.parametrize("stray_folder", [False, True])
def test_without_triton_the_mode_says_what_to_install(tmp_path, stray_folder):
    (tmp_path / "triton").mkdir()
    result = run_script("-c", WITHOUT_TRITON.format(stray=str(tmp_path) if stray_folder else ""))
    assert result.returncode == 0, result.stderr
    torch_sees, reason, error = result.stdout.strip().splitlines()
    # torch takes any importable "triton" for Triton (and then fails inside torch.compile): the
    # reason the stage's folder is tiles/. modes looks at the spec's origin instead.
    assert torch_sees == str(stray_folder)
    assert reason == f"needs Triton (optional): {modes.TRITON_INSTALL}"
    assert error == f"mode 'triton' is not available here: {reason}"


# ---------------------------------------------------------------------------
# The scripts
# ---------------------------------------------------------------------------

@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@needs_triton
@pytest.mark.skipif(GPU, reason="checks the interpreter's cost estimate")
def test_grad_check_refuses_a_shape_the_interpreter_would_take_minutes_over():
    """The generic estimate (100 µs a call) passes B=8, I=O=64; the interpreter's timed calls do not."""
    result = run_script("grad_check.py", "triton", "-b", "8", "-i", "64", "-o", "64")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "in Triton's interpreter would take about" in result.stderr and "Traceback" not in result.stderr


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(GPU, reason="checks what the benchmark says without a GPU")
def test_benchmark_says_the_interpreter_is_no_speed_measurement():
    result = run_script("benchmark.py", "-m", "triton", "-b", "4", "-i", "4", "-o", "4", "--rounds", "2")
    assert result.returncode == 0, result.stderr
    assert "no speed measurement" in result.stderr and "| triton |" not in result.stdout
    both = run_script("benchmark.py", "-m", "all", "-b", "4", "-i", "4", "-o", "4", "--rounds", "2")
    assert both.returncode == 0, both.stderr
    assert "| py |" in both.stdout and "| triton |" not in both.stdout


@pytest.mark.slow  # seconds of process start-up for a rarely broken property
@needs_triton
def test_gpu_timing_script_smoke_run_checks_every_line():
    result = run_script("tiles/bench_gpu.py", "--smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("reference", "triton", "reference, TF32", "triton, TF32"):
        assert f"PASS  {line}: " in result.stdout
    assert "nothing was timed" in result.stdout


@needs_triton
@pytest.mark.skipif(GPU, reason="checks the refusal without a GPU")
def test_gpu_timing_script_refuses_to_time_the_interpreter():
    result = run_script("tiles/bench_gpu.py", "-b", "8", "-i", "8", "-o", "8")
    assert result.returncode == 2 and "no speed measurement" in result.stderr
    assert "Traceback" not in result.stderr


def test_gpu_timing_table_shows_every_line():
    bench = load_script("tiles/bench_gpu.py")
    line = {"forward_us": 2.0, "forward_spread_us": 0.1, "fwd_bwd_us": 6.0, "fwd_bwd_spread_us": 0.2,
            "forward_tflops": 1.0, "fwd_bwd_tflops": 1.0, "ratio_to_reference": 1.0, "ratio_ci": [0.9, 1.1],
            "verdict": "no significant difference"}
    record = {"device": "GPU", "torch": "t", "triton": "3.6.0", "dtype": "float32", "rounds": 20,
              "shape": {"batch": 8, "in": 8, "out": 8}, "autotuned": "BLOCK_M: 128", "skipped": {"cuda": "why"},
              "date": "d", "command": "c", "results": [{"line": n, "tf32": "TF32" in n, **line}
                                                       for n in ("reference", "triton", "triton, TF32")]}
    text = bench.table(record)
    assert "| triton, TF32 | yes |" in text and "| triton | no |" in text and "Not timed: cuda (why)" in text


@pytest.mark.parametrize("script", ["tiles/compiler_report.py", "tiles/bench_gpu.py"])
def test_help_has_safe_examples(script):
    result = run_script(script, "--help")
    assert result.returncode == 0 and "Examples:" in result.stdout and f"python {script}" in result.stdout


# ---------------------------------------------------------------------------
# What the compiler did for sm_90: the committed record, and today's compile
# ---------------------------------------------------------------------------

RECORD = ROOT / "docs" / "results" / "triton_static_sm90.json"


def test_the_chapter_shows_the_committed_record():
    report = load_script("tiles/compiler_report.py")
    record = json.loads(RECORD.read_text())
    text = report.table(record)
    chapter = (ROOT / "tiles" / "README.md").read_text()
    assert f"<!-- triton_static: {RECORD.relative_to(ROOT)} -->\n{text}\n<!-- end triton_static -->" in chapter
    assert "hand-written v8" in text and "Triton forward" in text


@needs_triton
@pytest.mark.slow
def test_a_fresh_compile_gives_the_committed_figures(tmp_path):
    """Same Triton release as the record: the same registers, shared memory and instruction counts."""
    import triton

    record = json.loads(RECORD.read_text())
    if triton.__version__ != record["triton"]:
        pytest.skip(f"the record was made with Triton {record['triton']}; this is {triton.__version__}")
    out = tmp_path / "static.json"
    result = run_script("tiles/compiler_report.py", "--json", str(out))
    assert result.returncode == 0, result.stderr
    fresh = json.loads(out.read_text())
    keys = ("registers", "spill_bytes", "dynamic_shared_bytes", "blocks_per_sm", "main_loop", "accumulator", "dots",
            "ptx_names")
    for a, b in zip(fresh["kernels"], record["kernels"]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["label"]


def test_the_record_shows_the_compiled_bfloat16_dot():
    """The bfloat16 kernels as a GPU launch compiles them: in the TTGIR every dot takes bfloat16
    operands into a float32 accumulator; the PTX's tensor-core instructions and the main loop's
    SASS multiply bfloat16 into float32 (.f32.bf16.bf16, .F32.BF16); the PTX rounds float32 to
    bfloat16 with cvt.rn (to nearest even), never by truncating."""
    record = json.loads(RECORD.read_text())
    low = [k for k in record["kernels"] if k["dtype"] == "bf16"]
    assert {k["kernel"] for k in low} == {"forward_kernel", "grad_x_kernel", "grad_w_kernel"}
    for k in low:
        assert k["dots"] and all(d.endswith("bf16 × bf16 → f32") for d in k["dots"]), k["dots"]
        assert k["ptx_names"]["mma"] and all(n.endswith(".f32.bf16.bf16") for n in k["ptx_names"]["mma"])
        loop = k["main_loop"]["mma"]
        assert loop and all(n.endswith(".F32.BF16") for n in loop), loop
        assert k["ptx_names"]["cvt_bf16"] and all(n.startswith("cvt.rn.") for n in k["ptx_names"]["cvt_bf16"])
    # The chapter's comparison with float32's forward: half the bytes per tile, and the tensor
    # cores' registers rather than the FFMA loop's.
    f32, bf16 = (next(k for k in record["kernels"] if k["kernel"] == "forward_kernel" and k["dtype"] == d
                      and k["precision"] == "ieee") for d in ("f32", "bf16"))
    assert bf16["dynamic_shared_bytes"] < f32["dynamic_shared_bytes"] and bf16["registers"] < f32["registers"] / 2
    assert record["command"] == f"python tiles/compiler_report.py --json {RECORD.relative_to(ROOT)}"


WORKAROUND_COMPILED = """
import json, os
os.environ["TRITON_INTERPRET"] = "0"  # before kernels.py is loaded: @triton.jit compiles
import cli  # the working directory is the repository's root
report = cli.load_file("tiles/compiler_report.py")
kernels = report.compiled_kernels()
config = {{"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}}
print(json.dumps({{flag: report.dot_types(report.compile_kernel(kernels, "forward_kernel", "bf16", "ieee",
                                                              {{**config, "INTERPRETED": flag}}).asm["ttgir"])
                  for flag in (False, True)}}))
"""


@needs_triton
@pytest.mark.slow
def test_the_workaround_would_make_the_compiled_dot_float32():
    """Compiled for sm_90, INTERPRETED=False (what the stage passes on a GPU) keeps the dot in
    bfloat16, on the tensor cores (warp_group_dot, Hopper's wgmma); True would widen the tiles
    first and make it an IEEE float32 tt.dot, off them: the flag must stay off the compiled path,
    and the stage keeps it off (test_every_launch_says_how_the_kernels_run)."""
    result = run_script("-c", WORKAROUND_COMPILED.format(), env={"TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    dots = json.loads(result.stdout.splitlines()[-1])
    assert dots == {"false": {"ttng.warp_group_dot bf16 × bf16 → f32": 1},
                    "true": {"tt.dot f32 × f32 → f32": 1}}, dots
