"""Check and time chapter 4's GEMM versions (the tensor cores' too) and chapter 5's PTX edits on a GPU.

Parts (any of them, in this order; each adds one key to the record, written again after every
measurement, so that a run stopped half-way keeps what it measured):
  check    chapter 4's GEMM versions (1 to kVersions of cuda/dense_kernels.h, float32 on the CUDA
           cores), forward and backward, against a float64 reference on fresh random inputs at
           odd shapes and at 4096³: ‖out − ref‖ / ‖ref‖ per output, NaN never passes
  exact    every GEMM entry on the GPU against the CPU emulation's bits (cuda/exact_check.py, whose
           committed file holds them), in this one process; the lease runs one version a process
           (cuda/isolated.py exact), so that a fault or a hang costs that version alone
  gemm     SGEMM_CUDA's table: each of those versions' forward at B = I = O = 4096, GFLOP/s and
           its speed as a share of cuBLAS's x·Wᵀ (TF32 off) and of the reference
           sigmoid(x·Wᵀ + b) (cuBLAS GEMM with the bias, then the sigmoid's own kernel)
  goals    the stage's goals, each a ratio of speeds measured side by side: the automatic
           version's forward against the reference at 4096³ (goal ≥ 0.90), its forward + backward
           against the reference's (≥ 0.75), its forward at B = 32, I = O = 4096 (≥ 1.0)
  small    the same table at B = 32, I = O = 4096, for every version built for float32 (the tensor
           cores' TF32 ones too) beside cuBLAS's x·Wᵀ and the reference
  grad     the backward's elementwise kernels (sigmoid-grad v1 to v3, dz = g·y·(1 − y) with the bias
           gradient Σ_rows dz) against torch's sigmoid backward and sum, at 32, 4096 and 65536 rows
           of 4096 columns
  bf16     the versions built for bfloat16, each checked against float64 first, against cuBLAS's
           bfloat16 x·Wᵀ and the reference in bfloat16, at 4096³ and at B = 32
  roof     the tensor cores' roofs (cuda/tensor_cores/roof.cuh): mma.sync m16n8k16 and wgmma
           m64n256k16 in loops with nothing else to do, each result checked, in TFLOP/s, beside
           cuBLAS's bfloat16 x·Wᵀ and each tensor-core version's bfloat16 forward (checked against
           float64 first) at 4096³, each as a share of its own instruction's roof measured in the
           same rounds (goal: v24 ≥ 0.85 of mma.sync's)
  tf32     the float32 versions on the tensor cores (TF32, split-TF32): their error against float64
           beside cuBLAS float32's and cuBLAS TF32's at 256³, 1024³ and 4096³, as a multiple of
           cuBLAS float32's (goal: split-TF32 at most 2×), then their forward at 4096³ against
           cuBLAS's x·Wᵀ and the reference, TF32 off (goal: v34 ≥ 1.5× the reference)
  goals16  the stage's goals in bfloat16: the automatic version's forward against the reference at
           4096³ (goal ≥ 1.0), its forward + backward (≥ 0.90), its forward at B = 32, I = O = 4096
           (≥ 1.0) beside the time to read W once at the bandwidth a device copy reaches here and
           at the card's datasheet bandwidth; version 0 checked against float64 first
  ptx      the ptx stage with the hand-edited PTX against the compiler's own (ptx/generated/,
           written by bash ptx/regen.sh), alternating round by round: at 4096³, where EDIT-A's
           sigmoid is in the GEMM's epilogue, and at B = 65536, I = 64, O = 4096, where the
           backward's elementwise kernel (EDIT-B's 128-bit accesses) is a large share of the time
  profile  chapter 4's versions' forward once at 2048³, v1's and v2's forward + backward, and each
           sigmoid-grad version once, and nothing else: what --ncu runs under Nsight Compute
  candidates  the autotuning candidates (cuda/dense_kernels.h DENSE_TUNE_CANDIDATES), each checked
           against float64 first (one that fails is not timed), then every candidate's forward
           against the reference and against version 0 (what cuda/gemm_choice.h picks today), at
           4096³ and at B = 32, I = O = 4096, with every version beside them
The versions, their element types and the candidates come from cuda/dense_kernels.h (read by
cuda/catalog.py): one added there is checked, compared and timed here with no list to edit. A
version or candidate whose launch fails is recorded as failed and the others still run.
Times come from benchmark.measure (CUDA events, L2 flushed before each call, variants
interleaved round by round); a ratio is the median of per-round ratios with its 95% interval.

Examples:
  python cuda/bench_gpu.py check                          # GPU: every version against float64
  python cuda/bench_gpu.py exact                          # GPU: every entry against the CPU emulation
  python cuda/bench_gpu.py gemm goals --json /tmp/gpu.json
  python cuda/bench_gpu.py small grad bf16 --rounds 10
  python cuda/bench_gpu.py roof tf32 goals16 --rounds 10 --json /tmp/tc.json
  python cuda/bench_gpu.py ptx --rounds 10
  python cuda/bench_gpu.py candidates --rounds 10 --json /tmp/tune.json
  compute-sanitizer --tool racecheck python cuda/bench_gpu.py check --odd-only
  python cuda/bench_gpu.py --ncu --json /tmp/ncu.json    # GPU and Nsight Compute: the counters per version
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the repository's modules, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (first: a Ctrl-C during the imports below is one line too)

# isort: split
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

import benchmark  # noqa: E402
import modes  # noqa: E402

catalog = cli.load_file("cuda/catalog.py", "dense_cuda_catalog")  # what dense_kernels.h declares, as text

PARTS = ("check", "exact", "gemm", "goals", "small", "grad", "bf16", "roof", "tf32", "goals16", "ptx", "profile",
         "candidates")
BIG = (4096, 4096, 4096)
SMALL_BATCH = (32, 4096, 4096)
WIDE = (65536, 64, 4096)
CHECK_SHAPES = ((33, 65, 17), (257, 1031, 129), BIG)
TOLERANCE = 1e-4  # float32 against float64: far under 1e-3 (TF32 would be near 3e-4)
BF16_TOLERANCE = 1e-2  # bfloat16 rounds each output once at the store: 2^-9 ≈ 2e-3 relative
GOALS = {"forward": 0.90, "fwd+bwd": 0.75, "forward, B=32": 1.0}
GOALS16 = {"forward": 1.0, "fwd+bwd": 0.90, "forward, B=32": 1.0}  # the Hopper versions' (bfloat16)
GRAD_ROWS = (32, 4096, 65536)  # the backward's elementwise kernels: rows of 4096 columns
ALIGNED_CHECK = (264, 1032, 136)  # CHECK_SHAPES[1] for the TMA versions: multiples of 8, partial tiles
DTYPE_CODES = {name: code for code, name in enumerate(catalog.DTYPES)}  # dense_kernels::DType
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
CODE_OF = {TORCH_DTYPES[name]: code for name, code in DTYPE_CODES.items()}
DEVICE = "cuda"  # where the tensor-core parts run; tests/test_roof.py runs them on "cpu", in the emulation


def _versions(dtype: str = "f32") -> list[int]:
    """The GEMM versions (0, the automatic choice, apart) built for `dtype`, as
    cuda/dense_kernels.h lists them (read anew on each call): a version added there is compared
    and timed here with no list to edit."""
    return catalog.version_ids(dtype=dtype)


KERNEL: int | None = None  # --kernel N: the timing parts time version N alone, by its number (main sets it)


def _only(versions: list[int]) -> list[int]:
    """`versions`, or with --kernel N the ones of them that are N: a version never run on a GPU is
    timed in a process of its own (cuda/isolated.py kernels), never through version 0."""
    return versions if KERNEL is None else [v for v in versions if v == KERNEL]


def _chapter_versions() -> list[int]:
    """Chapter 4's progression on the CUDA cores, 1 to kVersions of the header: float32 all the
    way, so checked against float64 at float32's tolerance (a TF32 tensor-core version would not
    meet it) and shown in the chapter's table, whose cuBLAS line has TF32 off."""
    return catalog.cuda_core_versions()


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


Save = Callable[[], None]  # writes the record as it stands (main's): called after every measurement


def _nothing() -> None:
    pass


