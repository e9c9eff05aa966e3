"""Stage cpp as a torch op: opcheck, torch.compile, its own C++ checks, both build paths."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import grad_check as gc
import modes
from conftest import GPU, NO_GPU, REASONS, ROOT, assert_compiled_step_matches, load_script, run_script

pytestmark = pytest.mark.skipif(REASONS["cpp"] is not None, reason=f"mode cpp: {REASONS['cpp']}")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason=NO_GPU)])]


@pytest.fixture(scope="module")
def ops():
    modes.dense("cpp")  # loads (building if needed) and registers the extension
    return torch.ops.dense_cpp


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape_x, bias", [((5, 4), True), ((5, 4), False), ((2, 3, 4), True), ((4,), True)])
def test_opcheck(ops, device, shape_x, bias):
    x = torch.randn(shape_x, device=device, requires_grad=True)
    w = torch.randn(3, 4, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True) if bias else None
    torch.library.opcheck(ops.forward.default, (x, w, b))
    y = ops.forward(x, w, b).detach()
    for mask in ([True, True, bias], [False, True, False], [True, False, bias]):
        torch.library.opcheck(ops.backward.default, (torch.randn_like(y), x.detach(), w.detach(), y, mask))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_matches_eager(ops, device, dtype):
    layer = modes.Dense(8, 5, mode="cpp", device=device, dtype=dtype)

    def step(x):
        return (layer(x) * 2).sum()

    x = torch.randn(6, 8, device=device, dtype=dtype)
    assert layer(x).dtype == dtype
    assert_compiled_step_matches(layer, step, torch.compile(step, fullgraph=True), x)


def test_torch_export_keeps_the_op_and_the_program_runs(ops, tmp_path):
    """torch.export traces the layer to one call of dense_cpp::forward (the fake kernel gives the
    shapes, with a dynamic batch size); the exported program, saved and loaded again, computes
    what the layer computes, gradients included (the op keeps its Autograd kernel)."""
    layer = modes.Dense(8, 5, mode="cpp")
    x = torch.randn(6, 8)
    program = torch.export.export(layer, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert calls == [ops.forward.default], calls
    torch.export.save(program, tmp_path / "dense.pt2")
    loaded = torch.export.load(tmp_path / "dense.pt2").module()
    for batch in (1, 3, 6):
        xs = torch.randn(batch, 8, requires_grad=True)
        torch.testing.assert_close(loaded(xs), layer(xs))
        (got,) = torch.autograd.grad(loaded(xs).sum(), xs)
        (want,) = torch.autograd.grad(layer(xs).sum(), xs)
        torch.testing.assert_close(got, want)


def test_backward_op_returns_empty_tensors_for_masked_grads(ops):
    x, w = torch.randn(5, 4), torch.randn(3, 4)
    y = ops.forward(x, w, None)
    gx, gw, gb = ops.backward(torch.ones_like(y), x, w, y, [False, True, False])
    assert gx.numel() == 0 and gb.numel() == 0 and gw.shape == w.shape


@pytest.mark.parametrize("args, error, message", [
    # The shapes are in the message: [2, 5] as ATen prints a shape (cpp/dense_common.h: shape()).
    ((torch.randn(3, 4), torch.randn(2, 5), None), ValueError, r"in_features=4 .* weight \[2, 5\] expects"),
    ((torch.randn(3, 4), torch.randn(8), None), ValueError, r"weight must be 2-d .* got shape \[8\]"),
    ((torch.randn(3, 4), torch.randn(2, 4), torch.randn(5)), ValueError,
     r"bias must have shape \(2,\) to match weight \[2, 4\], got \[5\]"),
    # dtypes by ATen's names (cpp/dense_common.h: dtype_name())
    ((torch.ones(3, 4, dtype=torch.int32), torch.ones(2, 4, dtype=torch.int32), None), TypeError,
     "^x has dtype Int; Dense supports float32, float64, bfloat16 and float16$"),
    ((torch.randn(3, 4), torch.randn(2, 4).double(), None), TypeError,
     "^dtype mismatch: x is Float but weight is Double$"),
    ((torch.randn(3, 4), torch.randn(2, 4), torch.randn(2).double()), TypeError,
     "^dtype mismatch: x is Float but bias is Double$"),
    ((torch.tensor(2.0), torch.randn(2, 1), None), ValueError, "0-d"),
])
def test_cpp_checks_for_direct_op_calls(ops, args, error, message):
    """torch.ops.dense_cpp.forward skips modes.check_inputs; the C++ repeats the checks."""
    with pytest.raises(error, match=message):
        ops.forward(*args)


@pytest.mark.parametrize("on_meta, message", [
    ("weight", "^device mismatch: x is on cpu but weight is on meta$"),
    ("bias", "^device mismatch: x is on cpu but bias is on meta$"),
])
def test_cpp_device_mismatch_names_both_devices(ops, on_meta, message):
    """The C++ check itself (cpp/dense_common.h: device_name()): the CPU kernel handed a tensor on
    another device. (Through the dispatcher, a meta tensor among the arguments picks the fake
    kernel, and this torch has no other device; tests/test_cuda.py reaches it with CUDA tensors.)"""
    x, w, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(2)
    if on_meta == "weight":
        w = w.to("meta")
    else:
        b = b.to("meta")
    cpu_kernel = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    with pytest.raises(ValueError, match=message):
        ops.forward.default.redispatch(cpu_kernel, x, w, b)


def test_backward_op_names_both_shapes(ops):
    x, w = torch.randn(5, 4), torch.randn(3, 4)
    y = ops.forward(x, w, None)
    with pytest.raises(ValueError, match=r"grad_out has shape \[5, 2\] but the output had shape \[5, 3\]"):
        ops.backward(torch.ones(5, 2), x, w, y, [True, True, False])


def _probe(env: dict) -> str:
    """In a fresh interpreter: load cpp, report how, and check it against the py stage."""
    code = ("import torch, modes; f = modes.dense('cpp'); x, w = torch.randn(3, 4), torch.randn(2, 4);"
            "torch.testing.assert_close(f(x, w, None), modes.dense('py')(x, w, None));"
            "print(modes.build_kind('dense_cpp_ext'))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_jit_build_path():
    import os

    assert _probe({**os.environ, "DENSE_FORCE_JIT": "1"}) == "jit"


@pytest.mark.slow
def test_setup_py_build_is_installed_and_preferred(tmp_path):
    import os

    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                          "--quiet", "--target", str(target), str(ROOT)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr
    assert list(target.glob("dense_cpp_ext*.so")), list(target.iterdir())
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("DENSE_FORCE_JIT", None)
    assert _probe(env) == "installed"


def test_double_backward_is_a_clear_error_not_silent_zeros(ops):
    ts = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
          torch.randn(2, 4, dtype=torch.float64, requires_grad=True)]
    y = modes.dense("cpp")(ts[0], ts[1], None)
    with pytest.raises(RuntimeError, match="double backward .* not implemented"):
        torch.autograd.grad(y.sum(), ts[0], create_graph=True)


# ---------------------------------------------------------------------------
# Building: a killed build's lock, a failing compiler
# ---------------------------------------------------------------------------

LOAD_CPP = "import modes; modes.dense('cpp'); print('loaded')"


def test_stale_build_lock_is_removed_not_waited_on(ops):
    """A build killed by SIGKILL leaves torch's `lock` file; the next load must not hang on it."""
    lock = ROOT / "build" / "jit" / "dense_cpp_ext" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    try:
        result = run_script("-c", LOAD_CPP, env={"DENSE_FORCE_JIT": "1"}, timeout=300)
    finally:
        stale = lock.exists()
        lock.unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr
    assert "loaded" in result.stdout and "left by a build that was killed" in result.stderr
    assert not stale


