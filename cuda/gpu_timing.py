"""The plumbing every part of cuda/bench_gpu.py times with: the cuda stage's library and its C
entries, the versions the header lists, the shapes and tolerances, the timed-function builders
(a forward, a forward + backward, a version selected by its number, an autotuning candidate), the
table rows every timing part records, and the device helpers that let the tensor-core parts run
on CPU tensors in the emulation (tests/test_roof.py sets DEVICE to "cpu").

The parts themselves live beside it: cuda/gpu_hand_kernels.py (chapter 3's hand-written kernels),
cuda/gpu_tensor_cores.py (the tensor cores' chapter), cuda/gpu_profile.py (Nsight Compute); their
tables are cuda/gpu_tables.py's. Settings that a run changes (KERNEL, DEVICE) live here once, and
the parts read them as attributes of this module, so that setting them here reaches every part."""

from __future__ import annotations

from collections.abc import Callable

import torch

import benchmark
import cli
import modes
import timing

catalog = cli.load_file("cuda/catalog.py")  # what dense_kernels.h declares, as text

BIG = (4096, 4096, 4096)
SMALL_BATCH = (32, 4096, 4096)
WIDE = (65536, 64, 4096)
CHECK_SHAPES = ((33, 65, 17), (257, 1031, 129), BIG)
TOLERANCE = 1e-4  # float32 against float64: far under 1e-3 (TF32 would be near 3e-4)
BF16_TOLERANCE = 1e-2  # bfloat16 rounds each output once at the store: 2^-9 ≈ 2e-3 relative
ALIGNED_CHECK = (264, 1032, 136)  # CHECK_SHAPES[1] for the TMA versions: multiples of 8, partial tiles
DTYPE_CODES = {name: code for code, name in enumerate(catalog.DTYPES)}  # dense_kernels::DType
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
CODE_OF = {TORCH_DTYPES[name]: code for name, code in DTYPE_CODES.items()}
DEVICE = "cuda"  # where the tensor-core parts run; tests/test_roof.py runs them on "cpu", in the emulation


def versions(dtype: str = "f32") -> list[int]:
    """The GEMM versions (0, the automatic choice, apart) built for `dtype`, as
    cuda/dense_kernels.h lists them (read anew on each call): a version added there is compared
    and timed here with no list to edit."""
    return catalog.version_ids(dtype=dtype)


KERNEL: int | None = None  # --kernel N: the timing parts time version N alone, by its number (main sets it)


def only(versions: list[int]) -> list[int]:
    """`versions`, or with --kernel N the ones of them that are N: a version never run on a GPU is
    timed in a process of its own (cuda/isolated.py kernels), never through version 0."""
    return versions if KERNEL is None else [v for v in versions if v == KERNEL]


def chapter_versions() -> list[int]:
    """Chapter 4's progression on the CUDA cores, 1 to kVersions of the header: float32 all the
    way, so checked against float64 at float32's tolerance (a TF32 tensor-core version would not
    meet it) and shown in the chapter's table, whose cuBLAS line has TF32 off."""
    return catalog.cuda_core_versions()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; infinite if `out` holds a NaN or an infinity, so that a
    non-finite result never passes a tolerance."""
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


Save = Callable[[], None]  # writes the record as it stands (main's): called after every measurement


def nothing() -> None:
    """The Save of a part called alone (the tests): nothing to write."""
    pass


def first_line(e: BaseException) -> str:
    """An error's first line (300 characters at most): what a failed row or line records."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


# ---- the GPU library's entries; the exact comparison is cuda/exact_check.py's ----
exact_check = cli.load_file("cuda/exact_check.py")


def library():
    """The cuda stage's loaded library, its C entry points typed (exact_check.library)."""
    return exact_check.library()


def grad_launcher(lib):
    """dense_kernels::launch_sigmoid_grad through its C export (cuda/dense_kernels.cu)."""
    import ctypes

    fn = getattr(lib, "dense_sigmoid_grad_launch", None)
    if fn is None:
        raise cli.UserError("the cuda stage's library does not export dense_sigmoid_grad_launch: rebuild it "
                            "(python -c \"import modes; modes.build('cuda')\")")
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [i32, i32, ctypes.c_bool, p, p, p, p, i64, i64, i32, p, p]
    fn.restype = i32
    return fn


