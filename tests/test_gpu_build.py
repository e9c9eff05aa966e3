"""The GPU stages (cuda, ptx) on a machine without a GPU: built against a CUDA build of torch,
loaded, registered in the dispatcher, their fake kernels checked against the CPU stage, and
traced by torch.compile and torch.export on fake CUDA tensors.

    bash .ci/cuda_build     # a venv with the CUDA torch, both builds (JIT and setup.py), then these

The toolkit search (modes.cuda_build) is tested with any torch; the rest needs a CUDA build of
torch (no GPU) and skips elsewhere with the reason.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat

import pytest
import torch

import modes

CUDA_TORCH = torch.version.cuda is not None
needs_cuda_torch = pytest.mark.skipif(
    not CUDA_TORCH, reason=f"needs a CUDA build of torch (no GPU); this torch is {torch.__version__}")
GPU_MODES = ("cuda", "ptx")
NVCC = shutil.which("nvcc")
TOOLKIT = modes._nvcc_top(NVCC) if NVCC else None
needs_toolkit = pytest.mark.skipif(TOOLKIT is None, reason="needs the CUDA toolkit's nvcc on PATH")


# ---------------------------------------------------------------------------------------
# Finding the toolkit (any torch)
# ---------------------------------------------------------------------------------------
@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No CUDA_HOME/CUDA_PATH, and a PATH of one empty folder (tests add nvcc to it)."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(modes, "FALLBACK_CUDA_HOME", tmp_path / "no-cuda-here")
    return bin_dir


@needs_toolkit
def test_toolkit_found_through_a_link_to_nvcc(clean_env):
    (clean_env / "nvcc").symlink_to(TOOLKIT / "bin" / "nvcc")
    assert modes._cuda_home() == TOOLKIT


@needs_toolkit
def test_toolkit_found_through_a_wrapper_script(clean_env):
    """A general bin/ folder's nvcc that execs the real one: its parent folder is no toolkit,
    and nvcc's dry run names the real one."""
    wrapper = clean_env / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {TOOLKIT / "bin" / "nvcc"} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    assert not modes._is_toolkit(clean_env.parent)
    assert modes._cuda_home() == TOOLKIT


@needs_toolkit
def test_cuda_home_wins_and_is_checked(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(TOOLKIT))
    assert modes._cuda_home() == TOOLKIT
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(modes.CudaBuildError, match=f"CUDA_HOME={tmp_path} is not a CUDA toolkit"):
        modes._cuda_home()


def test_no_nvcc_is_one_line_saying_what_to_set(clean_env):
    with pytest.raises(modes.CudaBuildError) as error:
        modes._cuda_home()
    message = str(error.value)
    assert "nvcc is not on PATH" in message and "set CUDA_HOME" in message and "\n" not in message


def test_library_headers_come_from_the_nvidia_wheels_where_the_toolkit_lacks_them(tmp_path, monkeypatch):
    include = tmp_path / "toolkit" / "include"
    include.mkdir(parents=True)
    (include / "cusparse.h").write_text("")
    wheel = tmp_path / "nvidia" / "cu13" / "include"
    wheel.mkdir(parents=True)
    for header in modes.LIBRARY_HEADERS:
        (wheel / header).write_text("")
    monkeypatch.setattr(modes, "_nvidia_wheel_roots", lambda: [tmp_path / "nvidia"])
    assert modes._library_include_dirs(include) == [str(wheel)]
    (wheel / "cublas_v2.h").unlink()
    with pytest.raises(modes.CudaBuildError, match="cublas_v2.h"):
        modes._library_include_dirs(include)
    for header in modes.LIBRARY_HEADERS:
        (include / header).write_text("")
    assert modes._library_include_dirs(include) == []


def test_arch_flags_default_and_override(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    archs, flags = modes._arch_flags()
    assert archs.startswith(modes.DEFAULT_CUDA_ARCHS)
    # sm_80's code and its PTX (which newer GPUs compile for themselves), and sm_90a's: the Hopper-only
    # instructions of v31-v35 exist in no other architecture's code
    assert flags == ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80",
                     "-gencode=arch=compute_90a,code=sm_90a")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    archs, flags = modes._arch_flags()
    assert archs == "9.0 (TORCH_CUDA_ARCH_LIST)" and flags == ()  # torch turns the list into flags itself


# ---------------------------------------------------------------------------------------
# The GPU stages built and registered (a CUDA build of torch, no GPU needed)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built():
    """Both GPU stages built (or found installed) and loaded, and the cpp stage for reference."""
    if not CUDA_TORCH:
        pytest.skip(f"needs a CUDA build of torch (no GPU); this torch is {torch.__version__}")
    return {m: modes.build(m) for m in ("cpp", *GPU_MODES)}