def check(odd_only: bool = False, seed: int = 1, out: dict | None = None, save: Save = _nothing) -> dict:
    """Every version's forward and gradients against float64, fresh inputs per version and shape.
    A version whose call fails is a failed row with the error; the others still run."""
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    out = {} if out is None else out
    out.update({"tolerance": TOLERANCE, "rows": [], "failed": 0})
    for shape in CHECK_SHAPES[:-1] if odd_only else CHECK_SHAPES:
        for v in _chapter_versions():
            seed += 1
            row: dict = {"version": v, "shape": list(shape)}
            try:
                cuda.select_kernel(v)
                (x, w, b), g = benchmark._inputs(*shape, "cuda", torch.float32, seed)
                y = dense(x, w, b)
                grads = torch.autograd.grad(y, (x, w, b), g)
                ref_in = [t.detach().double().requires_grad_() for t in (x, w, b)]
                ref_y = benchmark.reference(*ref_in)
                ref_grads = torch.autograd.grad(ref_y, ref_in, g.double())
                row["rel_errors"] = {name: _rel(o, r) for name, o, r in zip(("y", "grad_x", "grad_w", "grad_b"),
                                                                             (y, *grads), (ref_y, *ref_grads))}
                row["ok"] = all(e < TOLERANCE for e in row["rel_errors"].values())
                said = ", ".join(f"{k} {e:.1e}" for k, e in row["rel_errors"].items())
            except RuntimeError as e:  # a launch that fails: this version fails, the next one runs
                row.update({"ok": False, "error": _first_line(e)})
                said = row["error"]
            out["rows"].append(row)
            out["failed"] += not row["ok"]
            print(f"{'PASS' if row['ok'] else 'FAIL'}  v{v} B={shape[0]} I={shape[1]} O={shape[2]}: {said}", flush=True)
            save()
    cuda.select_kernel(0)
    return out


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


# ---- the GPU library's entries; the exact comparison is cuda/exact_check.py's ----
exact_check = cli.load_file("cuda/exact_check.py", "dense_cuda_exact_check")


def _library():
    """The cuda stage's loaded library, its C entry points typed (exact_check.library)."""
    return exact_check.library()


def _grad_launcher(lib):
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


def _gpu_gemm() -> Callable:
    """C = op(A)·op(B) by a version's number through the cuda stage's library (exact_check.gpu_gemm)."""
    return exact_check.gpu_gemm(_library())


def exact(out: dict | None = None, save: Save = _nothing) -> dict:
    """Every entry against the emulation's committed bits (cuda/exact_check.py), in this one
    process: a fault stops it. The lease runs it one version a process (cuda/isolated.py exact)."""
    out = {} if out is None else out
    expected = exact_check.read_expected()["expected"]  # its keys name the entries: no emulation needed here
    out.update(exact_check.compare(exact_check.from_keys(list(expected)), expected, _gpu_gemm()))
    save()
    return out


# ---- timings ----
def _both(fn: Callable, tensors: list[torch.Tensor], g: torch.Tensor) -> Callable[[], object]:
    return lambda: torch.autograd.grad(fn(*tensors), tensors, g)


def _forward(fn: Callable, tensors: list[torch.Tensor]) -> Callable[[], object]:
    def call():
        with torch.no_grad():
            return fn(*tensors)
    return call


def _version(v: int, fn: Callable, tensors: list[torch.Tensor]) -> Callable[[], object]:
    cuda = modes.stage("cuda")

    def call():
        cuda.select_kernel(v)  # a host-side switch (a few µs, inside the timing; the calls last ms)
        with torch.no_grad():
            return fn(*tensors)
    return call


def _ratio(stats: dict, mine: str, ref: str) -> dict:
    """Speed of ``mine`` as a share of ``ref``'s: ref time / mine time, per round."""
    paired = benchmark.paired_ratio(stats[ref].samples, stats[mine].samples)
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
            failed[name] = _first_line(e)
            print(f"FAIL  {name}: {failed[name]} (not timed)", flush=True)
    return ok, failed


def _rows(stats: dict, shape: tuple[int, int, int], refs: tuple[str, ...]) -> list[dict]:
    flops = 2 * shape[0] * shape[1] * shape[2]
    return [{"line": name, "forward_us": s.median, "spread_us": s.spread, "gflops": flops / s.median / 1e3,
             **{key: _ratio(stats, name, ref) for key, ref in zip(("of_cublas", "of_reference"), refs)}}
            for name, s in stats.items()]


