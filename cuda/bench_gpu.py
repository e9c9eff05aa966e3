"""Check and time chapter 4's GEMM versions and chapter 5's PTX edits on a GPU, in one process.

Parts (any of them, in this order; each adds one key to the record):
  check    every GEMM version, forward and backward, against a float64 reference on fresh random
           inputs at odd shapes and at 4096³: ‖out − ref‖ / ‖ref‖ per output, NaN never passes
  gemm     SGEMM_CUDA's table: each version's forward at B = I = O = 4096 (float32), GFLOP/s and
           its speed as a share of cuBLAS's x·Wᵀ (TF32 off) and of the reference
           sigmoid(x·Wᵀ + b) (cuBLAS GEMM with the bias, then the sigmoid's own kernel)
  goals    the stage's goals, each a ratio of speeds measured side by side: the automatic
           version's forward against the reference at 4096³ (goal ≥ 0.90), its forward + backward
           against the reference's (≥ 0.75), its forward at B = 32, I = O = 4096 (≥ 1.0)
  ptx      the ptx stage with the hand-edited PTX against the compiler's own (ptx/generated/,
           written by bash ptx/regen.sh), alternating round by round: at 4096³, where EDIT-A's
           sigmoid is in the GEMM's epilogue, and at B = 65536, I = 64, O = 4096, where the
           backward's elementwise kernel (EDIT-B's 128-bit accesses) is a large share of the time
  profile  each version's forward once at 2048³, then v1's and v2's forward + backward, and
           nothing else: what --ncu runs under Nsight Compute
  candidates  the autotuning candidates (cuda/dense_kernels.h kTuneCandidates), each checked
           against float64 first (one that fails is not timed), then every candidate's forward
           against the reference and against version 0 (what cuda/gemm_choice.h picks today), at
           4096³ and at B = 32, I = O = 4096, with v8 to v12 beside them: the timings that fill the table
Times come from benchmark.measure (CUDA events, L2 flushed before each call, variants
interleaved round by round); a ratio is the median of per-round ratios with its 95% interval.

Examples:
  python cuda/bench_gpu.py check                          # GPU: every version against float64
  python cuda/bench_gpu.py gemm goals --json /tmp/gpu.json
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

PARTS = ("check", "gemm", "goals", "ptx", "profile", "candidates")
BIG = (4096, 4096, 4096)
SMALL_BATCH = (32, 4096, 4096)
WIDE = (65536, 64, 4096)
CHECK_SHAPES = ((33, 65, 17), (257, 1031, 129), BIG)
TOLERANCE = 1e-4  # float32 against float64: far under 1e-3 (TF32 would be near 3e-4)
GOALS = {"forward": 0.90, "fwd+bwd": 0.75, "forward, B=32": 1.0}


def _versions() -> list[int]:
    """The GEMM versions to check and time, 1 to kVersions of cuda/dense_kernels.h (read anew on
    each call): a version added there is checked and timed here with no list to edit."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dense_cuda_emulated", ROOT / "cuda" / "emulated.py")
    emulated = sys.modules.get(spec.name)
    if emulated is None:  # loaded by file once, as grad_check.py does (cuda/ is no package)
        emulated = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(emulated)
    return [v for v in emulated.versions() if v > 0]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def check(odd_only: bool = False, seed: int = 1) -> dict:
    """Every version's forward and gradients against float64, fresh inputs per version and shape."""
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    rows, failed = [], 0
    for shape in CHECK_SHAPES[:-1] if odd_only else CHECK_SHAPES:
        for v in _versions():
            cuda.select_kernel(v)
            seed += 1
            (x, w, b), g = benchmark._inputs(*shape, "cuda", torch.float32, seed)
            y = dense(x, w, b)
            grads = torch.autograd.grad(y, (x, w, b), g)
            ref_in = [t.detach().double().requires_grad_() for t in (x, w, b)]
            ref_y = benchmark.reference(*ref_in)
            ref_grads = torch.autograd.grad(ref_y, ref_in, g.double())
            errors = {name: _rel(o, r) for name, o, r in zip(("y", "grad_x", "grad_w", "grad_b"),
                                                               (y, *grads), (ref_y, *ref_grads))}
            ok = all(e < TOLERANCE for e in errors.values())
            failed += not ok
            rows.append({"version": v, "shape": list(shape), "rel_errors": errors, "ok": ok})
            print(f"{'PASS' if ok else 'FAIL'}  v{v} B={shape[0]} I={shape[1]} O={shape[2]}: "
                  + ", ".join(f"{k} {e:.1e}" for k, e in errors.items()), flush=True)
    cuda.select_kernel(0)
    return {"tolerance": TOLERANCE, "rows": rows, "failed": failed}


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