@pytest.mark.slow
def test_a_live_build_is_waited_for_not_broken(ops):
    """While another process holds the build folder, its lock file is not touched."""
    import fcntl
    import os
    import select

    folder = ROOT / "build" / "jit" / "dense_cpp_ext"
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    with open(folder / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # we are the live builder
        lock.touch()
        proc = subprocess.Popen([sys.executable, "-c", LOAD_CPP], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, "DENSE_FORCE_JIT": "1"})
        try:
            seen = ""
            while "waiting for another process" not in seen:  # ("building..." may come first)
                ready, _, _ = select.select([proc.stderr], [], [], 120)
                line = proc.stderr.readline() if ready else ""
                assert line, f"no 'waiting' message within 120 s; stderr so far: {seen}"
                seen += line
            assert lock.exists() and proc.poll() is None
        finally:
            lock.unlink(missing_ok=True)
            fcntl.flock(held, fcntl.LOCK_UN)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "loaded" in out, err


@pytest.mark.parametrize("held_s, quiet_s, says", [(0.3, 2.0, False), (0.6, 0.2, True)])
def test_the_build_lock_is_announced_only_when_held_for_long(tmp_path, capsys, monkeypatch, held_s, quiet_s, says):
    """Ranks loading a built extension at once hold the build lock in turn, for a moment each:
    none should announce a build in progress (distributed.py -m cpp would print it once per rank).
    A lock held longer than modes.QUIET_WAIT_S is announced."""
    import fcntl
    import threading
    import time

    monkeypatch.setattr(modes, "QUIET_WAIT_S", quiet_s)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # another open file description: flock conflicts with it, as with another process
        with open(tmp_path / "build.flock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.set()
            release.wait(10)
            fcntl.flock(handle, fcntl.LOCK_UN)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    threading.Timer(held_s, release.set).start()
    started = time.monotonic()
    with modes._build_guard(tmp_path):
        waited = time.monotonic() - started
    thread.join(10)
    assert waited >= held_s * 0.9  # it did wait for the holder
    assert ("waiting for another process" in capsys.readouterr().err) == says


def test_a_failing_build_raises_a_short_build_error(tmp_path):
    import shutil

    source = tmp_path / "broken.cpp"
    source.write_text("int broken() { return undefined_name; }\n")
    name = "dense_broken_test_ext"
    try:
        with pytest.raises(modes.BuildError) as info:
            modes.load_extension(name, [source])
    finally:
        shutil.rmtree(ROOT / "build" / "jit" / name, ignore_errors=True)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "undefined_name" in message and "error" in message and "full log:" in message
    assert len(message.splitlines()) <= 10, message
    assert info.value.__suppress_context__  # no chained torch traceback under it


@pytest.mark.slow
def test_overhead_script_writes_json_only_when_asked(ops, tmp_path):
    import json

    result = run_script("cpp/overhead.py", "--rounds", "2", "-i", "8", "-o", "4", "--json", str(tmp_path / "o.json"))
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "o.json").read_text())
    names = [r["name"] for r in record["rows"]]
    for name in ("reference: forward + backward", "cpp: forward + backward",
                 "cpp, Python autograd: forward + backward"):
        assert name in names and f"| {name} |" in result.stdout
    assert all(r["median_us"] > 0 for r in record["rows"])
    assert {"cpu_model", "os_kernel", "threads", "malloc"} <= record.keys() and record["malloc"].startswith(
        ("retain", "default ("))
    bad = run_script("cpp/overhead.py", "--rounds", "1", "--json", str(tmp_path / "missing" / "o.json"))
    assert bad.returncode == 2 and "does not exist (create it first)" in bad.stderr