def gpu_gemm() -> Callable:
    """C = op(A)·op(B) by a version's number through the cuda stage's library (exact_check.gpu_gemm)."""
    return exact_check.gpu_gemm(library())


# ---- timings ----
def fwd_bwd_call(fn: Callable, tensors: list[torch.Tensor], g: torch.Tensor) -> Callable[[], object]:
    """A timed call of fn's forward and backward (the gradients of every tensor, upstream `g`)."""
    return lambda: torch.autograd.grad(fn(*tensors), tensors, g)


def forward_call(fn: Callable, tensors: list[torch.Tensor]) -> Callable[[], object]:
    """A timed call of fn's forward alone, with no autograd graph recorded."""
    def call():
        with torch.no_grad():
            return fn(*tensors)
    return call


def version_call(v: int, fn: Callable, tensors: list[torch.Tensor]) -> Callable[[], object]:
    """A timed forward of the cuda stage's op with version `v` selected before each call, so that
    versions timed side by side, round by round, each run as themselves."""
    cuda = modes.stage("cuda")

    def call():
        cuda.select_kernel(v)  # a host-side switch (a few µs, inside the timing; the calls last ms)
        with torch.no_grad():
            return fn(*tensors)
    return call


def speed_ratio(stats: dict, mine: str, ref: str) -> dict:
    """Speed of ``mine`` as a share of ``ref``'s: ref time / mine time, per round."""
    paired = timing.paired_ratio(stats[ref].samples, stats[mine].samples)
    return {"speed": paired["ratio"], "ci": paired["ci"]}


def runnable(fns: dict[str, Callable[[], object]]) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """(the lines whose call succeeds once, {line: why not} for the others): a line whose launch
    fails is left out of the timing and recorded, and the others are timed."""
    ok, failed = {}, {}
    for name, fn in fns.items():
        try:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # an asynchronous launch error shows here, still this line's
            ok[name] = fn
        except RuntimeError as e:
            failed[name] = first_line(e)
            print(f"FAIL  {name}: {failed[name]} (not timed)", flush=True)
    return ok, failed


def table_rows(stats: dict, shape: tuple[int, int, int], refs: tuple[str, ...]) -> list[dict]:
    """A timing table's rows: each line's median µs, spread, GFLOP/s at `shape` and its speed as a
    share of the lines `refs` names (of_cublas, of_reference)."""
    flops = 2 * shape[0] * shape[1] * shape[2]
    return [{"line": name, "forward_us": s.median, "spread_us": s.spread, "gflops": flops / s.median / 1e3,
             **{key: speed_ratio(stats, name, ref) for key, ref in zip(("of_cublas", "of_reference"), refs)}}
            for name, s in stats.items()]