def gemm(rounds: int) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    (x, w, b), _ = benchmark._inputs(*BIG, "cuda", torch.float32, 0)
    fns = {"cuBLAS x·Wᵀ": _forward(lambda x, w, b: torch.mm(x, w.t()), [x, w, b]),
           "reference": _forward(benchmark.reference, [x, w, b])}
    dense = modes.dense("cuda")
    for v in _versions():
        fns[f"v{v}"] = _version(v, dense, [x, w, b])
    stats = benchmark.measure(fns, device="cuda", rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    flops = 2 * BIG[0] * BIG[1] * BIG[2]
    rows = []
    for name, s in stats.items():
        rows.append({"line": name, "forward_us": s.median, "spread_us": s.spread,
                     "gflops": flops / s.median / 1e3, "of_cublas": _ratio(stats, name, "cuBLAS x·Wᵀ"),
                     "of_reference": _ratio(stats, name, "reference")})
    return {"shape": list(BIG), "rounds": rounds, "tf32": False, "rows": rows,
            "ideas": {f"v{v}": modes.stage("cuda").KERNELS[v] for v in _versions()}}


def goals(rounds: int) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    modes.stage("cuda").select_kernel(0)
    dense = modes.dense("cuda")
    out = {}
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
            out[name] = {"shape": list(shape), "cuda_us": stats[f"cuda/{what}"].median,
                         "reference_us": stats[f"reference/{what}"].median, **r, "goal": GOALS[name],
                         "met": lo is not None and lo >= GOALS[name],
                         "missed": r["ci"] is not None and r["ci"][1] < GOALS[name]}
    return {"rounds": rounds, "version": "automatic", "goals": out}


def ptx(rounds: int) -> dict:
    stage = modes.stage("ptx")
    if not stage.GENERATED.exists():
        raise cli.UserError(f"{stage.GENERATED} is missing: run bash ptx/regen.sh first")
    sources = {"edited": stage.EDITED, "compiler": stage.GENERATED}
    dense = modes.dense("ptx")
    out = {}
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
        out[label] = {"shape": list(shape), **rows}
    return {"rounds": rounds, "shapes": out}


def profile() -> dict:
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    (x, w, b), g = benchmark._inputs(2048, 2048, 2048, "cuda", torch.float32, 0)
    for v in _versions():
        _version(v, dense, [x, w, b])()
    # v1 and v2 once more with the backward: its grad_x GEMM reads W in the "nn" layout, where
    # v2's neighbouring columns are neighbouring addresses (in the forward's "nt" they are not).
    for v in (1, 2):
        cuda.select_kernel(v)
        torch.autograd.grad(dense(x, w, b), (x,), g)
    torch.cuda.synchronize()
    cuda.select_kernel(0)
    return {"shape": [2048, 2048, 2048], "versions": _versions()}


# ---- the autotuning candidates: v11's template at the shapes of dense_kernels::kTuneCandidates ----
# They have no version number of their own in the stage's op; dense_kernels.cu exports their
# launcher (dense_tune_launch) from the stage's library, which this process has loaded.
CANDIDATE_VERSIONS = {BIG: (8, 10, 11), SMALL_BATCH: (8, 9, 12)}  # timed beside them, per shape


def _tune_library():
    """The cuda stage's loaded library, with dense_tune_count and dense_tune_launch typed."""
    import ctypes

    modes.stage("cuda")  # builds or finds the extension and loads it into this process
    maps = Path("/proc/self/maps")
    found = sorted({line.split()[-1] for line in maps.read_text().splitlines()
                    if "dense_cuda_ext" in line and line.rstrip().endswith(".so")}) if maps.exists() else []
    if not found:
        raise cli.UserError("candidates: the cuda stage's library is not among this process's mapped files "
                            "(/proc/self/maps, Linux only)")
    lib = ctypes.CDLL(found[0])  # the library already loaded: the same copy, context and streams
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.dense_tune_count.argtypes, lib.dense_tune_count.restype = [], ctypes.c_int
    lib.dense_tune_launch.argtypes = [ctypes.c_int, ctypes.c_char_p, p, p, p, p, i64, i64, i64, ctypes.c_int, p]
    lib.dense_tune_launch.restype = ctypes.c_int
    return lib


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


def candidates(rounds: int, seed: int = 100) -> dict:
    """Check every candidate against float64, then time those that pass (see the module's doc)."""
    import importlib.util

    torch.backends.cuda.matmul.allow_tf32 = False
    spec = importlib.util.spec_from_file_location("static_report", ROOT / "cuda" / "static_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    shapes = report.TUNE_CANDIDATES  # (BM, BN, BK, WM, WN, TM, TN, MINB), tested against the header
    lib = _tune_library()
    if lib.dense_tune_count() != len(shapes):
        raise cli.UserError(f"the built library has {lib.dense_tune_count()} candidates, cuda/static_report.py "
                            f"lists {len(shapes)}: rebuild the cuda stage")
    checked, passing = [], []
    for i in range(len(shapes)):
        errors = {}
        for shape in (*CHECK_SHAPES, SMALL_BATCH):
            seed += 1
            tensors, _ = benchmark._inputs(*shape, "cuda", torch.float32, seed)
            with torch.no_grad():
                errors["×".join(map(str, shape))] = _rel(_tune_forward(lib, i, tensors)(),
                                                        benchmark.reference(*(t.double() for t in tensors)))
        ok = all(e < TOLERANCE for e in errors.values())
        checked.append({"candidate": i, "shape": list(shapes[i]), "rel_errors": errors, "ok": ok})
        print(f"{'PASS' if ok else 'FAIL'}  candidate {i} {shapes[i]}: "
              + ", ".join(f"{k} {e:.1e}" for k, e in errors.items()), flush=True)
        if ok:
            passing.append(i)
    dense, cuda = modes.dense("cuda"), modes.stage("cuda")
    out = {}
    for shape in (BIG, SMALL_BATCH):
        tensors, _ = benchmark._inputs(*shape, "cuda", torch.float32, 0)
        fns = {"reference": _forward(benchmark.reference, tensors), "version 0": _version(0, dense, tensors)}
        for v in CANDIDATE_VERSIONS[shape]:
            fns[f"v{v}"] = _version(v, dense, tensors)
        for i in passing:
            fns[f"candidate {i}"] = _tune_forward(lib, i, tensors)
        stats = benchmark.measure(fns, device="cuda", rounds=rounds)
        cuda.select_kernel(0)
        flops = 2 * shape[0] * shape[1] * shape[2]
        out["×".join(map(str, shape))] = {"shape": list(shape), "rows": [
            {"line": name, "forward_us": st.median, "spread_us": st.spread, "gflops": flops / st.median / 1e3,
             "of_reference": _ratio(stats, name, "reference"), "of_version_0": _ratio(stats, name, "version 0")}
            for name, st in stats.items()]}
    return {"rounds": rounds, "tf32": False, "candidates": [list(s) for s in shapes], "checked": checked,
            "timed": passing, "shapes": out}


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
    rows = ["| line | µs (IQR) | GFLOP/s | speed / cuBLAS x·Wᵀ (95% CI) | speed / reference |",
            "|---|---:|---:|---:|---:|"]
    for r in g["rows"]:
        rows.append(f"| {r['line']} | {r['forward_us']:.0f} ({r['spread_us']:.0f}) | {r['gflops']:.0f} | "
                    f"{100 * r['of_cublas']['speed']:.1f}% ({_pct(r['of_cublas']['ci'])}) | "
                    f"{100 * r['of_reference']['speed']:.1f}% |")
    b, i, o = g["shape"]
    return "\n".join(rows) + f"\n\nForward only, B={b} I={i} O={o}, {g['rounds']} rounds." + _footer(record)


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


NCU_KERNELS = "regex:dense_gemm_v[0-9]+_n[tn]_f32"  # every version's GEMM of the forward (nt) and of grad_x (nn)


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
        ffma = m["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] / (b * i * o)
        rows.append(f"| {k['kernel']} | {m['gpu__time_duration.sum'] / 1e3:.0f} | "
                    f"{m['launch__registers_per_thread']:.0f} | "
                    f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}% | {spr:.1f} | "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum']:.2g}, "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum']:.2g} | "
                    f"{m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.1f}% | "
                    f"{m['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f}% | {ffma:.2f} |")
    return "\n".join(rows) + "\n\nNsight Compute on " + benchmark.footer(
        record, f"one call of each at B=I=O={b} (`python cuda/bench_gpu.py profile`)", sep="; ")


def table(record: dict) -> str:
    parts = []
    if "gemm" in record:
        parts.append(gemm_table(record))
    if "goals" in record:
        parts.append(goals_table(record))
    if "ptx" in record:
        parts.append(ptx_table(record))
    if "candidates" in record:
        parts.append(candidates_table(record))
    if "check" in record:
        c = record["check"]
        parts.append(f"check: {len(c['rows']) - c['failed']} of {len(c['rows'])} passed "
                     f"(‖out − ref‖ / ‖ref‖ under {c['tolerance']})")
    return "\n\n".join(parts)


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
    parser.add_argument("--json", metavar="PATH", help="write the record as JSON (the folder must exist)")
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
    for part in PARTS:
        if part in args.parts:
            print(f"{part}...", file=sys.stderr, flush=True)
            record[part] = {"check": lambda: check(args.odd_only), "gemm": lambda: gemm(args.rounds),
                            "goals": lambda: goals(args.rounds), "ptx": lambda: ptx(args.rounds),
                            "profile": profile, "candidates": lambda: candidates(args.rounds)}[part]()
    code = cli.publish(table(record), [(json_path, cli.json_writer(record))])
    failed_candidates = any(not c["ok"] for c in record.get("candidates", {}).get("checked", []))
    return code or (1 if record.get("check", {}).get("failed") or failed_candidates else 0)


if __name__ == "__main__":
    cli.run(main)