@pytest.fixture(scope="module")
def overhead(ops):
    """cpp/overhead.py as a module, loaded once (it registers its scratch op once per process)."""
    return load_script("cpp/overhead.py")


@pytest.mark.parametrize("bias, wanted", [(True, (True, True, True)), (False, (False, True, False)),
                                          (True, (True, False, True))])
def test_overhead_compares_the_same_kernels_under_both_autograd_formulas(overhead, bias, wanted):
    """cpp/overhead.py's Python-formula variant computes what the stage computes: the timing
    difference between the two is the autograd formula's, not the maths'."""
    scratch = overhead.python_autograd_op()
    assert overhead.python_autograd_op() is scratch  # registered once per process
    gen = torch.Generator().manual_seed(3)
    x, w, b, g = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((2, 6), (5, 6), (5,), (2, 5)))
    results = []
    for fn in (modes.dense("cpp"), scratch):
        ts = [t.clone().requires_grad_(need) for t, need in zip((x, w, b), wanted)]
        y = fn(ts[0], ts[1], ts[2] if bias else None)
        y.backward(g)
        results.append([y.detach()] + [t.grad for t in ts])
    for a, e in zip(*results):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def assert_cpp_matches_the_reference(x, w, b, g, wanted):
    """Output and the wanted gradients of mode cpp against sigmoid(F.linear(...))."""
    results = []
    for fn in (modes.dense("cpp"), lambda x, w, b: torch.sigmoid(torch.nn.functional.linear(x, w, b))):
        ts = [t.clone().requires_grad_(need) if t is not None else None for t, need in zip((x, w, b), wanted)]
        y = fn(*ts)
        y.backward(g)
        results.append([y.detach()] + [t.grad if t is not None else None for t in ts])
    tol = {"rtol": 1e-4, "atol": 1e-4} if x.dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    for a, e in zip(*results):
        assert (a is None) == (e is None)
        if a is not None:
            torch.testing.assert_close(a, e, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape_x, bias, wanted", [
    ((3, 700, 20), True, (True, True, True)),   # enough rows for the blocked CPU path (cpp/dense.cpp)
    ((2100, 20), False, (True, True, False)),
    ((2100, 20), True, (False, True, True)),     # an input batch: no grad_x
    ((2100, 20), True, (True, False, False)),
])
def test_blocked_cpu_path_matches_the_reference(dtype, shape_x, bias, wanted):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape_x, generator=gen, dtype=dtype)
    if x.dim() == 2:
        x = x.t().contiguous().t()  # column-major: the blocks are strided views
    w = torch.randn(129, 20, generator=gen, dtype=dtype)
    b = torch.randn(129, generator=gen, dtype=dtype) if bias else None
    g = torch.randn(*shape_x[:-1], 129, generator=gen, dtype=dtype)
    assert_cpp_matches_the_reference(x, w, b, g, wanted)


