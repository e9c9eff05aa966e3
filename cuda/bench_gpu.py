"""Check and time chapter 4's GEMM versions and chapter 5's PTX edits on a GPU, in one process.

Parts (any of them, in this order; each adds one key to the record, written again after every
measurement, so that a run stopped half-way keeps what it measured):
  check    chapter 4's GEMM versions (1 to kVersions of cuda/dense_kernels.h, float32 on the CUDA
           cores), forward and backward, against a float64 reference on fresh random inputs at
           odd shapes and at 4096³: ‖out − ref‖ / ‖ref‖ per output, NaN never passes
  exact    every GEMM entry (each version and autotuning candidate of cuda/dense_kernels.h, each
           element type it lists, layouts nt, nn and tn, odd shapes, no epilogue) on the GPU
           against the CPU emulation of the same kernels (cuda/emulated.py), bit for bit, on small
           integers, where every product and sum is exact: any difference is a bug in one of them
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

PARTS = ("check", "exact", "gemm", "goals", "small", "grad", "bf16", "ptx", "profile", "candidates")
BIG = (4096, 4096, 4096)
SMALL_BATCH = (32, 4096, 4096)
WIDE = (65536, 64, 4096)
CHECK_SHAPES = ((33, 65, 17), (257, 1031, 129), BIG)
TOLERANCE = 1e-4  # float32 against float64: far under 1e-3 (TF32 would be near 3e-4)
BF16_TOLERANCE = 1e-2  # bfloat16 rounds each output once at the store: 2^-9 ≈ 2e-3 relative
GOALS = {"forward": 0.90, "fwd+bwd": 0.75, "forward, B=32": 1.0}
GRAD_ROWS = (32, 4096, 65536)  # the backward's elementwise kernels: rows of 4096 columns
EXACT_SHAPES = ((33, 17, 65), (1, 129, 31), (67, 45, 257))  # M, N, K: odd, a single row, K longer than a tile
DTYPE_CODES = {name: code for code, name in enumerate(catalog.DTYPES)}  # dense_kernels::DType
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
CODE_OF = {TORCH_DTYPES[name]: code for name, code in DTYPE_CODES.items()}


def _versions(dtype: str = "f32") -> list[int]:
    """The GEMM versions (0, the automatic choice, apart) built for `dtype`, as
    cuda/dense_kernels.h lists them (read anew on each call): a version added there is compared
    and timed here with no list to edit."""
    return catalog.version_ids(dtype=dtype)


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


# ---- the exact comparison: the GPU's entries against the CPU emulation's, bit for bit ----
def _library():
    """The cuda stage's loaded library (the same copy, context and streams as the stage), with
    its exported C entry points typed: dense_tune_*, dense_gemm_launch, dense_gemm_workspace."""
    import ctypes

    modes.stage("cuda")  # builds or finds the extension and loads it into this process
    maps = Path("/proc/self/maps")
    found = sorted({line.split()[-1] for line in maps.read_text().splitlines()
                    if "dense_cuda_ext" in line and line.rstrip().endswith(".so")}) if maps.exists() else []
    if not found:
        raise cli.UserError("the cuda stage's library is not among this process's mapped files "
                            "(/proc/self/maps, Linux only)")
    lib = ctypes.CDLL(found[0])
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.dense_tune_count.argtypes, lib.dense_tune_count.restype = [], i32
    lib.dense_tune_launch.argtypes = [i32, ctypes.c_char_p, p, p, p, p, i64, i64, i64, i32, p]
    lib.dense_tune_launch.restype = i32
    lib.dense_gemm_launch.argtypes = [i32, ctypes.c_char_p, i32, p, p, p, p, i64, i64, i64, i32, i32, p, p]
    lib.dense_gemm_launch.restype = i32
    lib.dense_gemm_workspace.argtypes, lib.dense_gemm_workspace.restype = [i32, i32, i64, i64, i64, i32], i64
    return lib


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


def _operands(layout: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of A and B for C[m×n] = op(A)·op(B) in layout nt, nn or tn (cuda/dense_kernels.h)."""
    return {"nt": ((m, k), (n, k)), "nn": ((m, k), (k, n)), "tn": ((k, m), (k, n))}[layout]


