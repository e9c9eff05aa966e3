"""Stages cuda and ptx on a GPU: every kernel version, opcheck, torch.compile, streams, the PTX
edits' error bound, the loader's errors. (tests/test_dense.py runs the shared semantics on them too;
tests/test_gpu_build.py checks, without a GPU, that both build, register and trace.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import modes
from conftest import GPU, NO_GPU, REASONS, ROOT, run_script

# A CUDA build of torch without a GPU: say that, not that torch lacks CUDA.
# (reason must be a string even where the condition is false: pytest refuses None.)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason=(torch.version.cuda and REASONS["cuda"]) or NO_GPU)]
STAGES = [pytest.param(m, marks=pytest.mark.skipif(REASONS[m] is not None, reason=f"mode {m}: {REASONS[m]}"))
          for m in ("cuda", "ptx")]
# Every GEMM version of chapter 3, as many as cuda/dense_kernels.h declares (read here, where the
# stage may not build); the PTX stage (chapter 4) carries only v8 and v9 (ptx/lesson_kernels.cu).
VERSIONS = list(range(int(re.search(r"constexpr int kVersions = (\d+);",
                                    (ROOT / "cuda" / "dense_kernels.h").read_text())[1]) + 1))
PTX_VERSIONS = (0, 8, 9)
# Odd shapes across the tile edges; (32, 1024) → 512 is a small batch (v9 splits K there).
SHAPES = [((1, 1), 1), ((127, 131), 129), ((0, 16), 8), ((2, 3, 64), 96), ((32, 256), 256), ((33, 67), 129),
          ((32, 1024), 512), ((129, 7), 65)]


def versions_of(mode: str, v: int) -> None:
    if mode == "ptx" and v not in PTX_VERSIONS:
        pytest.skip(f"the PTX stage carries GEMM versions {PTX_VERSIONS} only")


@pytest.fixture(autouse=True)
def no_tf32():
    """The reference must be a true float32 GEMM, or it is the reference that is off."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def version(mode: str, v: int):
    stage = modes.stage(mode)

    class Selected:
        def __enter__(self):
            self.previous = stage.select_kernel(v)

        def __exit__(self, *exc):
            stage.select_kernel(self.previous)

    return Selected()