def table_at(shape: tuple[int, int, int], rounds: int, dtype: torch.dtype, versions: list[int],
              out: dict, save: Save) -> dict:
    """cuBLAS's x·Wᵀ, the reference and each version's forward at `shape`, in `dtype`, timed side by side."""
    torch.backends.cuda.matmul.allow_tf32 = False
    (x, w, b), _ = benchmark.inputs(*shape, DEVICE, dtype, 0)
    fns = {"cuBLAS x·Wᵀ": forward_call(lambda x, w, b: torch.mm(x, w.t()), [x, w, b]),
           "reference": forward_call(benchmark.reference, [x, w, b])}
    dense = modes.dense("cuda")
    for v in versions:
        fns[f"v{v}"] = version_call(v, dense, [x, w, b])
    fns, failed = runnable(fns)
    modes.stage("cuda").select_kernel(0)
    out.update({"shape": list(shape), "rounds": rounds, "tf32": False, "failed": failed})
    stats = timing.measure(fns, device=DEVICE, rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    out["rows"] = table_rows(stats, shape, ("cuBLAS x·Wᵀ", "reference"))
    save()
    return out


def catalog_grad_versions() -> int:
    """kGradVersions of cuda/dense_kernels.h: the sigmoid-grad kernels are v1 to that."""
    import re

    found = re.search(r"constexpr int kGradVersions = (\d+)", catalog.HEADER.read_text())
    if found is None:
        raise cli.UserError(f"{catalog.HEADER.name} declares no kGradVersions")
    return int(found.group(1))


def check_shape(version: int, dtype: torch.dtype, row_multiple: Callable[[int, torch.dtype], int] | None = None
                ) -> tuple[int, int, int]:
    """Where a version is checked against float64: CHECK_SHAPES[1], odd in every dimension, or
    for a TMA version (rows of whole 16 bytes) ALIGNED_CHECK, multiples of 8 that leave partial tiles."""
    r = (row_multiple or exact_check.row_multiples())(version, dtype)
    return CHECK_SHAPES[1] if r == 1 else ALIGNED_CHECK


def check_bf16(versions: list[int], seed: int = 50) -> dict:
    """Each version's bfloat16 forward against float64 on fresh inputs, {"v<N>": {"rel_error",
    "ok"} or {"error", "ok": False}}: a version that fails is not timed."""
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    checked = {}
    for v in versions:
        (x, w, b), _ = benchmark.inputs(*check_shape(v, torch.bfloat16), DEVICE, torch.bfloat16, seed + v)
        try:
            cuda.select_kernel(v)
            with torch.no_grad():
                error = rel_error(dense(x, w, b), benchmark.reference(*(t.detach().double() for t in (x, w, b))))
            checked[f"v{v}"] = {"rel_error": error, "ok": error < BF16_TOLERANCE}
        except RuntimeError as e:
            checked[f"v{v}"] = {"error": first_line(e), "ok": False}
        print(f"{'PASS' if checked[f'v{v}']['ok'] else 'FAIL'}  bfloat16 v{v}: {checked[f'v{v}']}", flush=True)
    cuda.select_kernel(0)
    return checked


def seconds(call: Callable[[], object]) -> float:
    """One call's seconds: CUDA events on the GPU, the wall clock elsewhere (the tests)."""
    if DEVICE != "cuda":
        import time

        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def sm_count() -> int:
    """The GPU's streaming multiprocessors (the tests stand a small number in)."""
    return torch.cuda.get_device_properties(0).multi_processor_count


def stream() -> int | None:
    """torch's current CUDA stream, for the library's launches (None, the default, elsewhere)."""
    return torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else None


def synchronize() -> None:
    """Wait for the GPU's queued work (nothing to wait for on DEVICE "cpu")."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def verdict(value_ci: list[float] | None, goal: float, at_least: bool = True) -> str:
    """A goal's verdict from a 95% interval: met or missed only when the whole interval is on one
    side of the goal (at least it, or with at_least False at most it), else not settled."""
    if value_ci is None:
        return "not settled"
    lo, hi = value_ci
    if at_least:
        return "met" if lo >= goal else "missed" if hi < goal else "not settled"
    return "met" if hi <= goal else "missed" if lo > goal else "not settled"


# ---- the autotuning candidates: v11's template at the shapes of DENSE_TUNE_CANDIDATES ----
# They have no version number of their own in the stage's op; dense_kernels.cu exports their
# launcher (dense_tune_launch) from the stage's library, which this process has loaded.
def tune_forward(lib, i: int, tensors: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Candidate i's forward, sigmoid(x·Wᵀ + b), on torch's current stream."""
    x, w, b = tensors

    def call() -> torch.Tensor:
        m, k, n = x.shape[0], x.shape[1], w.shape[0]
        y = torch.empty(m, n, device=x.device, dtype=x.dtype)
        rc = lib.dense_tune_launch(i, b"nt", x.data_ptr(), w.data_ptr(), y.data_ptr(), b.data_ptr(), m, n, k, 1,
                                   torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"candidate {i}: the launch failed with cudaError {rc}")
        return y
    return call