def exact_entries() -> list[tuple[str, int, str]]:
    """(label, version as launch_gemm takes it, element type) for every GEMM entry the header
    lists: each version (0, the automatic choice, included) in each of its types, and each
    autotuning candidate (float32 only)."""
    entries = [(f"v{v.id}", v.id, t) for v in catalog.versions() for t in v.dtypes]
    entries += [(f"candidate {c.index}", c.version, "f32") for c in catalog.candidates()]
    return entries


def integer_operands(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """Small integers, -2 to 2: every product and every partial sum of up to 2^20 of them is an
    integer float32 holds exactly, so any order of summation gives the same bits (bfloat16 and
    float16 hold the inputs exactly; their one rounding is at the store, to nearest even on both)."""
    return torch.randint(-2, 3, shape, generator=gen).float()


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None if the two are the same bits, else where they first differ and the two values."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype} {tuple(got.shape)} against the emulation's {want.dtype} {tuple(want.shape)}"
    a, b = got.contiguous().view(-1), want.contiguous().view(-1)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = a.view(bits) == b.view(bits)
    if bool(same.all()):
        return None
    i = int((~same).nonzero()[0])
    n = got.shape[1]
    return f"first at [{i // n}, {i % n}]: {float(a[i])!r} against the emulation's {float(b[i])!r}"


def exact(gpu_gemm: Callable | None = None, emu_gemm: Callable | None = None, seed: int = 7,
          out: dict | None = None, save: Save = _nothing) -> dict:
    """Every entry of exact_entries(), layouts nt, nn and tn, EXACT_SHAPES, epilogue kPlain: the
    GPU's result against the CPU emulation's, bit for bit. gpu_gemm / emu_gemm(version, layout,
    a, b, m, n, k) -> C (or raise): the launchers, the GPU's and the emulation's by default."""
    gpu_gemm = gpu_gemm or _gpu_gemm()
    emu_gemm = emu_gemm or _emu_gemm()
    out = {} if out is None else out
    out.update({"shapes": [list(s) for s in EXACT_SHAPES], "compared": 0, "mismatches": []})
    gen = torch.Generator().manual_seed(seed)
    for label, version, dtype in exact_entries():
        bad = []
        for layout in ("nt", "nn", "tn"):
            for m, n, k in EXACT_SHAPES:
                sa, sb = _operands(layout, m, n, k)
                a = integer_operands(sa, gen).to(TORCH_DTYPES[dtype])
                b = integer_operands(sb, gen).to(TORCH_DTYPES[dtype])
                where = f"{label} {dtype} {layout} M={m} N={n} K={k}"
                try:
                    want = emu_gemm(version, layout, a, b, m, n, k)
                    got = gpu_gemm(version, layout, a, b, m, n, k)
                    diff = first_difference(got, want)
                except (RuntimeError, ValueError) as e:
                    diff = f"failed: {_first_line(e)}"
                out["compared"] += 1
                if diff:
                    bad.append(f"{where}: {diff}")
        out["mismatches"] += bad
        said = "; ".join(bad[:2]) + (f" (and {len(bad) - 2} more)" if len(bad) > 2 else "")
        print(f"{'FAIL' if bad else 'SAME'}  {label} {dtype}: {said or 'every layout and shape, bit for bit'}",
              flush=True)
        save()
    out["failed"] = len(out["mismatches"])
    return out


def _gpu_gemm() -> Callable:
    """C = op(A)·op(B) by the cuda stage's entry (dense_gemm_launch), on the GPU, then to the CPU."""
    lib = _library()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def run(version: int, layout: str, a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> torch.Tensor:
        code = CODE_OF[a.dtype]
        a, b = a.cuda(), b.cuda()
        c = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")  # any element not written shows
        size = lib.dense_gemm_workspace(version, code, m, n, k, sms)
        work = torch.empty(max(size, 0), dtype=torch.float64 if a.dtype == torch.float64 else torch.float32,
                           device="cuda")
        rc = lib.dense_gemm_launch(version, layout.encode(), code, a.data_ptr(), b.data_ptr(), c.data_ptr(), None,
                                   m, n, k, 0, sms, work.data_ptr() if size > 0 else None,
                                   torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"the launch failed with cudaError {rc}")
        torch.cuda.synchronize()
        return c.cpu()
    return run


def _emu_gemm() -> Callable:
    """The same through the CPU emulation (cuda/emulated.py's library, built here by c++), with
    the GPU's SM count, so that version 0 and split-K choose as they do on the GPU."""
    emulated = cli.load_file("cuda/emulated.py", "dense_cuda_emulated")
    lib = emulated.library()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else emulated.SM_COUNT

    def run(version: int, layout: str, a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> torch.Tensor:
        c = torch.full((m, n), float("nan"), dtype=a.dtype)
        emulated.gemm(version, layout, a.contiguous(), b.contiguous(), c, None, m, n, k, emulated.KPLAIN, sms, lib)
        return c
    return run


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
    (x, w, b), _ = benchmark._inputs(*shape, "cuda", dtype, 0)
    fns = {"cuBLAS x·Wᵀ": _forward(lambda x, w, b: torch.mm(x, w.t()), [x, w, b]),
           "reference": _forward(benchmark.reference, [x, w, b])}
    dense = modes.dense("cuda")
    for v in versions:
        fns[f"v{v}"] = _version(v, dense, [x, w, b])
    fns, failed = runnable(fns)
    modes.stage("cuda").select_kernel(0)
    out.update({"shape": list(shape), "rounds": rounds, "tf32": False, "failed": failed})
    stats = benchmark.measure(fns, device="cuda", rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    out["rows"] = _rows(stats, shape, ("cuBLAS x·Wᵀ", "reference"))
    save()
    return out


def gemm(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": catalog.idea(v) for v in _chapter_versions()}
    return _table_at(BIG, rounds, torch.float32, _chapter_versions(), out, save)


def small(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    """gemm's table at B = 32: every version built for float32 (each can run there; the tensor
    cores' among them, which exact compares with the emulation), cuBLAS and the reference."""
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": catalog.idea(v) for v in [0, *_versions()]}
    return _table_at(SMALL_BATCH, rounds, torch.float32, [0, *_versions()], out, save)


def goals(rounds: int, out: dict | None = None, save: Save = _nothing) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    modes.stage("cuda").select_kernel(0)
    dense = modes.dense("cuda")
    out = {} if out is None else out
    out.update({"rounds": rounds, "version": "automatic", "goals": {}})
    for shape in (BIG, SMALL_BATCH):
        tensors, g = benchmark._inputs(*shape, "cuda", torch.float32, 0)
        fns = {"reference/forward": _forward(benchmark.reference, tensors),
               "cuda/forward": _forward(dense, tensors)}
        if shape == BIG:
            fns["reference/fwd+bwd"] = _both(benchmark.reference, tensors, g)
            fns["cuda/fwd+bwd"] = _both(dense, tensors, g)
        stats = benchmark.measure(fns, device="cuda", rounds=rounds)
        for what in ("forward", "fwd+bwd"):
            if f"cuda/{what}" not in stats:
                continue
            name = what if shape == BIG else f"{what}, B={shape[0]}"
            r = _ratio(stats, f"cuda/{what}", f"reference/{what}")
            lo = r["ci"][0] if r["ci"] else None
            out["goals"][name] = {"shape": list(shape), "cuda_us": stats[f"cuda/{what}"].median,
                                  "reference_us": stats[f"reference/{what}"].median, **r, "goal": GOALS[name],
                                  "met": lo is not None and lo >= GOALS[name],
                                  "missed": r["ci"] is not None and r["ci"][1] < GOALS[name]}
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
    versions = [0, *_versions("bf16")]
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    out["checked"] = {}
    for v in versions:
        (x, w, b), _ = benchmark._inputs(*CHECK_SHAPES[1], "cuda", torch.bfloat16, seed + v)
        try:
            cuda.select_kernel(v)
            with torch.no_grad():
                error = _rel(dense(x, w, b), benchmark.reference(*(t.detach().double() for t in (x, w, b))))
            out["checked"][f"v{v}"] = {"rel_error": error, "ok": error < BF16_TOLERANCE}
        except RuntimeError as e:
            out["checked"][f"v{v}"] = {"error": _first_line(e), "ok": False}
        print(f"{'PASS' if out['checked'][f'v{v}']['ok'] else 'FAIL'}  bfloat16 v{v}: {out['checked'][f'v{v}']}",
              flush=True)
    cuda.select_kernel(0)
    passed = [v for v in versions if out["checked"][f"v{v}"]["ok"]]
    out["tolerance"], out["shapes"] = BF16_TOLERANCE, {}
    save()
    for shape in (BIG, SMALL_BATCH):
        _table_at(shape, rounds, torch.bfloat16, passed, out["shapes"].setdefault("×".join(map(str, shape)), {}), save)
    return out


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


def profile() -> dict:
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    (x, w, b), g = benchmark._inputs(*PROFILE_SHAPE, "cuda", torch.float32, 0)
    for v in _chapter_versions():
        _version(v, dense, [x, w, b])()
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
    return {"shape": list(PROFILE_SHAPE), "versions": _chapter_versions(), "grad_versions": catalog_grad_versions()}


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


# every version's GEMM of the forward (nt) and of grad_x (nn), and the backward's elementwise kernels
NCU_KERNELS = "regex:dense_gemm_v[0-9]+_n[tn]_f32|dense_sigmoid_grad_v[0-9]+_f32|dense_bias_grad_v[0-9]+_f32"


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
                sys.executable, str(Path(__file__).resolve()), "profile"]
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
    lines = [f"exact: {e['compared'] - len(e['mismatches'])} of {e['compared']} GEMMs the same bits on the GPU as "
             f"in the CPU emulation (integers, M, N, K in {e['shapes']})"]
    return "\n".join(lines + [f"  DIFFERENT: {m}" for m in e["mismatches"]])


def table(record: dict) -> str:
    shown = {"exact": exact_summary, "gemm": gemm_table, "goals": goals_table, "small": small_table,
             "grad": grad_table, "bf16": bf16_table, "ptx": ptx_table, "candidates": candidates_table}
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
    record = benchmark.record_header("cuda", torch.float32)
    save = _writer(json_path, record)
    run = {"check": lambda out: check(args.odd_only, out=out, save=save),
           "exact": lambda out: exact(out=out, save=save),
           "gemm": lambda out: gemm(args.rounds, out, save), "goals": lambda out: goals(args.rounds, out, save),
           "small": lambda out: small(args.rounds, out, save), "grad": lambda out: grad(args.rounds, out, save),
           "bf16": lambda out: bf16(args.rounds, out, save), "ptx": lambda out: ptx(args.rounds, out, save),
           "profile": lambda out: out.update(profile()),
           "candidates": lambda out: candidates(args.rounds, out=out, save=save)}
    for part in PARTS:
        if part in args.parts:
            print(f"{part}...", file=sys.stderr, flush=True)
            record[part] = {}
            run[part](record[part])
            save()
    code = cli.publish(table(record), [(json_path, cli.json_writer(record))])
    failed_candidates = any(not c["ok"] for c in record.get("candidates", {}).get("checked", []))
    failed = record.get("check", {}).get("failed") or record.get("exact", {}).get("failed") or failed_candidates
    return code or (1 if failed else 0)


if __name__ == "__main__":
    cli.run(main)
