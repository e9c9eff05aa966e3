"""cuda/bench_gpu.py's parts for the tensor cores' chapter: roof (mma.sync's and wgmma's roofs,
cuda/tensor_cores/roof.cuh, beside cuBLAS and each tensor-core version in bfloat16), tf32 (the
float32 versions on the tensor cores, TF32 and split-TF32: their error against float64 beside
cuBLAS's, then their speed) and goals16 (the stage's goals in bfloat16, with the time to read W
once). They run on CPU tensors in the emulation when cuda/gpu_timing.py's DEVICE is "cpu"
(tests/test_roof.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import benchmark
import cli
import modes
import record_info
import timing

gpu = cli.load_file("cuda/gpu_timing.py")
hand = cli.load_file("cuda/gpu_hand_kernels.py")  # goals16 is chapter 3's goals part in bfloat16

GOALS16 = {"forward": 1.0, "fwd+bwd": 0.90, "forward, B=32": 1.0}  # the Hopper versions' (bfloat16)

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
    return cli.load_file("cuda/static_report.py")


def roof_instruction(version: int) -> str | None:
    """The tensor-core instruction a version's main loop issues, from cuda/static_report.py's TILES
    ("mma" m16n8k16 or m16n8k8: mma.sync; m64nNk..: wgmma); None for the CUDA cores' versions."""
    mma = _static_report().TILES.get(version, {}).get("mma")
    return None if mma is None else "wgmma" if mma.startswith("m64") else "mma.sync"


def roof_versions(dtype: str = "bf16") -> list[int]:
    """The versions built for `dtype` that run on the tensor cores (v21-v24 and v31-v35 in bfloat16,
    v25, v26 and v34 in float32), as cuda/dense_kernels.h and TILES list them."""
    return [v for v in gpu.versions(dtype) if roof_instruction(v)]


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
        buf = torch.full((blocks * threads,), float("nan"), device=gpu.DEVICE)

        def run(n: int, kind: int = kind, blocks: int = blocks, buf: torch.Tensor = buf, name: str = name) -> None:
            rc = launch(kind, blocks, n, buf.data_ptr(), gpu.stream())
            if rc != 0:
                raise RuntimeError(f"the {name} roof's launch failed with cudaError {rc}")
        try:
            run(1)  # the first launch loads the module: not a cost of the loop
            gpu.synchronize()
            n = roof_iterations(lambda n, run=run: gpu.seconds(lambda: run(n)))
            buf.fill_(float("nan"))
            run(n)
            gpu.synchronize()
            wrong = check_roof(buf.cpu(), flops, threads, n)
        except RuntimeError as e:
            out["failed"][line] = gpu.first_line(e)
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


def share_of_roof(stats: dict, line: str, flops: int, roof_line: str, roof_flops: int) -> dict:
    """`line`'s FLOP rate as a share of the roof line's, round by round (paired): (its FLOPs / its
    time) / (the roof's FLOPs / the roof's time)."""
    paired = timing.paired_ratio(stats[roof_line].samples, stats[line].samples)
    scale = flops / roof_flops
    return {"roof": roof_line.removeprefix("roof: "), "share": paired["ratio"] * scale,
            "ci": [c * scale for c in paired["ci"]] if paired["ci"] else None}