@pytest.fixture(params=[1, 3], ids=lambda n: f"{n}threads")
def threads(request):
    """The few-rows path depends on the thread count (it needs 16 · rows · threads output
    features, and splits them over the threads): pin it, and restore it after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# The few-rows backward (cpp/dense.cpp, B <= 4): every row count, chunk tails (in_f not a
# multiple of the vector width), group tails (out_f not a multiple of 4), ranges split over
# threads (at 3 threads: in_f = 37 and 512 give three ranges), every gradient mask,
# column-major x and W, and B = 5, the first row count past it. Every shape has enough output
# features for the path at 1 and 3 threads (at least 16 · 4 · 3 = 192).
MASKS = [(True, m) for m in [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]
         if any(m)] + [(False, (True, True, False)), (False, (False, True, False))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("in_f, out_f", [(5, 200), (37, 1000), (512, 203)])
@pytest.mark.parametrize("bias, wanted", MASKS)
def test_few_rows_cpu_path_matches_the_reference(threads, dtype, rows, in_f, out_f, bias, wanted):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(in_f, rows, generator=gen, dtype=dtype).t()  # column-major
    w = torch.randn(in_f, out_f, generator=gen, dtype=dtype).t()
    b = torch.randn(out_f, generator=gen, dtype=dtype) if bias else None
    g = torch.randn(rows, out_f, generator=gen, dtype=dtype)
    assert_cpp_matches_the_reference(x, w, b, g, wanted)
    # The same rows as a 3-d x, (1, rows, in_f): the op folds the leading dimensions.
    assert_cpp_matches_the_reference(x.contiguous().unsqueeze(0), w.contiguous(), b, g.unsqueeze(0), wanted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("where", ["x", "weight", "bias", "grad_out"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_few_rows_cpu_path_gives_the_references_nan_pattern(threads, dtype, rows, where, value):
    """NaN and ±inf through the few-rows backward, with full vector chunks and groups of four
    rows of W (tests/test_edge_cases.py does every mode at a small shape)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, 37, generator=gen, dtype=dtype), torch.randn(200, 37, generator=gen, dtype=dtype)
    b, g = torch.randn(200, generator=gen, dtype=dtype), torch.randn(rows, 200, generator=gen, dtype=dtype)
    {"x": lambda: x.__setitem__((rows - 1, 20), value), "weight": lambda: w.__setitem__((6, 20), value),
     "bias": lambda: b.__setitem__(6, value), "grad_out": lambda: g.__setitem__((0, 6), value)}[where]()
    assert cpp_path(rows, 37, 200, dtype) == "few rows"
    if dtype in HALF_TYPES:
        assert_within_eager_error(x, w, b, g)
        return
    results = []
    for fn in (modes.dense("cpp"), lambda x, w, b: torch.sigmoid(torch.nn.functional.linear(x, w, b))):
        ts = [t.clone().requires_grad_() for t in (x, w, b)]
        y = fn(*ts)
        y.backward(g)
        results.append([y.detach()] + [t.grad for t in ts])
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    for a, e in zip(*results):
        torch.testing.assert_close(a, e, equal_nan=True, **tol)