def check_against_reference(mode, shape_x, out_f, dtype, atol, rtol):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape_x, device="cuda", dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(out_f, shape_x[-1], device="cuda", dtype=dtype, generator=g, requires_grad=True)
    b = torch.randn(out_f, device="cuda", dtype=dtype, generator=g, requires_grad=True)
    grad = torch.randn(*shape_x[:-1], out_f, device="cuda", dtype=dtype, generator=g)
    y = modes.dense(mode)(x, w, b)
    ours = [y, *torch.autograd.grad(y, (x, w, b), grad)]
    y_ref = torch.sigmoid(F.linear(x, w, b))
    ref = [y_ref, *torch.autograd.grad(y_ref, (x, w, b), grad)]
    for a, r, name in zip(ours, ref, ("y", "grad x", "grad weight", "grad bias")):
        scale = max(1.0, r.abs().max().item()) if r.numel() else 1.0
        torch.testing.assert_close(a, r, atol=atol * scale, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("mode", STAGES)
@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("shape_x, out_f", SHAPES)
def test_every_kernel_version_matches_the_reference_float32(mode, v, shape_x, out_f):
    versions_of(mode, v)
    with version(mode, v):
        check_against_reference(mode, shape_x, out_f, torch.float32, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", STAGES)
@pytest.mark.parametrize("v", VERSIONS)
def test_every_kernel_version_passes_gradcheck_float64(mode, v):
    versions_of(mode, v)
    with version(mode, v):
        ts = [torch.randn(s, device="cuda", dtype=torch.float64, requires_grad=True) for s in ((5, 7), (3, 7), (3,))]
        assert torch.autograd.gradcheck(modes.dense(mode), ts)
        check_against_reference(mode, (33, 65), 17, torch.float64, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mode", STAGES)
def test_bias_gradient_is_bit_identical_run_to_run(mode):
    """The backward's column sums add in a fixed order (no atomics): the same bits every run."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4099, 64, device="cuda", generator=g)
    w = torch.randn(96, 64, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(96, device="cuda", generator=g, requires_grad=True)
    grads = []
    for _ in range(3):
        y = modes.dense(mode)(x, w, b)
        grads.append(torch.autograd.grad(y.sum(), (w, b)))
    assert all(torch.equal(a, c) for gs in grads[1:] for a, c in zip(gs, grads[0]))


@pytest.mark.parametrize("mode", STAGES)
def test_opcheck(mode):
    ops = getattr(torch.ops, f"dense_{mode}")
    modes.dense(mode)
    for bias in (True, False):
        x = torch.randn(6, 5, device="cuda", requires_grad=True)
        w = torch.randn(4, 5, device="cuda", requires_grad=True)
        b = torch.randn(4, device="cuda", requires_grad=True) if bias else None
        torch.library.opcheck(ops.forward.default, (x, w, b))
        y = ops.forward(x, w, b).detach()
        args = (torch.randn_like(y), x.detach(), w.detach(), y, [True, True, bias])
        torch.library.opcheck(ops.backward.default, args)


@pytest.mark.parametrize("mode", STAGES)
def test_direct_op_call_on_two_devices_names_both(mode):
    """torch.ops.dense_<mode>.forward skips modes.check_inputs: x on the GPU picks the CUDA kernel,
    whose C++ check (cpp/dense_common.h) names both devices and raises; nothing is launched."""
    modes.dense(mode)
    forward = getattr(torch.ops, f"dense_{mode}").forward
    x, w, b = torch.randn(3, 4, device="cuda"), torch.randn(2, 4, device="cuda"), torch.randn(2, device="cuda")
    with pytest.raises(ValueError, match="^device mismatch: x is on cuda:0 but weight is on cpu$"):
        forward(x, w.cpu(), b)
    with pytest.raises(ValueError, match="^device mismatch: x is on cuda:0 but bias is on cpu$"):
        forward(x, w, b.cpu())
    with pytest.raises(TypeError, match="^dtype mismatch: x is Float but weight is Double$"):
        forward(x, w.double(), b)
    torch.testing.assert_close(forward(x, w, b), torch.sigmoid(F.linear(x, w, b)), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", STAGES)
@pytest.mark.parametrize("compile_mode", ["default", "reduce-overhead"])
def test_torch_compile_fullgraph(mode, compile_mode):
    layer = modes.Dense(64, 32, mode=mode, device="cuda")
    x = torch.randn(16, 64, device="cuda")

    def step(inp):
        return (layer(inp) * 3).sum()

    compiled = torch.compile(step, fullgraph=True, mode=compile_mode)
    eager = step(x)
    eager.backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up runs
        layer.zero_grad()
        out = compiled(x)
        out.backward()
    torch.testing.assert_close(out, eager)
    for p, g in zip(layer.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.parametrize("mode", STAGES)
def test_runs_on_a_non_default_stream(mode):
    layer = modes.Dense(256, 128, mode=mode, device="cuda")
    x = torch.randn(512, 256, device="cuda")
    expected = torch.sigmoid(F.linear(x, layer.weight, layer.bias)).detach()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = layer(x)
        y.sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(y.detach(), expected, atol=1e-5, rtol=1e-4)
    assert layer.weight.grad is not None


def test_ptx_sigmoid_error_bound():
    """The approximate sigmoid of the PTX stage stays within 1e-6 of the exact one."""
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    z = torch.linspace(-30, 30, 200_001, device="cuda")
    one = torch.ones(1, 1, device="cuda")
    y = modes.dense("ptx")(z.unsqueeze(1), one, None).squeeze(1)
    exact = torch.sigmoid(z.double())
    assert (y.double() - exact).abs().max().item() <= 1e-6
    big = modes.dense("ptx")(torch.tensor([[1000.0], [-1000.0]], device="cuda"), one, None)
    assert big.flatten().tolist() == [1.0, 0.0]


def test_ptx_loader_reports_bad_ptx_and_recovers():
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    stage = modes.stage("ptx")
    x, w = torch.randn(4, 3, device="cuda"), torch.randn(2, 3, device="cuda")
    torch.ops.dense_ptx.load_ptx(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken( {\n")
    try:
        with pytest.raises(RuntimeError, match="the PTX did not load"):
            modes.dense("ptx")(x, w, None)
    finally:
        stage.load_ptx()
    torch.testing.assert_close(modes.dense("ptx")(x, w, None), torch.sigmoid(x @ w.t()), atol=1e-5, rtol=1e-4)


# In a process of its own (it makes and destroys a CUDA context): the loader's modules, one per
# context, through the driver API (ctypes on libcuda).
PTX_CONTEXTS = """
import ctypes, json, torch, modes
stage, ops = modes.stage("ptx"), torch.ops.dense_ptx
x, w = torch.randn(64, 32, device="cuda"), torch.randn(16, 32, device="cuda")  # torch's context is current
want = torch.sigmoid(x @ w.t())
seen = {"torch's context": ops.load_here(), "again": ops.load_here()}
driver = ctypes.CDLL("libcuda.so.1")
device, context, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
assert driver.cuDeviceGet(ctypes.byref(device), 0) == 0
assert driver.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0  # a second context, now current
seen["a second context"] = ops.load_here()
assert driver.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0 and popped.value == context.value
stage.load_ptx()  # unloads torch's module now; the second context unloads its own at its next use
seen["after load_ptx"] = ops.load_here()
assert driver.cuCtxPushCurrent_v2(context) == 0
ops.load_here()
assert driver.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0
assert driver.cuCtxDestroy_v2(context) == 0  # its module goes with it, unknown to the loader
try:
    stage.load_ptx()
    seen["stale module"] = "no error"
except RuntimeError as e:
    seen["stale module"] = str(e).splitlines()[0]
seen["right answer"] = bool(torch.allclose(modes.dense("ptx")(x, w, None), want, atol=1e-5, rtol=1e-4))
print(json.dumps(seen))
"""


def test_ptx_loader_keeps_a_module_per_context_and_leaves_a_destroyed_one_alone():
    """load_ptx unloads the current context's module and never touches a context that may be gone."""
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    result = run_script("-c", PTX_CONTEXTS)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert (seen["torch's context"], seen["again"], seen["a second context"], seen["after load_ptx"]) == (1, 1, 2, 1)
    assert seen["stale module"] == "no error", seen["stale module"]
    assert seen["right answer"]


def test_ptx_reloads_while_another_thread_launches():
    """load_ptx unloads the modules under the lock that every launch holds from finding its
    kernel to enqueueing it: reloading while another thread runs the op leaves its answers right."""
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    stage = modes.stage("ptx")
    x, w = torch.randn(300, 200, device="cuda"), torch.randn(100, 200, device="cuda")
    want = torch.sigmoid(x @ w.t())
    done, errors = threading.Event(), []

    def reload():
        try:
            for _ in range(10):
                stage.load_ptx()
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=reload)
    thread.start()
    runs = 0
    try:
        while not done.is_set() or runs == 0:
            torch.testing.assert_close(modes.dense("ptx")(x, w, None), want, atol=1e-5, rtol=1e-4)
            runs += 1
    finally:
        thread.join()
    assert not errors, errors


def test_ptx_loader_finds_the_driver_at_run_time():
    """No libcuda is linked: the loader asks the CUDA runtime for the driver's functions."""
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    modes.stage("ptx")
    version = torch.ops.dense_ptx.driver_version()
    assert version >= 12000, version  # 1000·major + 10·minor
    if hasattr(torch._C, "_cuda_getDriverVersion"):
        assert version == torch._C._cuda_getDriverVersion()


def test_ptx_stage_runs_the_compilers_ptx_too(tmp_path):
    """What the edits buy is measured against the compiler's own PTX (bash ptx/regen.sh)."""
    if REASONS["ptx"] is not None:
        pytest.skip(REASONS["ptx"])
    # regen.sh's own search: nvcc on PATH, else $CUDA_HOME (default /usr/local/cuda). Where there
    # is one, a failed regeneration is a failure, not a reason to skip.
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if shutil.which("nvcc") is None and not (home / "bin" / "nvcc").exists():
        pytest.skip(f"needs nvcc (on PATH, or in {home}/bin) to regenerate the PTX")
    regen = subprocess.run(["bash", str(ROOT / "ptx" / "regen.sh")], capture_output=True, text=True, timeout=300)
    assert regen.returncode == 0, f"bash ptx/regen.sh failed:\n{regen.stdout[-2000:]}{regen.stderr[-3000:]}"
    stage = modes.stage("ptx")
    try:
        stage.load_ptx(stage.GENERATED)
        check_against_reference("ptx", (64, 128), 96, torch.float32, atol=1e-5, rtol=1e-4)
    finally:
        stage.load_ptx()


@pytest.mark.parametrize("mode", STAGES)
def test_grad_check_script(mode):
    result = run_script("grad_check.py", mode, "--device", "cuda", "-b", "33", "-i", "65", "-o", "17")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", STAGES)
def test_distributed_training_with_gpu_stages(mode):
    gpus = torch.cuda.device_count()
    result = run_script("distributed.py", "-m", mode, "--world-size", str(gpus), "--epochs", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # more ranks than GPUs: gloo, gradients staged through host memory
    result = run_script("distributed.py", "-m", mode, "--world-size", str(gpus + 1), "--epochs", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "using gloo with the gradients staged through host memory" in result.stderr