def roof(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing, seed: int = 70) -> dict:
    """The roofs, cuBLAS's bfloat16 x·Wᵀ and each tensor-core version's bfloat16 forward at 4096³,
    timed side by side (see the module's doc)."""
    out = {} if out is None else out
    out.update({"rounds": rounds, "shape": list(gpu.BIG), "dtype": "bfloat16", "roofs": {}, "failed": {}})
    lines = _roof_lines(gpu.library(), gpu.sm_count(), out)
    versions = gpu.only(roof_versions("bf16"))
    out["checked"] = gpu.check_bf16(versions, seed)
    out["tolerance"] = gpu.BF16_TOLERANCE
    save()
    flops = 2 * gpu.BIG[0] * gpu.BIG[1] * gpu.BIG[2]
    (x, w, b), _ = benchmark.inputs(*gpu.BIG, gpu.DEVICE, torch.bfloat16, 0)
    dense = modes.dense("cuda")
    fns = {line: call for line, (call, _) in lines.items()}
    fns["cuBLAS bf16 x·Wᵀ"] = gpu.forward_call(lambda x, w, b: torch.mm(x, w.t()), [x, w, b])
    for v in versions:
        if out["checked"][f"v{v}"]["ok"]:
            fns[f"v{v}"] = gpu.version_call(v, dense, [x, w, b])
        else:
            out["failed"][f"v{v}"] = "failed the float64 check"
    fns, failed = gpu.runnable(fns)
    out["failed"].update(failed)
    modes.stage("cuda").select_kernel(0)
    stats = timing.measure(fns, device=gpu.DEVICE, rounds=rounds)
    modes.stage("cuda").select_kernel(0)
    if gpu.DEVICE == "cuda":
        out["gpu_after"] = record_info.describe_gpu().get("nvidia_smi")  # the clocks just after the roofs ran
    work = {line: lines[line][1] if line in lines else flops for line in stats}
    instruction = {f"roof: {r}": r for r in ROOFS} | {f"v{v}": roof_instruction(v) for v in versions}
    instruction["cuBLAS bf16 x·Wᵀ"] = "wgmma"  # (on Hopper; its share of that roof says how close a library gets)
    out["rows"] = []
    for line, s in stats.items():
        row = {"line": line, "instruction": instruction.get(line), "us": s.median, "spread_us": s.spread,
               **_tflops(work[line], s)}
        roof_line = f"roof: {instruction.get(line)}"
        if roof_line in stats:
            row["of_roof"] = share_of_roof(stats, line, work[line], roof_line, work[roof_line])
        if not line.startswith("roof") and "cuBLAS bf16 x·Wᵀ" in stats:
            row["of_cublas"] = gpu.speed_ratio(stats, line, "cuBLAS bf16 x·Wᵀ")
        out["rows"].append(row)
    out["goals"] = {}
    for line, (roof_name, goal) in ROOF_GOALS.items():
        row = next((r for r in out["rows"] if r["line"] == line and "of_roof" in r), None)
        out["goals"][line] = {"roof": roof_name, "goal": goal,
                              **({"share": row["of_roof"]["share"], "ci": row["of_roof"]["ci"],
                                  "verdict": gpu.verdict(row["of_roof"]["ci"], goal)} if row else
                                 {"verdict": "not measured"})}
    save()
    return out


def tf32(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing, seed: int = 80) -> dict:
    """The tensor cores' float32 versions: error against float64 beside cuBLAS's, then speed."""
    out = {} if out is None else out
    versions = gpu.only(roof_versions("f32"))
    out.update({"rounds": rounds, "sizes": list(TF32_SIZES), "versions": versions, "tolerance": TF32_TOLERANCE,
                "errors": {}})
    out["errors"] = tf32_errors(versions, gpu.gpu_gemm(), seed, save=save, out=out["errors"])
    passed = [v for v in versions
              if all(e["lines"].get(f"v{v}", {}).get("rel", float("inf")) < TF32_TOLERANCE
                     for e in out["errors"].values())]
    out["timing"] = {}
    gpu.table_at(gpu.BIG, rounds, torch.float32, passed, out["timing"], save)
    out["timing"]["failed"].update({f"v{v}": "failed the float64 check" for v in versions if v not in passed})
    out["goals"] = tf32_goals(out)
    save()
    return out


def tf32_errors(versions: list[int], gemm: Callable, seed: int = 80, save: gpu.Save = gpu.nothing,
                out: dict | None = None, device: str | None = None, sizes: tuple[int, ...] | None = None) -> dict:
    """x·Wᵀ (no epilogue) at each of `sizes` against float64: cuBLAS float32 (TF32 off), cuBLAS
    TF32 (torch.backends.cuda.matmul.allow_tf32) and each version through gemm(version, "nt", x, w,
    m, n, k) -> C; per line the largest error, ‖error‖ / ‖truth‖ and the largest error as a
    multiple of cuBLAS float32's (the project's rule: a result is judged against the reference's
    own error on the same inputs). `device` and `sizes`: gpu.DEVICE and TF32_SIZES by default; on
    "cpu" (the tests) the library lines are torch's CPU GEMM, where allow_tf32 changes nothing."""
    out = {} if out is None else out
    device = device or gpu.DEVICE
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
                got[f"v{v}"] = gpu.first_line(e)
        lines = {}
        for name, c in got.items():
            if isinstance(c, str):
                lines[name] = {"error": c}
                continue
            diff = (c.double() - truth).abs()
            lines[name] = {"max_abs": float(diff.max()) if torch.isfinite(c).all() else float("inf"),
                           "rel": gpu.rel_error(c, truth)}
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
                          "verdict": gpu.verdict(r["of_reference"]["ci"], goal)}
                         if r else {"verdict": "not measured"})})
    for line, goal in TF32_ERROR_GOALS.items():
        ratios = [e["lines"].get(line, {}).get("of_cublas_f32") for e in part.get("errors", {}).values()]
        worst = None if not ratios or None in ratios else max(ratios)
        goals.append({"goal": f"{line} largest error / cuBLAS float32's (every size)", "target": f"≤ {goal}",
                      **({"value": worst, "ci": None, "verdict": "met" if worst <= goal else "missed"}
                         if worst is not None else {"verdict": "not measured"})})
    return goals