# ---------------------------------------------------------------------------
# bfloat16 and float16: stored in 16 bits, computed and accumulated in float32
# ---------------------------------------------------------------------------
HALF_TYPES = [torch.bfloat16, torch.float16]


def cpp_path(rows: int, in_f: int, out_f: int, dtype: torch.dtype) -> str:
    """The CPU path cpp/dense.cpp takes for these sizes and this type (few_rows, block_rows,
    use_blocks there), so that each test below can say its shapes select the path it is about."""
    if 1 <= rows <= 4 and out_f >= 16 * rows * torch.get_num_threads():
        return "few rows"  # the backward's; the forward is the plain one
    block = max(32, (256 << 10) // max(1, out_f * torch.empty((), dtype=dtype).element_size()))
    blocks = dtype in (torch.float32, torch.float64) and in_f <= 256 and rows >= 4 * block
    return "blocked" if blocks else "plain"


def _step(fn, inputs, g, wanted):
    """fn(*inputs) and the wanted gradients for the output gradient g: [y, grad x, grad W, grad b]."""
    ts = [t.clone().requires_grad_(need) if t is not None else None for t, need in zip(inputs, wanted)]
    y = fn(*ts)
    y.backward(g)
    return [y.detach()] + [t.grad if t is not None else None for t in ts]


def assert_within_eager_error(x, w, b, g, wanted=(True, True, True)):
    """Mode cpp in a 16-bit type judged by the rule of docs/README.md (grad_check.judge), against
    the float64 truth on the same inputs: the output and every gradient in the input's dtype, NaN
    and ±inf where nn.Linear + torch.sigmoid in that type (eager) has them, an error at most 4
    times eager's own plus 2u times the largest element's size, and within grad_check.error_bound
    wherever eager is."""
    got = _step(modes.dense("cpp"), (x, w, b), g, wanted)
    eager = _step(gc.reference, (x, w, b), g, wanted)
    truth = _step(gc.reference, [t.double() if t is not None else None for t in (x, w, b)], g.double(), wanted)
    empty = min(x.numel(), w.numel(), g.numel()) == 0  # error_bound and magnitudes fold rows: none here
    bounds = [None] * 4 if empty else gc.error_bound(x, w, b, g, x.dtype) + [None]
    sizes = [None] * 4 if empty else gc.magnitudes(x, w, b, g) + [None]
    for name, a, e, t, bound, size in zip(("y", "grad x", "grad weight", "grad bias"), got, eager, truth, bounds,
                                          sizes):
        assert (a is None) == (e is None), name
        if a is not None:
            assert a.dtype == x.dtype, (name, a.dtype)
            verdict = gc.judge(a, e, t, x.dtype, bound, size)
            assert verdict.passed, f"{name}: {verdict.detail()}"


def _half_inputs(rows_shape, in_f, out_f, dtype, seed, bias=True):
    """x ~ N(0, 1), W and b ~ N(0, 1/in_f) (nn.Linear's scale, so the sigmoid is not saturated),
    g ~ N(0, 1); drawn in float32, then rounded to dtype."""
    gen = torch.Generator().manual_seed(seed)
    scale = max(in_f, 1) ** -0.5
    x = torch.randn(*rows_shape, in_f, generator=gen)
    w = torch.randn(out_f, in_f, generator=gen) * scale
    b = torch.randn(out_f, generator=gen) * scale if bias else None
    g = torch.randn(*rows_shape, out_f, generator=gen)
    return [t.to(dtype) if t is not None else None for t in (x, w, b, g)]


# (shape of x's rows, in_f, out_f, the path it selects, the gradients asked for): chunk tails
# (37, 20 and 300 are not multiples of the vector width), group tails (203 rows of W), 3-d x.
# The 16-bit types take no blocks: 256 rows of 20 features would be blocked in float32.
FEW_ROWS_CASES = [
    ((1,), 37, 203, "few rows", (True, True, True)),
    ((4,), 37, 203, "few rows", (True, True, True)),
    ((1, 3), 37, 203, "few rows", (False, True, False)),
]
HALF_CASES = [
    ((256,), 20, 1024, "plain", (True, True, True)),
    ((64,), 300, 50, "plain", (True, True, True)),
    ((2, 5, 7), 300, 50, "plain", (True, False, True)),
    ((2, 8), 20, 130, "plain", (False, True, True)),
]


def _check_16bit_case(dtype, rows_shape, in_f, out_f, path, wanted):
    rows = math.prod(rows_shape)
    assert cpp_path(rows, in_f, out_f, dtype) == path
    x, w, b, g = _half_inputs(rows_shape, in_f, out_f, dtype, seed=rows + in_f)
    assert_within_eager_error(x, w, b, g, wanted)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("rows_shape, in_f, out_f, path, wanted", FEW_ROWS_CASES)
def test_16bit_few_rows_path_is_within_eagers_own_error(threads, dtype, rows_shape, in_f, out_f, path, wanted):
    """The few-rows backward splits W's rows over the threads (each with a float32 partial dx)."""
    _check_16bit_case(dtype, rows_shape, in_f, out_f, path, wanted)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("rows_shape, in_f, out_f, path, wanted", HALF_CASES)
def test_16bit_plain_path_is_within_eagers_own_error(dtype, rows_shape, in_f, out_f, path, wanted):
    assert cpp_path(256, 20, 1024, torch.float32) == "blocked"  # the shape above, in float32
    _check_16bit_case(dtype, rows_shape, in_f, out_f, path, wanted)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("rows, in_f, out_f, path", [(2, 37, 2000, "few rows"), (65536, 4, 8, "plain")])
def test_16bit_sums_without_cancellation_stay_float32(dtype, rows, in_f, out_f, path):
    """Positive inputs, so that no reduction's terms cancel and the rule's floor (2u of the size)
    is 2u of the result itself: a sum carried in the 16-bit type over thousands of terms (dx over
    2000 rows of W in the few-rows backward; db and dW over 65536 rows in the plain one) drifts
    far beyond it, as each term falls below the running sum's last bit."""
    assert cpp_path(rows, in_f, out_f, dtype) == path
    x, w, b, g = (t.abs() for t in _half_inputs((rows,), in_f, out_f, dtype, seed=3))
    assert_within_eager_error(x, w, b, g)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("rows_shape, in_f, out_f", [((0,), 5, 3), ((4,), 0, 3), ((2, 0), 7, 300), ((0,), 0, 0)])
def test_16bit_types_with_zero_sized_inputs(dtype, rows_shape, in_f, out_f):
    x, w, b, g = _half_inputs(rows_shape, in_f, out_f, dtype, seed=0)
    assert_within_eager_error(x, w, b, g)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("where, value", [("x", float("nan")), ("bias", float("inf")), ("bias", float("-inf")),
                                          ("grad_out", float("nan"))])
def test_16bit_plain_path_gives_the_references_nan_pattern(dtype, where, value):
    """NaN and ±inf through the plain path's fused passes: the forward's (a NaN or an infinite z)
    and the backward's (a NaN gradient). Every input and value through the few-rows backward:
    test_few_rows_cpu_path_gives_the_references_nan_pattern."""
    assert cpp_path(64, 300, 50, dtype) == "plain"
    x, w, b, g = _half_inputs((64,), 300, 50, dtype, seed=1)
    {"x": lambda: x.__setitem__((3, 17), value), "weight": lambda: w.__setitem__((6, 17), value),
     "bias": lambda: b.__setitem__(6, value), "grad_out": lambda: g.__setitem__((3, 6), value)}[where]()
    assert_within_eager_error(x, w, b, g)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_opcheck_16bit(ops, dtype):
    x, w, b, g = _half_inputs((5,), 4, 3, dtype, seed=2)
    torch.library.opcheck(ops.forward.default, (x.requires_grad_(), w.requires_grad_(), b.requires_grad_()))
    y = ops.forward(x, w, b).detach()
    torch.library.opcheck(ops.backward.default, (g, x.detach(), w.detach(), y, [True, True, True]))


@pytest.mark.parametrize("x_dtype, w_dtype, b_dtype, message", [
    (torch.bfloat16, torch.float32, torch.float32, "^dtype mismatch: x is BFloat16 but weight is Float$"),
    (torch.bfloat16, torch.bfloat16, torch.float32, "^dtype mismatch: x is BFloat16 but bias is Float$"),
    (torch.float16, torch.bfloat16, None, "^dtype mismatch: x is Half but weight is BFloat16$"),
])
def test_mixed_dtypes_without_autocast_are_refused_as_f_linear_refuses_them(ops, x_dtype, w_dtype, b_dtype, message):
    """F.linear refuses mixed dtypes outside autocast; so does the stage, naming the two dtypes.
    (The op's own C++ message: modes.dense() replaces it with modes.check_inputs' message.)"""
    x, w = torch.randn(3, 4, dtype=x_dtype), torch.randn(2, 4, dtype=w_dtype)
    b = torch.randn(2, dtype=b_dtype) if b_dtype else None
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear(x, w, b)
    with pytest.raises(TypeError, match=message):
        ops.forward(x, w, b)
    with pytest.raises(TypeError, match="dtype mismatch"):
        modes.dense("cpp")(x, w, b)


@pytest.mark.parametrize("shape_x", [(6, 8), (2, 3, 8)], ids=["2d", "3d"])
def test_autocast_bfloat16_with_float32_parameters(ops, shape_x):
    """Under torch.autocast("cpu", dtype=torch.bfloat16) the layer computes in bfloat16 from
    float32 parameters, as nn.Linear does: a bfloat16 output, float32 gradients for the
    parameters and x, and the reference's values."""
    torch.manual_seed(0)
    layer = modes.Dense(8, 5, mode="cpp")
    linear = torch.nn.Linear(8, 5)
    linear.load_state_dict(layer.state_dict())
    x = torch.randn(shape_x)
    results = []
    for fn, params in ((layer, layer.parameters()), (lambda x: torch.sigmoid(linear(x)), linear.parameters())):
        xs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(xs)
        y.float().pow(2).sum().backward()
        results.append([y.detach(), xs.grad, *(p.grad for p in params)])
    for got, want in zip(*results):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert results[0][0].dtype == torch.bfloat16
    assert [t.dtype for t in results[0][1:]] == [torch.float32] * 3


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_atens_16bit_gemm_accumulates_in_float32(dtype):
    """What chapter 2 says of the GEMMs the stage and the reference call (at::mm; addmm, which
    F.linear calls): in bfloat16 and float16 on the CPU they accumulate in float32 and round once.
    Over 1024 terms a float32 sum rounds to the same 16-bit number as the exact sum nearly
    everywhere (99.5% of the elements here, at least); sums carried in the 16-bit type (the foil:
    64 float32 GEMMs of 16 terms, added up in that type) agree for about a fifth of them."""
    gen = torch.Generator().manual_seed(0)
    a, w, b = (torch.randn(s, generator=gen).to(dtype) for s in ((64, 1024), (64, 1024), (64,)))
    exact = a.double() @ w.double().t()

    def agree(got, want):
        return (got == want.to(dtype)).double().mean().item()

    assert agree(torch.mm(a, w.t()), exact) > 0.99
    assert agree(torch.addmm(b, a, w.t()), b.double() + exact) > 0.99
    foil = torch.zeros(64, 64, dtype=dtype)
    for k in range(0, 1024, 16):
        foil += torch.mm(a[:, k:k + 16], w[:, k:k + 16].t())
    assert agree(foil, exact) < 0.5