def _table_at(shape: tuple[int, int, int], rounds: int, dtype: torch.dtype, versions: list[int],
              out: dict, save: Save) -> dict:
    """cuBLAS's x·Wᵀ, the reference and each version's forward at `shape`, in `dtype`, timed side by side."""
    torch.backends.cuda.matmul.allow_tf32 = False
    (x, w, b), _ = benchmark._inputs(*shape, DEVICE, dtype, 0)
    fns = {"cuBLAS x·Wᵀ": _forward(lambda x, w, b: torch.mm(x, w.t()), [x, w, b]),
           "reference": _forward(benchmark.reference, [x, w, b])}
    dense = modes.dense("cuda")
    for v in versions:
        fns[f"v{v}"] = _version(v, dense, [x, w, b])
    fns, failed = runnable(fns)
    modes.stage("cuda").select_kernel(0)
    out.update({"shape": list(shape), "rounds": rounds, "tf32": False, "failed": failed})
    stats = benchmark.measure(fns, device=DEVICE, rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    out["rows"] = _rows(stats, shape, ("cuBLAS x·Wᵀ", "reference"))
    save()
    return out


def gemm(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": catalog.idea(v) for v in _only(_chapter_versions())}
    return _table_at(BIG, rounds, torch.float32, _only(_chapter_versions()), out, save)


def small(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    """gemm's table at B = 32: every version built for float32 (each can run there; the tensor
    cores' among them, which exact compares with the emulation), cuBLAS and the reference."""
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": catalog.idea(v) for v in _only([0, *_versions()])}
    return _table_at(SMALL_BATCH, rounds, torch.float32, _only([0, *_versions()]), out, save)


def goals(rounds: int, out: dict | None = None, save: Save = _nothing, dtype: torch.dtype = torch.float32,
          targets: dict[str, float] | None = None) -> dict:
    """Version 0 against the reference, in `dtype`, for each goal of `targets` (GOALS by default)."""
    targets = GOALS if targets is None else targets
    torch.backends.cuda.matmul.allow_tf32 = False
    modes.stage("cuda").select_kernel(KERNEL or 0)  # --kernel N: version N's goals, by its number
    dense = modes.dense("cuda")
    out = {} if out is None else out
    out.update({"rounds": rounds, "version": f"v{KERNEL}" if KERNEL else "automatic",
                "dtype": str(dtype).removeprefix("torch."), "goals": {}})
    for shape in (BIG, SMALL_BATCH):
        tensors, g = benchmark._inputs(*shape, DEVICE, dtype, 0)
        fns = {"reference/forward": _forward(benchmark.reference, tensors),
               "cuda/forward": _forward(dense, tensors)}
        if shape == BIG:
            fns["reference/fwd+bwd"] = _both(benchmark.reference, tensors, g)
            fns["cuda/fwd+bwd"] = _both(dense, tensors, g)
        stats = benchmark.measure(fns, device=DEVICE, rounds=rounds)
        for what in ("forward", "fwd+bwd"):
            if f"cuda/{what}" not in stats:
                continue
            name = what if shape == BIG else f"{what}, B={shape[0]}"
            r = _ratio(stats, f"cuda/{what}", f"reference/{what}")
            lo = r["ci"][0] if r["ci"] else None
            out["goals"][name] = {"shape": list(shape), "cuda_us": stats[f"cuda/{what}"].median,
                                  "reference_us": stats[f"reference/{what}"].median, **r, "goal": targets[name],
                                  "met": lo is not None and lo >= targets[name],
                                  "missed": r["ci"] is not None and r["ci"][1] < targets[name]}
        save()
    return out


def grad(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    """The sigmoid-grad kernels, each with the bias gradient, against torch's sigmoid backward and
    column sum (what the reference's backward runs for them), at GRAD_ROWS rows of 4096 columns."""
    launch = _grad_launcher(_library())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cols = BIG[2]
    out = {} if out is None else out
    out.update({"rounds": rounds, "cols": cols, "shapes": {}})
    for rows in GRAD_ROWS:
        gen = torch.Generator().manual_seed(rows)
        g = torch.randn(rows, cols, generator=gen).cuda()
        y = torch.rand(rows, cols, generator=gen).cuda()
        dz, db = torch.empty_like(y), torch.empty(cols, device="cuda")
        # v3's partial column sums: one row of them per block along the rows, never more blocks
        # than SMs (dense_kernels::grad_row_blocks), so sm_count rows always suffice.
        work = torch.empty(sms * cols, device="cuda")
        fns: dict[str, Callable[[], object]] = {
            "torch: sigmoid backward + sum": lambda g=g, y=y: torch.ops.aten.sigmoid_backward(g, y).sum(0)}
        for v in range(1, catalog_grad_versions() + 1):
            def call(v=v, g=g, y=y, dz=dz, db=db, work=work, rows=rows):
                rc = launch(v, DTYPE_CODES["f32"], False, g.data_ptr(), y.data_ptr(), dz.data_ptr(), db.data_ptr(),
                            rows, cols, sms, work.data_ptr(), torch.cuda.current_stream().cuda_stream)
                if rc != 0:
                    raise RuntimeError(f"sigmoid-grad v{v}: the launch failed with cudaError {rc}")
                return dz
            fns[f"sigmoid-grad v{v}"] = call
        fns, failed = runnable(fns)
        checked = {}
        want_dz, want_db = g * y * (1 - y), (g * y * (1 - y)).double().sum(0)
        for name in [n for n in fns if n.startswith("sigmoid-grad")]:
            fns[name]()
            checked[name] = {"dz": _rel(dz, want_dz.double()), "db": _rel(db, want_db)}
            if max(checked[name].values()) >= TOLERANCE:
                failed[name] = f"wrong result: {checked[name]}"
                del fns[name]
        stats = benchmark.measure(fns, device="cuda", rounds=rounds)
        moved = 3 * rows * cols * 4  # bytes: g and y read, dz written
        out["shapes"][str(rows)] = {"rows": rows, "failed": failed, "rel_errors": checked, "lines": [
            {"line": name, "us": s.median, "spread_us": s.spread, "gb_per_s": moved / s.median / 1e3,
             "of_torch": _ratio(stats, name, "torch: sigmoid backward + sum")} for name, s in stats.items()]}
        save()
    return out


def catalog_grad_versions() -> int:
    """kGradVersions of cuda/dense_kernels.h: the sigmoid-grad kernels are v1 to that."""
    import re

    found = re.search(r"constexpr int kGradVersions = (\d+)", catalog.HEADER.read_text())
    if found is None:
        raise cli.UserError(f"{catalog.HEADER.name} declares no kGradVersions")
    return int(found.group(1))


def bf16(rounds: int, out: dict | None = None, save: Save = _nothing, seed: int = 50) -> dict:
    """The versions built for bfloat16, checked against float64 once, then timed against cuBLAS's
    bfloat16 x·Wᵀ and the reference in bfloat16, at 4096³ and at B = 32."""
    out = {} if out is None else out
    versions = _only([0, *_versions("bf16")])
    out["checked"] = check_bf16(versions, seed)
    passed = [v for v in versions if out["checked"][f"v{v}"]["ok"]]
    out["tolerance"], out["shapes"] = BF16_TOLERANCE, {}
    save()
    for shape in (BIG, SMALL_BATCH):
        _table_at(shape, rounds, torch.bfloat16, passed, out["shapes"].setdefault("×".join(map(str, shape)), {}), save)
    return out


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
        (x, w, b), _ = benchmark._inputs(*check_shape(v, torch.bfloat16), DEVICE, torch.bfloat16, seed + v)
        try:
            cuda.select_kernel(v)
            with torch.no_grad():
                error = _rel(dense(x, w, b), benchmark.reference(*(t.detach().double() for t in (x, w, b))))
            checked[f"v{v}"] = {"rel_error": error, "ok": error < BF16_TOLERANCE}
        except RuntimeError as e:
            checked[f"v{v}"] = {"error": _first_line(e), "ok": False}
        print(f"{'PASS' if checked[f'v{v}']['ok'] else 'FAIL'}  bfloat16 v{v}: {checked[f'v{v}']}", flush=True)
    cuda.select_kernel(0)
    return checked


# ---- the tensor cores' roofs, split-TF32's error and speed, the bfloat16 goals ----
ROOFS = {"mma.sync": 0, "wgmma": 1}  # dense_kernels::RoofKind (cuda/tensor_cores/roof.cuh)
ROOF_INSTRUCTIONS = {"mma.sync": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                     "wgmma": "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"}
ROOF_GOALS = {"v24": ("mma.sync", 0.85)}  # a version, its instruction's roof, the share it must reach
ROOF_TARGET_MS = 2.0  # a roof launch: long beside its launch's microseconds, short for a lease
ROOF_MAX_ITERATIONS = 1 << 18  # powers of two up to 2^20 keep every sum of the check exact
TF32_SIZES = (256, 1024, 4096)  # B = I = O; multiples of 4, as the TMA version (v34) needs in float32
TF32_TOLERANCE = 1e-2  # a sanity check before timing: TF32's own error at 4096 is about 1e-3
TF32_SPEED_GOALS = {"v34": 1.5}  # forward / the reference's, float32, 4096³
TF32_ERROR_GOALS = {"v26": 2.0, "v34": 2.0}  # the largest error / cuBLAS float32's, at every size
COPY_BYTES = 1 << 30  # the device copy that measures the bandwidth W is read at


def _static_report():
    return cli.load_file("cuda/static_report.py", "dense_cuda_static_report")


def roof_instruction(version: int) -> str | None:
    """The tensor-core instruction a version's main loop issues, from cuda/static_report.py's TILES
    ("mma" m16n8k16 or m16n8k8: mma.sync; m64nNk..: wgmma); None for the CUDA cores' versions."""
    mma = _static_report().TILES.get(version, {}).get("mma")
    return None if mma is None else "wgmma" if mma.startswith("m64") else "mma.sync"


def roof_versions(dtype: str = "bf16") -> list[int]:
    """The versions built for `dtype` that run on the tensor cores (v21-v24 and v31-v35 in bfloat16,
    v25, v26 and v34 in float32), as cuda/dense_kernels.h and TILES list them."""
    return [v for v in _versions(dtype) if roof_instruction(v)]


def roof_expected(flops: int, threads: int, iterations: int) -> float:
    """What each thread of a roof writes: half its share of a block's FLOPs per iteration, times
    the iterations (every operand is 1.0, so its accumulators add up to its multiply-adds)."""
    return flops / threads / 2 * iterations


def check_roof(out: torch.Tensor, flops: int, threads: int, iterations: int) -> str | None:
    """None if every thread wrote roof_expected, else the first that did not and how many."""
    want = roof_expected(flops, threads, iterations)
    wrong = (out != want).nonzero()
    if len(wrong) == 0:
        return None
    i = int(wrong[0])
    return f"thread {i} wrote {float(out[i])!r}, not {want!r} ({len(wrong)} of {out.numel()} threads wrong)"


def roof_iterations(seconds: Callable[[int], float], target_s: float | None = None, cap: int | None = None) -> int:
    """The iterations, a power of two, that make one launch last at least target_s (ROOF_TARGET_MS
    by default; seconds(n): one launch of n iterations, timed), or cap (ROOF_MAX_ITERATIONS)."""
    target_s = ROOF_TARGET_MS / 1e3 if target_s is None else target_s
    cap = cap or ROOF_MAX_ITERATIONS
    n = min(64, cap)
    while n < cap and seconds(n) < target_s:
        n *= 2
    return n


def _roof_api(lib):
    """dense_roof_launch and dense_roof_info of the cuda stage's library (cuda/dense_kernels.cu)."""
    import ctypes

    launch, info = getattr(lib, "dense_roof_launch", None), getattr(lib, "dense_roof_info", None)
    if launch is None or info is None:
        raise cli.UserError("the cuda stage's library does not export dense_roof_launch: rebuild it "
                            "(python -c \"import modes; modes.build('cuda')\")")
    launch.argtypes, launch.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p], \
        ctypes.c_int
    info.argtypes, info.restype = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)], ctypes.c_int
    return launch, info


def _seconds(call: Callable[[], object]) -> float:
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


def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _stream() -> int | None:
    """torch's current CUDA stream, for the library's launches (None, the default, elsewhere)."""
    return torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else None


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _roof_lines(lib, sms: int, out: dict) -> dict[str, tuple[Callable[[], object], int]]:
    """Each roof, sized (a full wave of blocks, iterations for ROOF_TARGET_MS) and checked:
    {line: (its launch, FLOPs a launch)}; a roof that cannot run or computes wrong is in out["failed"]."""
    import ctypes

    launch, info = _roof_api(lib)
    lines = {}
    for name, kind in ROOFS.items():
        line = f"roof: {name}"
        got = (ctypes.c_int64 * 3)()
        rc = info(kind, got)
        if rc != 0:
            out["failed"][line] = f"dense_roof_info failed with cudaError {rc}"
            continue
        threads, flops, per_sm = (int(g) for g in got)
        blocks = sms * max(per_sm, 1)
        buf = torch.full((blocks * threads,), float("nan"), device=DEVICE)

        def run(n: int, kind: int = kind, blocks: int = blocks, buf: torch.Tensor = buf, name: str = name) -> None:
            rc = launch(kind, blocks, n, buf.data_ptr(), _stream())
            if rc != 0:
                raise RuntimeError(f"the {name} roof's launch failed with cudaError {rc}")
        try:
            run(1)  # the first launch loads the module: not a cost of the loop
            _synchronize()
            n = roof_iterations(lambda n, run=run: _seconds(lambda: run(n)))
            buf.fill_(float("nan"))
            run(n)
            _synchronize()
            wrong = check_roof(buf.cpu(), flops, threads, n)
        except RuntimeError as e:
            out["failed"][line] = _first_line(e)
            print(f"FAIL  {line}: {out['failed'][line]} (not timed)", flush=True)
            continue
        out["roofs"][name] = {"instruction": ROOF_INSTRUCTIONS[name], "blocks": blocks, "threads": threads,
                              "blocks_per_sm": per_sm, "iterations": n, "flops": flops * blocks * n,
                              "checked": wrong is None}
        if wrong:
            out["failed"][line] = f"wrong result: {wrong}"
            print(f"FAIL  {line}: {out['failed'][line]} (not timed)", flush=True)
            continue
        print(f"PASS  {line}: {blocks} blocks × {n} iterations, every thread's sum exact", flush=True)
        lines[line] = (lambda run=run, n=n: run(n), flops * blocks * n)
    return lines


def _tflops(flops: int, stats) -> dict:
    """Median TFLOP/s and its interquartile range, from per-call µs."""
    import statistics

    q = statistics.quantiles(stats.samples, n=4) if len(stats.samples) > 1 else [stats.median] * 3
    return {"tflops": flops / stats.median / 1e6, "tflops_iqr": [flops / q[2] / 1e6, flops / q[0] / 1e6]}


def _share(stats: dict, line: str, flops: int, roof_line: str, roof_flops: int) -> dict:
    """`line`'s FLOP rate as a share of the roof line's, round by round (paired): (its FLOPs / its
    time) / (the roof's FLOPs / the roof's time)."""
    paired = benchmark.paired_ratio(stats[roof_line].samples, stats[line].samples)
    scale = flops / roof_flops
    return {"roof": roof_line.removeprefix("roof: "), "share": paired["ratio"] * scale,
            "ci": [c * scale for c in paired["ci"]] if paired["ci"] else None}


def _verdict(value_ci: list[float] | None, goal: float, at_least: bool = True) -> str:
    if value_ci is None:
        return "not settled"
    lo, hi = value_ci
    if at_least:
        return "met" if lo >= goal else "missed" if hi < goal else "not settled"
    return "met" if hi <= goal else "missed" if lo > goal else "not settled"


def roof(rounds: int, out: dict | None = None, save: Save = _nothing, seed: int = 70) -> dict:
    """The roofs, cuBLAS's bfloat16 x·Wᵀ and each tensor-core version's bfloat16 forward at 4096³,
    timed side by side (see the module's doc)."""
    out = {} if out is None else out
    out.update({"rounds": rounds, "shape": list(BIG), "dtype": "bfloat16", "roofs": {}, "failed": {}})
    lines = _roof_lines(_library(), _sm_count(), out)
    versions = _only(roof_versions("bf16"))
    out["checked"] = check_bf16(versions, seed)
    out["tolerance"] = BF16_TOLERANCE
    save()
    flops = 2 * BIG[0] * BIG[1] * BIG[2]
    (x, w, b), _ = benchmark._inputs(*BIG, DEVICE, torch.bfloat16, 0)
    dense = modes.dense("cuda")
    fns = {line: call for line, (call, _) in lines.items()}
    fns["cuBLAS bf16 x·Wᵀ"] = _forward(lambda x, w, b: torch.mm(x, w.t()), [x, w, b])
    for v in versions:
        if out["checked"][f"v{v}"]["ok"]:
            fns[f"v{v}"] = _version(v, dense, [x, w, b])
        else:
            out["failed"][f"v{v}"] = "failed the float64 check"
    fns, failed = runnable(fns)
    out["failed"].update(failed)
    modes.stage("cuda").select_kernel(0)
    stats = benchmark.measure(fns, device=DEVICE, rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    if DEVICE == "cuda":
        out["gpu_after"] = benchmark.describe_gpu().get("nvidia_smi")  # the clocks just after the roofs ran
    work = {line: lines[line][1] if line in lines else flops for line in stats}
    instruction = {f"roof: {r}": r for r in ROOFS} | {f"v{v}": roof_instruction(v) for v in versions}
    instruction["cuBLAS bf16 x·Wᵀ"] = "wgmma"  # (on Hopper; its share of that roof says how close a library gets)
    out["rows"] = []
    for line, s in stats.items():
        row = {"line": line, "instruction": instruction.get(line), "us": s.median, "spread_us": s.spread,
               **_tflops(work[line], s)}
        roof_line = f"roof: {instruction.get(line)}"
        if roof_line in stats:
            row["of_roof"] = _share(stats, line, work[line], roof_line, work[roof_line])
        if not line.startswith("roof") and "cuBLAS bf16 x·Wᵀ" in stats:
            row["of_cublas"] = _ratio(stats, line, "cuBLAS bf16 x·Wᵀ")
        out["rows"].append(row)
    out["goals"] = {}
    for line, (roof_name, goal) in ROOF_GOALS.items():
        row = next((r for r in out["rows"] if r["line"] == line and "of_roof" in r), None)
        out["goals"][line] = {"roof": roof_name, "goal": goal,
                              **({"share": row["of_roof"]["share"], "ci": row["of_roof"]["ci"],
                                  "verdict": _verdict(row["of_roof"]["ci"], goal)} if row else
                                 {"verdict": "not measured"})}
    save()
    return out


def tf32(rounds: int, out: dict | None = None, save: Save = _nothing, seed: int = 80) -> dict:
    """The tensor cores' float32 versions: error against float64 beside cuBLAS's, then speed."""
    out = {} if out is None else out
    versions = _only(roof_versions("f32"))
    out.update({"rounds": rounds, "sizes": list(TF32_SIZES), "versions": versions, "tolerance": TF32_TOLERANCE,
                "errors": {}})
    out["errors"] = tf32_errors(versions, _gpu_gemm(), seed, save=save, out=out["errors"])
    passed = [v for v in versions
              if all(e["lines"].get(f"v{v}", {}).get("rel", float("inf")) < TF32_TOLERANCE
                     for e in out["errors"].values())]
    out["timing"] = {}
    _table_at(BIG, rounds, torch.float32, passed, out["timing"], save)
    out["timing"]["failed"].update({f"v{v}": "failed the float64 check" for v in versions if v not in passed})
    out["goals"] = tf32_goals(out)
    save()
    return out


def tf32_errors(versions: list[int], gemm: Callable, seed: int = 80, save: Save = _nothing,
                out: dict | None = None, device: str | None = None, sizes: tuple[int, ...] | None = None) -> dict:
    """x·Wᵀ (no epilogue) at each of `sizes` against float64: cuBLAS float32 (TF32 off), cuBLAS
    TF32 (torch.backends.cuda.matmul.allow_tf32) and each version through gemm(version, "nt", x, w,
    m, n, k) -> C; per line the largest error, ‖error‖ / ‖truth‖ and the largest error as a
    multiple of cuBLAS float32's (the project's rule: a result is judged against the reference's
    own error on the same inputs). `device` and `sizes`: DEVICE and TF32_SIZES by default; on
    "cpu" (the tests) the library lines are torch's CPU GEMM, where allow_tf32 changes nothing."""
    out = {} if out is None else out
    device = device or DEVICE
    for n in sizes or TF32_SIZES:
        gen = torch.Generator().manual_seed(seed + n)
        x = torch.randn(n, n, generator=gen)
        w = torch.randn(n, n, generator=gen) * n ** -0.5  # nn.Linear's scale: x·Wᵀ ~ N(0, 1)
        xg, wg = x.to(device), w.to(device)
        truth = (xg.double() @ wg.double().t())
        got: dict[str, torch.Tensor | str] = {}
        try:
            for name, tf32_on in (("cuBLAS float32", False), ("cuBLAS TF32", True)):
                torch.backends.cuda.matmul.allow_tf32 = tf32_on
                got[name] = torch.mm(xg, wg.t())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        for v in versions:
            try:
                got[f"v{v}"] = gemm(v, "nt", x, w, n, n, n).to(truth.device)
            except (RuntimeError, ValueError) as e:
                got[f"v{v}"] = _first_line(e)
        lines = {}
        for name, c in got.items():
            if isinstance(c, str):
                lines[name] = {"error": c}
                continue
            diff = (c.double() - truth).abs()
            lines[name] = {"max_abs": float(diff.max()) if torch.isfinite(c).all() else float("inf"),
                           "rel": _rel(c, truth)}
        base = lines["cuBLAS float32"]["max_abs"]
        for entry in lines.values():
            if "max_abs" in entry:
                entry["of_cublas_f32"] = entry["max_abs"] / base if base > 0 else float("inf")
        out[str(n)] = {"shape": [n, n, n], "lines": lines}
        print(f"errors at {n}³: " + ", ".join(f"{k} {v['max_abs']:.2e}" if "max_abs" in v else f"{k} {v['error']}"
                                              for k, v in lines.items()), flush=True)
        save()
    return out


def tf32_goals(part: dict) -> list[dict]:
    """Issue's goals for split-TF32 from the tf32 part's record: speed (with its interval) and the
    largest error over the sizes as a multiple of cuBLAS float32's."""
    goals = []
    rows = {r["line"]: r for r in part.get("timing", {}).get("rows", [])}
    for line, goal in TF32_SPEED_GOALS.items():
        r = rows.get(line)
        goals.append({"goal": f"{line} forward / reference (float32, 4096³)", "target": f"≥ {goal}",
                      **({"value": r["of_reference"]["speed"], "ci": r["of_reference"]["ci"],
                          "verdict": _verdict(r["of_reference"]["ci"], goal)} if r else {"verdict": "not measured"})})
    for line, goal in TF32_ERROR_GOALS.items():
        ratios = [e["lines"].get(line, {}).get("of_cublas_f32") for e in part.get("errors", {}).values()]
        worst = None if not ratios or None in ratios else max(ratios)
        goals.append({"goal": f"{line} largest error / cuBLAS float32's (every size)", "target": f"≤ {goal}",
                      **({"value": worst, "ci": None, "verdict": "met" if worst <= goal else "missed"}
                         if worst is not None else {"verdict": "not measured"})})
    return goals


def copy_bandwidth(rounds: int, nbytes: int | None = None) -> dict:
    """Bytes read plus written per second by a device-to-device copy of `nbytes` (COPY_BYTES by
    default), timed as the kernels are (benchmark.measure)."""
    nbytes = nbytes or COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    stats = benchmark.measure({"copy": lambda: dst.copy_(src)}, device=DEVICE, rounds=rounds)["copy"]
    return {"bytes": 2 * nbytes, "us": stats.median, "bytes_per_s": 2 * nbytes / stats.median * 1e6}


def goals16(rounds: int, out: dict | None = None, save: Save = _nothing, seed: int = 90) -> dict:
    """The bfloat16 goals (GOALS16), version 0 checked against float64 at both shapes first; at
    B = 32 the time to read W once beside it, at a copy's measured bandwidth and the datasheet's."""
    out = {} if out is None else out
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    cuda.select_kernel(KERNEL or 0)
    out["checked"] = {}
    for shape in (BIG, SMALL_BATCH):
        (x, w, b), _ = benchmark._inputs(*shape, DEVICE, torch.bfloat16, seed)
        try:
            with torch.no_grad():
                error = _rel(dense(x, w, b), benchmark.reference(*(t.detach().double() for t in (x, w, b))))
            out["checked"]["×".join(map(str, shape))] = {"rel_error": error, "ok": error < BF16_TOLERANCE}
        except RuntimeError as e:
            out["checked"]["×".join(map(str, shape))] = {"error": _first_line(e), "ok": False}
    out["tolerance"] = BF16_TOLERANCE
    if not all(c["ok"] for c in out["checked"].values()):
        print(f"FAIL  bfloat16 version {KERNEL or 0} against float64: {out['checked']} (not timed)", flush=True)
        out.update({"rounds": rounds, "version": f"v{KERNEL}" if KERNEL else "automatic", "goals": {}})
        save()
        return out
    goals(rounds, out, save, dtype=torch.bfloat16, targets=GOALS16)
    b, i, o = SMALL_BATCH
    size = 2  # bytes of a bfloat16
    w_bytes, other = o * i * size, (b * i + b * o + o) * size  # W; x, y and the bias
    copy = copy_bandwidth(rounds)
    sheet = _datasheet_bandwidth(torch.cuda.get_device_name() if DEVICE == "cuda" else "")
    small = out["goals"].get("forward, B=32")
    out["w_read"] = {"shape": list(SMALL_BATCH), "w_bytes": w_bytes, "other_bytes": other, "copy": copy,
                     "datasheet_bytes_per_s": sheet,
                     "bound_us": (w_bytes + other) / copy["bytes_per_s"] * 1e6,
                     "datasheet_bound_us": (w_bytes + other) / sheet * 1e6 if sheet else None,
                     "cuda_us": small["cuda_us"] if small else None}
    save()
    return out


def _datasheet_bandwidth(device: str) -> float | None:
    """The card's DRAM bandwidth from NVIDIA's datasheet (cuda/figures.py's BANDWIDTH), or None."""
    return cli.load_file("cuda/figures.py", "dense_cuda_figures").BANDWIDTH.get(device)


def ptx(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    stage = modes.stage("ptx")
    if not stage.GENERATED.exists():
        raise cli.UserError(f"{stage.GENERATED} is missing: run bash ptx/regen.sh first")
    sources = {"edited": stage.EDITED, "compiler": stage.GENERATED}
    dense = modes.dense("ptx")
    out = {} if out is None else out
    out.update({"rounds": rounds, "shapes": {}})
    for label, shape in (("4096", BIG), ("elementwise", WIDE)):
        tensors, g = benchmark._inputs(*shape, "cuda", torch.float32, 0)
        fns = {"forward": _forward(dense, tensors),
               "fwd+bwd": _both(dense, tensors, g)}
        samples: dict[str, list[float]] = {f"{s}/{k}": [] for s in sources for k in fns}
        for r in range(rounds):  # alternate the two modules round by round; loading is untimed
            for src in (("edited", "compiler") if r % 2 == 0 else ("compiler", "edited")):
                stage.load_ptx(sources[src])
                stats = benchmark.measure(fns, device="cuda", rounds=1, warmup=1)
                for k, s in stats.items():
                    samples[f"{src}/{k}"] += s.samples
        stage.load_ptx(stage.EDITED)
        rows = {}
        for k in fns:
            paired = benchmark.paired_ratio(samples[f"compiler/{k}"], samples[f"edited/{k}"])
            rows[k] = {"edited_us": benchmark.Stats(samples[f"edited/{k}"]).median,
                       "compiler_us": benchmark.Stats(samples[f"compiler/{k}"]).median,
                       "speedup": paired["ratio"], "ci": paired["ci"],
                       "verdict": ("no significant difference" if paired["ci"] is None or
                                   paired["ci"][0] <= 1.0 <= paired["ci"][1] else
                                   "edited faster" if paired["ci"][0] > 1.0 else "edited slower")}
        out["shapes"][label] = {"shape": list(shape), **rows}
        save()
    return out


PROFILE_SHAPE = (2048, 2048, 2048)


def profile_units(passed: dict | None = None) -> list[str]:
    """What profile launches, in order: with an isolated exact run's record (cuda/isolated.py
    exact: its units in the order they ran, never-run versions first), the versions and candidates
    it found SAME; without one, every version and candidate of the header, never-run ones first."""
    if passed is not None:
        return [u for u in passed["order"] if passed["units"].get(u, {}).get("status") == "SAME" and u != "v0"]
    order = cli.load_file("cuda/isolated.py", "dense_cuda_isolated").never_run_first()
    return [name for name, _ in order if name != "v0"]


def profile(passed: dict | None = None) -> dict:
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    (x, w, b), g = benchmark._inputs(*PROFILE_SHAPE, "cuda", torch.float32, 0)
    half = [t.bfloat16() for t in (x, w, b)]  # the tensor cores' versions that take no float32
    units = profile_units(passed)
    for unit in units:  # each forward once, in its type (float32 where built for it, else bfloat16)
        if unit.startswith("candidate"):
            _tune_forward(_library(), int(unit.split()[1]), [x, w, b])()
        else:
            v = int(unit[1:])
            _version(v, dense, [x, w, b] if v in _versions("f32") else half)()
    # v1 and v2 once more with the backward: its grad_x GEMM reads W in the "nn" layout, where
    # v2's neighbouring columns are neighbouring addresses (in the forward's "nt" they are not).
    for v in (1, 2):
        cuda.select_kernel(v)
        torch.autograd.grad(dense(x, w, b), (x,), g)
    cuda.select_kernel(0)
    # Each sigmoid-grad kernel once, with the bias gradient, on the forward's output: B × O.
    launch, sms = _grad_launcher(_library()), torch.cuda.get_device_properties(0).multi_processor_count
    rows, cols = PROFILE_SHAPE[0], PROFILE_SHAPE[2]
    y = torch.rand(rows, cols, device="cuda")
    dz, db, work = torch.empty_like(y), torch.empty(cols, device="cuda"), torch.empty(sms * cols, device="cuda")
    for v in range(1, catalog_grad_versions() + 1):
        rc = launch(v, DTYPE_CODES["f32"], False, g.data_ptr(), y.data_ptr(), dz.data_ptr(), db.data_ptr(), rows, cols,
                    sms, work.data_ptr(), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"sigmoid-grad v{v}: the launch failed with cudaError {rc}")
    torch.cuda.synchronize()
    return {"shape": list(PROFILE_SHAPE), "units": units, "grad_versions": catalog_grad_versions()}


# ---- the autotuning candidates: v11's template at the shapes of DENSE_TUNE_CANDIDATES ----
# They have no version number of their own in the stage's op; dense_kernels.cu exports their
# launcher (dense_tune_launch) from the stage's library, which this process has loaded.
def _tune_forward(lib, i: int, tensors: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
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


def candidates(rounds: int, seed: int = 100, out: dict | None = None, save: Save = _nothing) -> dict:
    """Check every candidate against float64, then time those that pass (see the module's doc)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [c.shape for c in catalog.candidates()]  # (BM, BN, BK, WM, WN, TM, TN, MINB)
    lib = _library()
    if lib.dense_tune_count() != len(shapes):
        raise cli.UserError(f"the built library has {lib.dense_tune_count()} candidates, cuda/dense_kernels.h "
                            f"lists {len(shapes)}: rebuild the cuda stage")
    out = {} if out is None else out
    out.update({"rounds": rounds, "tf32": False, "candidates": [list(s) for s in shapes], "checked": [],
                "timed": [], "shapes": {}})
    for i in range(len(shapes)):
        row: dict = {"candidate": i, "shape": list(shapes[i]), "rel_errors": {}}
        try:
            for shape in (*CHECK_SHAPES, SMALL_BATCH):
                seed += 1
                tensors, _ = benchmark._inputs(*shape, "cuda", torch.float32, seed)
                with torch.no_grad():
                    row["rel_errors"]["×".join(map(str, shape))] = _rel(
                        _tune_forward(lib, i, tensors)(), benchmark.reference(*(t.double() for t in tensors)))
            row["ok"] = all(e < TOLERANCE for e in row["rel_errors"].values())
            said = ", ".join(f"{k} {e:.1e}" for k, e in row["rel_errors"].items())
        except RuntimeError as e:  # a launch that fails: this candidate fails, the next one runs
            row.update({"ok": False, "error": _first_line(e)})
            said = row["error"]
        out["checked"].append(row)
        print(f"{'PASS' if row['ok'] else 'FAIL'}  candidate {i} {shapes[i]}: {said}", flush=True)
        if row["ok"]:
            out["timed"].append(i)
        save()
    dense, cuda = modes.dense("cuda"), modes.stage("cuda")
    for shape in (BIG, SMALL_BATCH):
        tensors, _ = benchmark._inputs(*shape, "cuda", torch.float32, 0)
        fns = {"reference": _forward(benchmark.reference, tensors), "version 0": _version(0, dense, tensors)}
        for v in _chapter_versions():
            fns[f"v{v}"] = _version(v, dense, tensors)
        for i in out["timed"]:
            fns[f"candidate {i}"] = _tune_forward(lib, i, tensors)
        fns, failed = runnable(fns)
        cuda.select_kernel(0)
        stats = benchmark.measure(fns, device="cuda", rounds=rounds)
        cuda.select_kernel(0)
        flops = 2 * shape[0] * shape[1] * shape[2]
        out["shapes"]["×".join(map(str, shape))] = {"shape": list(shape), "failed": failed, "rows": [
            {"line": name, "forward_us": st.median, "spread_us": st.spread, "gflops": flops / st.median / 1e3,
             "of_reference": _ratio(stats, name, "reference"), "of_version_0": _ratio(stats, name, "version 0")}
            for name, st in stats.items()]}
        save()
    return out


def candidates_table(record: dict) -> str:
    c = record["candidates"]
    rows = ["| shape B, I, O | line | tile BM×BN×BK, warp WM×WN (piece), min blocks | µs (IQR) | GFLOP/s | "
            "speed / reference (95% CI) | speed / version 0 (95% CI) |", "|---|---|---|---:|---:|---:|---:|"]
    for entry in c["shapes"].values():
        for r in entry["rows"]:
            shape = ""
            if r["line"].startswith("candidate "):
                bm, bn, bk, wm, wn, tm, tn, minb = c["candidates"][int(r["line"].split()[1])]
                shape = f"{bm}×{bn}×{bk}, {wm}×{wn} ({tm}×{tn}), {minb}"
            rows.append(f"| {', '.join(map(str, entry['shape']))} | {r['line']} | {shape} | {r['forward_us']:.0f} "
                        f"({r['spread_us']:.0f}) | {r['gflops']:.0f} | {r['of_reference']['speed']:.3f} "
                        f"({_ci(r['of_reference']['ci'])}) | {r['of_version_0']['speed']:.3f} "
                        f"({_ci(r['of_version_0']['ci'])}) |")
    failed = [x["candidate"] for x in c["checked"] if not x["ok"]]
    note = f"Not timed (failed the float64 check): {', '.join(map(str, failed))}. " if failed else ""
    return ("\n".join(rows) + f"\n\nForward, float32, {c['rounds']} rounds; every candidate checked against "
            f"float64 first. {note}" + _footer(record).strip())


def _ci(ci: list[float] | None) -> str:
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "–"


def _pct(ci: list[float] | None) -> str:
    return f"{100 * ci[0]:.1f}–{100 * ci[1]:.1f}%" if ci else "–"


def _footer(record: dict) -> str:
    return "\n" + benchmark.footer(record, "TF32 off", card=True, sep="; ")


def gemm_table(record: dict) -> str:
    """SGEMM_CUDA's table: each version's forward, GFLOP/s and share of cuBLAS."""
    g = record["gemm"]
    b, i, o = g["shape"]
    return (_gemm_rows(g) + f"\n\nForward only, B={b} I={i} O={o}, {g['rounds']} rounds.{_not_timed(g)}"
            + _footer(record))


def _gemm_rows(g: dict) -> str:
    rows = ["| line | µs (IQR) | GFLOP/s | speed / cuBLAS x·Wᵀ (95% CI) | speed / reference |",
            "|---|---:|---:|---:|---:|"]
    for r in g["rows"]:
        rows.append(f"| {r['line']} | {r['forward_us']:.0f} ({r['spread_us']:.0f}) | {r['gflops']:.0f} | "
                    f"{100 * r['of_cublas']['speed']:.1f}% ({_pct(r['of_cublas']['ci'])}) | "
                    f"{100 * r['of_reference']['speed']:.1f}% |")
    return "\n".join(rows)


def _not_timed(part: dict) -> str:
    failed = part.get("failed") or {}
    return "".join(f" Not timed: {line} ({why})." for line, why in failed.items())


def small_table(record: dict) -> str:
    """gemm_table's columns at B = 32."""
    return gemm_table({**record, "gemm": record["small"]})


def grad_table(record: dict) -> str:
    """The backward's elementwise kernels against torch's, per number of rows."""
    g = record["grad"]
    rows = ["| rows × columns | line | µs (IQR) | GB/s (g, y read; dz written) | speed / torch (95% CI) |",
            "|---|---|---:|---:|---:|"]
    for entry in g["shapes"].values():
        for r in entry["lines"]:
            rows.append(f"| {entry['rows']} × {g['cols']} | {r['line']} | {r['us']:.1f} ({r['spread_us']:.1f}) | "
                        f"{r['gb_per_s']:.0f} | {r['of_torch']['speed']:.3f} ({_ci(r['of_torch']['ci'])}) |")
    failed = "".join(_not_timed(e) for e in g["shapes"].values())
    return ("\n".join(rows) + f"\n\ndz = g·y·(1 − y) and the bias gradient Σ_rows dz, float32, {g['rounds']} rounds; "
            f"each kernel checked against float64 first.{failed}" + _footer(record))


def bf16_table(record: dict) -> str:
    """The bfloat16 versions beside cuBLAS's bfloat16 x·Wᵀ and the reference in bfloat16."""
    b = record["bf16"]
    out = []
    for entry in b["shapes"].values():
        bb, i, o = entry["shape"]
        out.append(_gemm_rows(entry) + f"\n\nbfloat16, forward only, B={bb} I={i} O={o}, {entry['rounds']} rounds."
                   + _not_timed(entry))
    bad = [f"{v} ({c['error'] if 'error' in c else format(c['rel_error'], '.1e')})"
           for v, c in b["checked"].items() if not c["ok"]]
    return "\n\n".join(out) + (f"\n\nNot timed (failed the float64 check, tolerance {b['tolerance']}): "
                               f"{', '.join(bad)}." if bad else "") + _footer(record)


def goals_table(record: dict) -> str:
    rows = ["| goal | shape B, I, O | cuda µs | reference µs | speed / reference (95% CI) | goal | verdict |",
            "|---|---|---:|---:|---:|---:|---|"]
    for name, r in record["goals"]["goals"].items():
        verdict = "met" if r["met"] else "missed" if r["missed"] else "not settled"
        rows.append(f"| {name} | {', '.join(map(str, r['shape']))} | {r['cuda_us']:.0f} | {r['reference_us']:.0f} | "
                    f"{r['speed']:.3f} ({_ci(r['ci'])}) | ≥ {r['goal']} | {verdict} |")
    tail = "same card and command as the GEMM table" if "gemm" in record else _footer(record).strip()
    return "\n".join(rows) + f"\n\nThe automatic version, {record['goals']['rounds']} rounds; {tail}."


def roof_table(record: dict) -> str:
    """The roofs beside cuBLAS and the tensor-core versions: TFLOP/s, the share of each one's own
    instruction's roof, the speed against cuBLAS's bfloat16 x·Wᵀ; the goal; how each roof ran."""
    r = record["roof"]
    rows = ["| line | instruction | µs (IQR) | TFLOP/s (IQR) | share of its instruction's roof (95% CI) | "
            "speed / cuBLAS bf16 x·Wᵀ (95% CI) |", "|---|---|---:|---:|---:|---:|"]
    for row in r["rows"]:
        share = row.get("of_roof")
        cublas = row.get("of_cublas")
        lo, hi = row["tflops_iqr"]
        rows.append(f"| {row['line']} | {row['instruction'] or '–'} | {row['us']:.0f} ({row['spread_us']:.0f}) | "
                    f"{row['tflops']:.0f} ({lo:.0f}–{hi:.0f}) | "
                    + (f"{share['share']:.3f} ({_ci(share['ci'])}) | " if share else "– | ")
                    + (f"{cublas['speed']:.3f} ({_ci(cublas['ci'])}) |" if cublas else "– |"))
    ran = "; ".join(f"{name}: {x['blocks']} blocks of {x['threads']} threads ({x['blocks_per_sm']} an SM), "
                    f"{x['iterations']} iterations, every thread's sum {'exact' if x['checked'] else 'WRONG'}"
                    for name, x in r["roofs"].items())
    goals = " ".join(f"Goal: {line} ≥ {g['goal']} of the {g['roof']} roof: {g['verdict']}"
                     + (f" ({g['share']:.3f}, {_ci(g['ci'])})." if "share" in g else ".")
                     for line, g in r["goals"].items())
    bad = [f"{v} ({c['error'] if 'error' in c else format(c['rel_error'], '.1e')})"
           for v, c in r["checked"].items() if not c["ok"]]
    failed = {k: why for k, why in r["failed"].items() if k not in r["checked"]}
    b, i, o = r["shape"]
    return ("\n".join(rows) + f"\n\nbfloat16, forward only, B={b} I={i} O={o}, {r['rounds']} rounds; a share is "
            "the line's FLOP rate over its roof's in the same round. The cuBLAS line's instruction on Hopper is "
            f"wgmma. Roofs: {ran or 'none ran'}. {goals}"
            + (f" Not timed (failed the float64 check, tolerance {r['tolerance']}): {', '.join(bad)}." if bad else "")
            + "".join(f" Not timed: {line} ({why})." for line, why in failed.items()) + _footer(record))


def tf32_table(record: dict) -> str:
    """The float32 tensor-core versions: speed at 4096³, then their errors against float64 beside
    cuBLAS's, as a multiple of cuBLAS float32's; the goals."""
    t = record["tf32"]
    timing = t["timing"]
    b, i, o = timing["shape"]
    parts = [_gemm_rows(timing) + f"\n\nfloat32, forward only, B={b} I={i} O={o}, {timing['rounds']} rounds, "
             f"TF32 off for cuBLAS and the reference.{_not_timed(timing)}"]
    rows = ["| B = I = O | line | largest error | ‖error‖ / ‖truth‖ | largest error / cuBLAS float32's |",
            "|---:|---|---:|---:|---:|"]
    for entry in t["errors"].values():
        for name, e in entry["lines"].items():
            rows.append(f"| {entry['shape'][0]} | {name} | " + (
                f"failed: {e['error']} | – | – |" if "error" in e else
                f"{e['max_abs']:.2e} | {e['rel']:.2e} | {e['of_cublas_f32']:.2f} |"))
    parts.append("\n".join(rows) + "\n\nx·Wᵀ alone (no bias, no sigmoid), x ~ N(0, 1), W ~ N(0, 1/I), against "
                 "float64 arithmetic on the same float32 inputs; cuBLAS TF32 is torch's allow_tf32.")
    goals = ["| goal | value (95% CI) | target | verdict |", "|---|---:|---:|---|"]
    for g in t["goals"]:
        value = "–" if "value" not in g else f"{g['value']:.3f}" + (f" ({_ci(g['ci'])})" if g.get("ci") else "")
        goals.append(f"| {g['goal']} | {value} | {g['target']} | {g['verdict']} |")
    parts.append("\n".join(goals))
    return "\n\n".join(parts) + _footer(record)


def goals16_table(record: dict) -> str:
    """goals_table's rows in bfloat16, and at B = 32 the time to read W once beside the forward's."""
    g = record["goals16"]
    if not g["goals"]:
        bad = ", ".join(f"{shape}: {c.get('error', c.get('rel_error'))}" for shape, c in g["checked"].items())
        return f"Not timed: version 0 failed the bfloat16 check against float64 ({bad})." + _footer(record)
    rows = goals_table({**record, "goals": g}).split("\n\n")[0]
    text = rows + f"\n\nThe automatic version in bfloat16, {g['rounds']} rounds, checked against float64 first."
    w = g.get("w_read")
    if w:
        b, i, o = w["shape"]
        sheet = w["datasheet_bytes_per_s"]
        text += (f" At B = {b}, I = {i}, O = {o}: W is {w['w_bytes'] / 2**20:.0f} MiB in bfloat16 (x, y and b "
                 f"{w['other_bytes'] / 2**20:.2f} MiB more); reading them once at the bandwidth a device copy "
                 f"reaches here ({w['copy']['bytes_per_s'] / 1e12:.2f} TB/s, bytes read plus written, of "
                 f"{w['copy']['bytes'] // 2**30} GiB) takes {w['bound_us']:.1f} µs"
                 + (f", at the datasheet's {sheet / 1e12:.2f} TB/s {w['datasheet_bound_us']:.1f} µs" if sheet else
                    " (no datasheet bandwidth known for this card)")
                 + (f"; the forward takes {w['cuda_us']:.1f} µs, {w['cuda_us'] / w['bound_us']:.2f} times the "
                    "measured bound." if w["cuda_us"] else "."))
    return text + _footer(record)


def ptx_table(record: dict) -> str:
    rows = ["| shape B, I, O | timed | compiler's PTX µs | edited PTX µs | speed-up (95% CI) | verdict |",
            "|---|---|---:|---:|---:|---|"]
    for rows_ in record["ptx"]["shapes"].values():
        for k in ("forward", "fwd+bwd"):
            r = rows_[k]
            rows.append(f"| {', '.join(map(str, rows_['shape']))} | {k} | {r['compiler_us']:.0f} | "
                        f"{r['edited_us']:.0f} | {r['speedup']:.3f} ({_ci(r['ci'])}) | {r['verdict']} |")
    return "\n".join(rows) + f"\n\n{record['ptx']['rounds']} rounds, the two PTX files alternating." + _footer(record)


NCU_METRICS = {  # what each column of the profile table is, from ncu's metric names
    "gpu__time_duration.sum": "time",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "requests",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "bank conflicts (shared loads)",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "bank conflicts (shared stores)",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM throughput",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "FFMA",
    "launch__registers_per_thread": "registers",
    # shared memory's wavefronts and instructions, the caches' throughput, and cp.async (LDGSTS)
    # requests and sectors: what the emulator's counters (cuda/counters.py) are set beside
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "shared-load wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "shared-store wavefronts",
    "smsp__inst_executed_op_shared_ld.sum": "shared-load instructions",
    "smsp__inst_executed_op_shared_st.sum": "shared-store instructions",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "L1 throughput",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 throughput",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum": "cp.async requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": "cp.async sectors",
}


def from_ncu(csv_path: Path, device: str) -> dict:
    """The kernels and metrics of an `ncu --csv --metrics ...` run, as a record."""
    import csv

    kernels: dict[int, dict] = {}
    lines = [line for line in csv_path.read_text().splitlines() if line.startswith('"')]
    for row in csv.DictReader(lines):
        k = kernels.setdefault(int(row["ID"]), {"kernel": row["Kernel Name"], "block": row["Block Size"],
                                                "grid": row["Grid Size"], "metrics": {}})
        k["metrics"][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    if not kernels:
        raise cli.UserError(f"{csv_path}: no kernel rows (is it the CSV of `ncu --csv --metrics ...`?)")
    return {"device": device, "source": "ncu --csv", "kernels": [kernels[i] for i in sorted(kernels)]}


# every version's and candidate's GEMM of the forward (nt) and of grad_x (nn), float32 or (the
# tensor cores' 16-bit versions) bfloat16, and the backward's elementwise kernels
NCU_KERNELS = ("regex:dense_gemm_(v[0-9]+|tune[0-9]+)_n[tn]_(f32|bf16)|dense_sigmoid_grad_v[0-9]+_f32|"
               "dense_bias_grad_v[0-9]+_f32")


def ncu_record(args, json_path: Path | None) -> int:
    """--ncu: the profile part under ncu, its CSV made a record; --from-ncu: an earlier CSV."""
    import shutil
    import subprocess
    import tempfile

    device = args.ncu_device or (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    if device is None:
        raise cli.UserError("no GPU here: --ncu needs one; with --from-ncu, name the GPU that ran it (--ncu-device)")
    if args.ncu:
        ncu = shutil.which("ncu")
        if ncu is None:
            raise cli.UserError("ncu (Nsight Compute) is not on the PATH")
        # --clock-control none: the card's clocks as they are, as every other timing here.
        argv = [ncu, "--clock-control", "none", "-k", NCU_KERNELS, "--metrics", ",".join(NCU_METRICS), "--csv",
                sys.executable, str(Path(__file__).resolve()), "profile",
                *(["--passed", args.passed] if args.passed else [])]
        got = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if got.returncode != 0:
            raise cli.UserError(f"ncu failed (exit {got.returncode}): {got.stderr.strip()[-500:]}")
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(got.stdout)
        csv_path = Path(f.name)
    else:
        csv_path = Path(args.from_ncu)
        if not csv_path.is_file():
            raise cli.UserError(f"--from-ncu {csv_path}: no such file")
    record = {**from_ncu(csv_path, device), "shape": [2048, 2048, 2048], "kernels_profiled": NCU_KERNELS,
              **benchmark.provenance()}
    if torch.cuda.is_available():
        record["gpu"] = benchmark.describe_gpu()
    return cli.publish(ncu_table(record), [(json_path, cli.json_writer(record))])


def ncu_table(record: dict) -> str:
    rows = ["| kernel | µs | registers | achieved occupancy | sectors / request (global loads) | shared-memory bank "
            "conflicts (loads, stores) | DRAM throughput | SM throughput | FFMA / (B·I·O) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    b, i, o = record.get("shape", [2048, 2048, 2048])
    seen = set()
    for k in record["kernels"]:
        if k["kernel"] in seen:  # the profile launches v1's and v2's forward twice
            continue
        seen.add(k["kernel"])
        m = k["metrics"]
        requests = max(m["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"], 1)
        spr = m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / requests
        # B·I·O multiply-adds is a GEMM's work; the elementwise kernels do none of it
        ffma = (f"{m['smsp__sass_thread_inst_executed_op_ffma_pred_on.sum'] / (b * i * o):.2f}"
                if k["kernel"].startswith("dense_gemm_") else "–")
        rows.append(f"| {k['kernel']} | {m['gpu__time_duration.sum'] / 1e3:.0f} | "
                    f"{m['launch__registers_per_thread']:.0f} | "
                    f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}% | {spr:.1f} | "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum']:.2g}, "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum']:.2g} | "
                    f"{m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.1f}% | "
                    f"{m['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f}% | {ffma} |")
    return "\n".join(rows) + "\n\nNsight Compute on " + benchmark.footer(
        record, f"one call of each at B=I=O={b} (`python cuda/bench_gpu.py profile`)", sep="; ")


def exact_summary(record: dict) -> str:
    e = record["exact"]
    return "\n".join([f"exact: {e['status']}, {e['compared']} GEMMs compared with the emulation's bits"]
                     + [f"  DIFFERENT: {m}" for m in e["differences"] + e["missing"]]
                     + ([f"  FAULT: {e['fault']}"] if "fault" in e else []))


def table(record: dict) -> str:
    shown = {"exact": exact_summary, "gemm": gemm_table, "goals": goals_table, "small": small_table,
             "grad": grad_table, "bf16": bf16_table, "roof": roof_table, "tf32": tf32_table,
             "goals16": goals16_table, "ptx": ptx_table, "candidates": candidates_table}
    parts = [show(record) for part, show in shown.items() if part in record]
    if "check" in record:
        c = record["check"]
        parts.append(f"check: {len(c['rows']) - c['failed']} of {len(c['rows'])} passed "
                     f"(‖out − ref‖ / ‖ref‖ under {c['tolerance']})")
    return "\n\n".join(parts)


def _writer(json_path: Path | None, record: dict) -> Save:
    """save(): the record as it stands, written whole (a temporary file, then renamed), so that a
    run stopped at any point leaves the last complete record."""
    def save() -> None:
        if json_path is not None:
            tmp = json_path.with_name(json_path.name + ".tmp")
            cli.json_writer(record)(tmp)
            tmp.replace(json_path)
    return save


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of: {', '.join(PARTS)}")
    parser.add_argument("--ncu", action="store_true", help="instead: run the profile part under Nsight Compute "
                        "(ncu) and write its counters as a record (--json), for docs/render.py")
    parser.add_argument("--from-ncu", metavar="CSV", help="instead: turn the CSV of such an ncu run into a record")
    parser.add_argument("--ncu-device", help="with --from-ncu away from the GPU: the GPU's name, for the record")
    parser.add_argument("--rounds", type=cli.positive(int), default=15, help="rounds per timing (default 15)")
    parser.add_argument("--kernel", type=int, metavar="N", help="the timing parts time version N alone, by its "
                        "number (goals and goals16: N instead of version 0); 0: no version (roof: the roofs alone)")
    parser.add_argument("--passed", metavar="PATH", help="profile, --ncu: only what an isolated exact run's record "
                        "(python cuda/isolated.py exact) found SAME, never-run versions first")
    parser.add_argument("--odd-only", action="store_true",
                        help="check: the odd shapes only, not 4096³ (for compute-sanitizer, which slows kernels)")
    parser.add_argument("--json", metavar="PATH", help="write the record as JSON (the folder must exist); "
                        "written again after every measurement")
    args = parser.parse_args(argv)
    json_path = cli.check_output(args.json, "--json")
    if args.ncu or args.from_ncu:
        return ncu_record(args, json_path)
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"name PARTs among {', '.join(PARTS)}, or --from-ncu CSV")
    needs = {"ptx"} if args.parts == ["ptx"] else {"cuda", "ptx"} if "ptx" in args.parts else {"cuda"}
    for mode in sorted(needs):
        reason = modes.available()[mode]
        if reason is not None:
            raise cli.UserError(f"mode {mode!r} is not available here: {reason}")
    global KERNEL
    KERNEL = args.kernel
    if KERNEL is not None and KERNEL not in [0, *catalog.version_ids()]:  # 0: no version line, the roofs alone
        parser.error(f"--kernel {KERNEL}: no such version in {catalog.HEADER.name} (versions "
                     f"{', '.join(map(str, catalog.version_ids()))})")
    passed = cli.read_record(args.passed, "--passed", keys=("units", "order")) if args.passed else None
    record = benchmark.record_header("cuda", torch.float32)
    save = _writer(json_path, record)
    run = {"check": lambda out: check(args.odd_only, out=out, save=save),
           "exact": lambda out: exact(out=out, save=save),
           "gemm": lambda out: gemm(args.rounds, out, save), "goals": lambda out: goals(args.rounds, out, save),
           "small": lambda out: small(args.rounds, out, save), "grad": lambda out: grad(args.rounds, out, save),
           "bf16": lambda out: bf16(args.rounds, out, save), "roof": lambda out: roof(args.rounds, out, save),
           "tf32": lambda out: tf32(args.rounds, out, save), "goals16": lambda out: goals16(args.rounds, out, save),
           "ptx": lambda out: ptx(args.rounds, out, save),
           "profile": lambda out: out.update(profile(passed)),
           "candidates": lambda out: candidates(args.rounds, out=out, save=save)}
    for part in PARTS:
        if part in args.parts:
            print(f"{part}...", file=sys.stderr, flush=True)
            record[part] = {}
            run[part](record[part])
            save()
    code = cli.publish(table(record), [(json_path, cli.json_writer(record))])
    failed_candidates = any(not c["ok"] for c in record.get("candidates", {}).get("checked", []))
    wrong_roof = any(not r["checked"] for r in record.get("roof", {}).get("roofs", {}).values())
    failed = (record.get("check", {}).get("failed") or record.get("exact", {}).get("status", "SAME") != "SAME"
              or failed_candidates
              or wrong_roof)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    cli.run(main)