def copy_bandwidth(rounds: int, nbytes: int | None = None) -> dict:
    """Bytes read plus written per second by a device-to-device copy of `nbytes` (COPY_BYTES by
    default), timed as the kernels are (timing.measure)."""
    nbytes = nbytes or COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=gpu.DEVICE)
    dst = torch.empty_like(src)
    stats = timing.measure({"copy": lambda: dst.copy_(src)}, device=gpu.DEVICE, rounds=rounds)["copy"]
    return {"bytes": 2 * nbytes, "us": stats.median, "bytes_per_s": 2 * nbytes / stats.median * 1e6}


def goals16(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing, seed: int = 90) -> dict:
    """The bfloat16 goals (GOALS16), version 0 checked against float64 at both shapes first; at
    B = 32 the time to read W once beside it, at a copy's measured bandwidth and the datasheet's."""
    out = {} if out is None else out
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    cuda.select_kernel(gpu.KERNEL or 0)
    out["checked"] = {}
    for shape in (gpu.BIG, gpu.SMALL_BATCH):
        (x, w, b), _ = benchmark.inputs(*shape, gpu.DEVICE, torch.bfloat16, seed)
        try:
            with torch.no_grad():
                error = gpu.rel_error(dense(x, w, b), benchmark.reference(*(t.detach().double() for t in (x, w, b))))
            out["checked"]["×".join(map(str, shape))] = {"rel_error": error, "ok": error < gpu.BF16_TOLERANCE}
        except RuntimeError as e:
            out["checked"]["×".join(map(str, shape))] = {"error": gpu.first_line(e), "ok": False}
    out["tolerance"] = gpu.BF16_TOLERANCE
    if not all(c["ok"] for c in out["checked"].values()):
        print(f"FAIL  bfloat16 version {gpu.KERNEL or 0} against float64: {out['checked']} (not timed)", flush=True)
        out.update({"rounds": rounds, "version": f"v{gpu.KERNEL}" if gpu.KERNEL else "automatic", "goals": {}})
        save()
        return out
    hand.goals(rounds, out, save, dtype=torch.bfloat16, targets=GOALS16)
    b, i, o = gpu.SMALL_BATCH
    size = 2  # bytes of a bfloat16
    w_bytes, other = o * i * size, (b * i + b * o + o) * size  # W; x, y and the bias
    copy = copy_bandwidth(rounds)
    sheet = _datasheet_bandwidth(torch.cuda.get_device_name() if gpu.DEVICE == "cuda" else "")
    small = out["goals"].get("forward, B=32")
    out["w_read"] = {"shape": list(gpu.SMALL_BATCH), "w_bytes": w_bytes, "other_bytes": other, "copy": copy,
                     "datasheet_bytes_per_s": sheet,
                     "bound_us": (w_bytes + other) / copy["bytes_per_s"] * 1e6,
                     "datasheet_bound_us": (w_bytes + other) / sheet * 1e6 if sheet else None,
                     "cuda_us": small["cuda_us"] if small else None}
    save()
    return out


def _datasheet_bandwidth(device: str) -> float | None:
    """The card's DRAM bandwidth from NVIDIA's datasheet (cuda/figures.py's BANDWIDTH), or None."""
    return cli.load_file("cuda/figures.py").BANDWIDTH.get(device)