@needs_cuda_torch
def test_cuda_build_finds_everything_without_environment_variables(built):
    if {"CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "CPATH"} & set(os.environ):
        pytest.skip("checks the search with none of CUDA_HOME, CUDA_PATH, TORCH_CUDA_ARCH_LIST, CPATH set")
    cuda = modes.cuda_build()
    assert modes._is_toolkit(cuda.home)
    assert torch.utils.cpp_extension.CUDA_HOME == str(cuda.home)
    assert cuda.archs.startswith(modes.DEFAULT_CUDA_ARCHS)


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
def test_stage_loads_and_says_how(built, mode):
    assert built[mode] in ("installed", "jit")
    assert modes.build_kind(f"dense_{mode}_ext") == built[mode]


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
def test_ops_have_cuda_kernels_and_the_forward_an_autograd_kernel(built, mode):
    def has(op: str, key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"dense_{mode}::{op}", key)

    assert has("forward", "CUDA") and has("backward", "CUDA")
    assert has("forward", "Autograd"), "the autograd formula is registered in C++ (dense::implement_autograd)"
    assert not has("forward", "CPU") and not has("backward", "CPU")
    assert has("forward", "Meta") and has("backward", "Meta"), "modes.register_dense_op's fake kernels"


@needs_cuda_torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU reports")
def test_available_names_the_missing_gpu_as_the_one_reason(built):
    reasons = modes.available()
    for mode in GPU_MODES:
        assert reasons[mode] == modes._no_gpu_reason(), reasons[mode]
        assert "needs a GPU" in reasons[mode] and "nvcc" not in reasons[mode]
    with pytest.raises(RuntimeError, match="mode 'cuda' is not available here: needs a GPU"):
        modes.Dense(4, 2, mode="cuda")


@needs_cuda_torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a driver reports")
def test_ptx_loader_without_a_driver_is_a_clear_error(built):
    for call in (torch.ops.dense_ptx.driver_version, torch.ops.dense_ptx.load_here):
        with pytest.raises(RuntimeError, match="loading PTX needs an NVIDIA driver"):
            call()
    # Handing over PTX text needs no driver: no context holds a module of the previous PTX, so
    # there is nothing to unload, before or after a failed load.
    modes.stage("ptx").load_ptx()
    modes.stage("ptx").load_ptx()


# ---------------------------------------------------------------------------------------
# Fake kernels on fake CUDA tensors against the CPU stage's real results
# ---------------------------------------------------------------------------------------
IN, OUT = 6, 5
# leading dimensions of x: 1-d to 4-d, and empty batches
BATCHES = [(), (7,), (2, 3), (2, 3, 4), (0,), (2, 0)]
# how x's memory is laid out: every layout the ops accept (the GPU ops copy what is not plain)
X_LAYOUTS = ("contiguous", "transposed", "expanded", "strided", "offset")
W_LAYOUTS = ("contiguous", "transposed")
BIASES = ("none", "contiguous", "strided")
MASKS = ([True, True, True], [True, False, False], [False, True, True], [False, False, True])


def make_x(batch: tuple[int, ...], in_f: int, layout: str, **f) -> torch.Tensor:
    shape = (*batch, in_f)
    if layout == "transposed":  # every stride reversed
        return torch.randn(shape[::-1], **f).permute(*reversed(range(len(shape))))
    if layout == "expanded" and batch:  # stride 0 along the first batch dimension
        return torch.randn((1, *shape[1:]), **f).expand(shape)
    if layout == "strided":  # every other element of a wider last dimension
        return torch.randn((*batch, 2 * in_f), **f)[..., ::2]
    if layout == "offset":  # starts one element into its storage: not 16-byte aligned
        numel = 1
        for s in shape:
            numel *= s
        return torch.randn(numel + 1, **f)[1:].view(shape)
    return torch.randn(shape, **f)


def make_w(layout: str, in_f: int, **f) -> torch.Tensor:
    return torch.randn(in_f, OUT, **f).t() if layout == "transposed" else torch.randn(OUT, in_f, **f)


def make_b(layout: str, **f) -> torch.Tensor | None:
    if layout == "none":
        return None
    return torch.randn(2 * OUT, **f)[::2] if layout == "strided" else torch.randn(OUT, **f)


def meta(t: torch.Tensor, x: torch.Tensor) -> tuple:
    """What a fake kernel must get right: shape, dtype, strides, and the input's device."""
    return tuple(t.shape), t.dtype, t.stride(), t.device == x.device


def cases():
    for batch, x_layout, w_layout, bias, dtype in itertools.product(
            BATCHES, X_LAYOUTS, W_LAYOUTS, BIASES, (torch.float32, torch.float64)):
        yield batch, IN, x_layout, w_layout, bias, dtype
    yield (3,), 0, "contiguous", "contiguous", "contiguous", torch.float32  # in_features = 0


def both(batch, in_f, x_layout, w_layout, bias, dtype, device):
    """The same arguments, on the CPU (real) or on fake CUDA tensors (inside a FakeTensorMode)."""
    f = {"dtype": dtype, "device": device}
    return make_x(batch, in_f, x_layout, **f), make_w(w_layout, in_f, **f), make_b(bias, **f)


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
def test_fake_kernels_agree_with_the_cpu_stage(built, mode):
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu_ops, gpu_ops = torch.ops.dense_cpp, getattr(torch.ops, f"dense_{mode}")

    def grad_outs(y: torch.Tensor) -> dict[str, torch.Tensor]:
        # what autograd hands the backward: a plain tensor, or a broadcast one (from .sum())
        return {"contiguous": torch.randn_like(y), "expanded": torch.ones((), dtype=y.dtype, device=y.device)
                .expand(y.shape)}

    checked = 0
    for case in cases():
        torch.manual_seed(0)
        x, w, b = both(*case, "cpu")
        y = cpu_ops.forward(x, w, b)
        masks = [[m[0], m[1], m[2] and b is not None] for m in MASKS]
        want = {(g, i): [meta(t, x) for t in cpu_ops.backward(grad, x, w, y, mask)]
                for g, grad in grad_outs(y).items() for i, mask in enumerate(masks)}
        with FakeTensorMode():
            fx, fw, fb = both(*case, "cuda")
            assert fx.is_cuda and meta(fx, fx) == meta(x, x), case  # the same layout on both sides
            fy = gpu_ops.forward(fx, fw, fb)
            assert meta(fy, fx) == meta(y, x), f"forward {case}: {meta(fy, fx)} != {meta(y, x)}"
            for g, grad in grad_outs(fy).items():
                for i, mask in enumerate(masks):
                    got = [meta(t, fx) for t in gpu_ops.backward(grad, fx, fw, fy, mask)]
                    assert got == want[g, i], f"backward {case}, grad_out {g}, mask {mask}: {got} != {want[g, i]}"
        checked += 1
    assert checked == len(list(cases()))


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
def test_autograd_kernel_runs_on_fake_cuda_tensors(built, mode):
    """Through modes.dense: the C++ Autograd kernel records a graph node around the fake forward."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 3, IN, device="cuda", requires_grad=True)
        w = torch.randn(OUT, IN, device="cuda", requires_grad=True)
        y = modes.dense(mode)(x, w, None)
        assert meta(y, x) == (((4, 3, OUT)), torch.float32, (3 * OUT, OUT, 1), True)
        assert y.requires_grad and "DenseFunction" in y.grad_fn.name(), y.grad_fn.name()


# ---------------------------------------------------------------------------------------
# torch.compile and torch.export of modes.Dense on fake CUDA inputs
# ---------------------------------------------------------------------------------------
def fake_layer(mode: str, bias: bool = True):
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode()
    with fake:
        layer = modes.Dense(IN, OUT, bias=bias, mode=mode, device="cuda")
        x = torch.randn(8, IN, device="cuda")
    return fake, layer, x


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
@pytest.mark.parametrize("bias", [True, False])
def test_export_is_one_call_of_the_op(built, mode, bias):
    fake, layer, x = fake_layer(mode, bias)
    with fake:
        program = torch.export.export(layer, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
        y = program.module()(torch.randn(3, IN, device="cuda"))
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert calls == [getattr(torch.ops, f"dense_{mode}").forward.default]
    assert meta(y, y) == ((3, OUT), torch.float32, (OUT, 1), True) and y.is_cuda


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
def test_compile_fullgraph_forward(built, mode):
    """Dynamo captures the layer as one graph (fullgraph), and AOTAutograd traces it with the
    fake kernel (inference: no backward to trace)."""
    fake, layer, x = fake_layer(mode)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    with fake, torch.no_grad():
        for batch in (8, 3):
            y = compiled(torch.randn(batch, IN, device="cuda"))
            assert meta(y, y) == ((batch, OUT), torch.float32, (OUT, 1), True)


@needs_cuda_torch
@pytest.mark.parametrize("mode", GPU_MODES)
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/test_cuda.py compiles forward and backward on a GPU")
def test_compile_fullgraph_with_backward(built, mode):
    """Tracing the backward runs torch's autograd engine, which asks the CUDA driver for the
    device's context even for fake tensors: without a GPU, torch allows the forward alone."""
    fake, layer, x = fake_layer(mode)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: layer(t).sum(), fullgraph=True, backend="aot_eager")
    try:
        with fake:
            loss = compiled(x.requires_grad_())
    except Exception as e:  # torch wraps it as BackendCompilerFailed
        said = [line for line in str(e).splitlines() if "hasPrimaryContext" in line or "NVIDIA driver" in line]
        if said:
            pytest.skip("torch traces a backward on CUDA tensors only where a GPU is: its autograd engine "
                        f"asks the driver for the device's context, fake tensors too ({said[0].strip()})")
        raise
    assert loss.shape == () and loss.requires_grad
