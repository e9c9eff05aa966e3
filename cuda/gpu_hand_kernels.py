"""cuda/bench_gpu.py's parts for chapter 3's hand-written kernels on the CUDA cores and the PTX
stage: check (every version against float64), exact (against the CPU emulation's bits), gemm and
small (SGEMM_CUDA's table at 4096³ and at B = 32), goals (the stage's goals, side by side with
the reference), grad (the backward's elementwise kernels), bf16 (the versions built for
bfloat16), ptx (the hand-edited PTX against the compiler's) and candidates (the autotuning
candidates). Each fills the record's part it is given and saves it after every measurement; the
plumbing they share is cuda/gpu_timing.py's."""

from __future__ import annotations

from collections.abc import Callable

import torch

import benchmark
import cli
import modes
import timing

gpu = cli.load_file("cuda/gpu_timing.py")

WIDE = (65536, 64, 4096)
GOALS = {"forward": 0.90, "fwd+bwd": 0.75, "forward, B=32": 1.0}
GRAD_ROWS = (32, 4096, 65536)  # the backward's elementwise kernels: rows of 4096 columns

def check(odd_only: bool = False, seed: int = 1, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    """Every version's forward and gradients against float64, fresh inputs per version and shape.
    A version whose call fails is a failed row with the error; the others still run."""
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    out = {} if out is None else out
    out.update({"tolerance": gpu.TOLERANCE, "rows": [], "failed": 0})
    for shape in gpu.CHECK_SHAPES[:-1] if odd_only else gpu.CHECK_SHAPES:
        for v in gpu.chapter_versions():
            seed += 1
            row: dict = {"version": v, "shape": list(shape)}
            try:
                cuda.select_kernel(v)
                (x, w, b), g = benchmark.inputs(*shape, "cuda", torch.float32, seed)
                y = dense(x, w, b)
                grads = torch.autograd.grad(y, (x, w, b), g)
                ref_in = [t.detach().double().requires_grad_() for t in (x, w, b)]
                ref_y = benchmark.reference(*ref_in)
                ref_grads = torch.autograd.grad(ref_y, ref_in, g.double())
                row["rel_errors"] = {name: gpu.rel_error(o, r)
                                     for name, o, r in zip(("y", "grad_x", "grad_w", "grad_b"), (y, *grads),
                                                           (ref_y, *ref_grads))}
                row["ok"] = all(e < gpu.TOLERANCE for e in row["rel_errors"].values())
                said = ", ".join(f"{k} {e:.1e}" for k, e in row["rel_errors"].items())
            except RuntimeError as e:  # a launch that fails: this version fails, the next one runs
                row.update({"ok": False, "error": gpu.first_line(e)})
                said = row["error"]
            out["rows"].append(row)
            out["failed"] += not row["ok"]
            print(f"{'PASS' if row['ok'] else 'FAIL'}  v{v} B={shape[0]} I={shape[1]} O={shape[2]}: {said}", flush=True)
            save()
    cuda.select_kernel(0)
    return out


def exact(out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    """Every entry against the emulation's committed bits (cuda/exact_check.py), in this one
    process: a fault stops it. The lease runs it one version a process (cuda/isolated.py exact)."""
    out = {} if out is None else out
    expected = gpu.exact_check.read_expected()["expected"]  # its keys name the entries: no emulation needed here
    out.update(gpu.exact_check.compare(gpu.exact_check.from_keys(list(expected)), expected, gpu.gpu_gemm()))
    save()
    return out


def gemm(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": gpu.catalog.idea(v) for v in gpu.only(gpu.chapter_versions())}
    return gpu.table_at(gpu.BIG, rounds, torch.float32, gpu.only(gpu.chapter_versions()), out, save)


def small(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    """gemm's table at B = 32: every version built for float32 (each can run there; the tensor
    cores' among them, which exact compares with the emulation), cuBLAS and the reference."""
    out = {} if out is None else out
    out["ideas"] = {f"v{v}": gpu.catalog.idea(v) for v in gpu.only([0, *gpu.versions()])}
    return gpu.table_at(gpu.SMALL_BATCH, rounds, torch.float32, gpu.only([0, *gpu.versions()]), out, save)


def goals(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing, dtype: torch.dtype = torch.float32,
          targets: dict[str, float] | None = None) -> dict:
    """Version 0 against the reference, in `dtype`, for each goal of `targets` (GOALS by default)."""
    targets = GOALS if targets is None else targets
    torch.backends.cuda.matmul.allow_tf32 = False
    modes.stage("cuda").select_kernel(gpu.KERNEL or 0)  # --kernel N: version N's goals, by its number
    dense = modes.dense("cuda")
    out = {} if out is None else out
    out.update({"rounds": rounds, "version": f"v{gpu.KERNEL}" if gpu.KERNEL else "automatic",
                "dtype": str(dtype).removeprefix("torch."), "goals": {}})
    for shape in (gpu.BIG, gpu.SMALL_BATCH):
        tensors, g = benchmark.inputs(*shape, gpu.DEVICE, dtype, 0)
        fns = {"reference/forward": gpu.forward_call(benchmark.reference, tensors),
               "cuda/forward": gpu.forward_call(dense, tensors)}
        if shape == gpu.BIG:
            fns["reference/fwd+bwd"] = gpu.fwd_bwd_call(benchmark.reference, tensors, g)
            fns["cuda/fwd+bwd"] = gpu.fwd_bwd_call(dense, tensors, g)
        stats = timing.measure(fns, device=gpu.DEVICE, rounds=rounds)
        for what in ("forward", "fwd+bwd"):
            if f"cuda/{what}" not in stats:
                continue
            name = what if shape == gpu.BIG else f"{what}, B={shape[0]}"
            r = gpu.speed_ratio(stats, f"cuda/{what}", f"reference/{what}")
            lo = r["ci"][0] if r["ci"] else None
            out["goals"][name] = {"shape": list(shape), "cuda_us": stats[f"cuda/{what}"].median,
                                  "reference_us": stats[f"reference/{what}"].median, **r, "goal": targets[name],
                                  "met": lo is not None and lo >= targets[name],
                                  "missed": r["ci"] is not None and r["ci"][1] < targets[name]}
        save()
    return out


def grad(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    """The sigmoid-grad kernels, each with the bias gradient, against torch's sigmoid backward and
    column sum (what the reference's backward runs for them), at GRAD_ROWS rows of 4096 columns."""
    launch = gpu.grad_launcher(gpu.library())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cols = gpu.BIG[2]
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
        for v in range(1, gpu.catalog_grad_versions() + 1):
            def call(v=v, g=g, y=y, dz=dz, db=db, work=work, rows=rows):
                rc = launch(v, gpu.DTYPE_CODES["f32"], False, g.data_ptr(), y.data_ptr(), dz.data_ptr(),
                            db.data_ptr(), rows, cols, sms, work.data_ptr(), torch.cuda.current_stream().cuda_stream)
                if rc != 0:
                    raise RuntimeError(f"sigmoid-grad v{v}: the launch failed with cudaError {rc}")
                return dz
            fns[f"sigmoid-grad v{v}"] = call
        fns, failed = gpu.runnable(fns)
        checked = {}
        want_dz, want_db = g * y * (1 - y), (g * y * (1 - y)).double().sum(0)
        for name in [n for n in fns if n.startswith("sigmoid-grad")]:
            fns[name]()
            checked[name] = {"dz": gpu.rel_error(dz, want_dz.double()), "db": gpu.rel_error(db, want_db)}
            if max(checked[name].values()) >= gpu.TOLERANCE:
                failed[name] = f"wrong result: {checked[name]}"
                del fns[name]
        stats = timing.measure(fns, device="cuda", rounds=rounds)
        moved = 3 * rows * cols * 4  # bytes: g and y read, dz written
        out["shapes"][str(rows)] = {"rows": rows, "failed": failed, "rel_errors": checked, "lines": [
            {"line": name, "us": s.median, "spread_us": s.spread, "gb_per_s": moved / s.median / 1e3,
             "of_torch": gpu.speed_ratio(stats, name, "torch: sigmoid backward + sum")}
            for name, s in stats.items()]}
        save()
    return out


def bf16(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing, seed: int = 50) -> dict:
    """The versions built for bfloat16, checked against float64 once, then timed against cuBLAS's
    bfloat16 x·Wᵀ and the reference in bfloat16, at 4096³ and at B = 32."""
    out = {} if out is None else out
    versions = gpu.only([0, *gpu.versions("bf16")])
    out["checked"] = gpu.check_bf16(versions, seed)
    passed = [v for v in versions if out["checked"][f"v{v}"]["ok"]]
    out["tolerance"], out["shapes"] = gpu.BF16_TOLERANCE, {}
    save()
    for shape in (gpu.BIG, gpu.SMALL_BATCH):
        part = out["shapes"].setdefault("×".join(map(str, shape)), {})
        gpu.table_at(shape, rounds, torch.bfloat16, passed, part, save)
    return out


def ptx(rounds: int, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    stage = modes.stage("ptx")
    if not stage.GENERATED.exists():
        raise cli.UserError(f"{stage.GENERATED} is missing: run bash ptx/regen.sh first")
    sources = {"edited": stage.EDITED, "compiler": stage.GENERATED}
    dense = modes.dense("ptx")
    out = {} if out is None else out
    out.update({"rounds": rounds, "shapes": {}})
    for label, shape in (("4096", gpu.BIG), ("elementwise", WIDE)):
        tensors, g = benchmark.inputs(*shape, "cuda", torch.float32, 0)
        fns = {"forward": gpu.forward_call(dense, tensors),
               "fwd+bwd": gpu.fwd_bwd_call(dense, tensors, g)}
        samples: dict[str, list[float]] = {f"{s}/{k}": [] for s in sources for k in fns}
        for r in range(rounds):  # alternate the two modules round by round; loading is untimed
            for src in (("edited", "compiler") if r % 2 == 0 else ("compiler", "edited")):
                stage.load_ptx(sources[src])
                stats = timing.measure(fns, device="cuda", rounds=1, warmup=1)
                for k, s in stats.items():
                    samples[f"{src}/{k}"] += s.samples
        stage.load_ptx(stage.EDITED)
        rows = {}
        for k in fns:
            paired = timing.paired_ratio(samples[f"compiler/{k}"], samples[f"edited/{k}"])
            rows[k] = {"edited_us": timing.Stats(samples[f"edited/{k}"]).median,
                       "compiler_us": timing.Stats(samples[f"compiler/{k}"]).median,
                       "speedup": paired["ratio"], "ci": paired["ci"],
                       "verdict": ("no significant difference" if paired["ci"] is None or
                                   paired["ci"][0] <= 1.0 <= paired["ci"][1] else
                                   "edited faster" if paired["ci"][0] > 1.0 else "edited slower")}
        out["shapes"][label] = {"shape": list(shape), **rows}
        save()
    return out


def candidates(rounds: int, seed: int = 100, out: dict | None = None, save: gpu.Save = gpu.nothing) -> dict:
    """Check every candidate against float64, then time those that pass (see the module's doc)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [c.shape for c in gpu.catalog.candidates()]  # (BM, BN, BK, WM, WN, TM, TN, MINB)
    lib = gpu.library()
    if lib.dense_tune_count() != len(shapes):
        raise cli.UserError(f"the built library has {lib.dense_tune_count()} candidates, cuda/dense_kernels.h "
                            f"lists {len(shapes)}: rebuild the cuda stage")
    out = {} if out is None else out
    out.update({"rounds": rounds, "tf32": False, "candidates": [list(s) for s in shapes], "checked": [],
                "timed": [], "shapes": {}})
    for i in range(len(shapes)):
        row: dict = {"candidate": i, "shape": list(shapes[i]), "rel_errors": {}}
        try:
            for shape in (*gpu.CHECK_SHAPES, gpu.SMALL_BATCH):
                seed += 1
                tensors, _ = benchmark.inputs(*shape, "cuda", torch.float32, seed)
                with torch.no_grad():
                    row["rel_errors"]["×".join(map(str, shape))] = gpu.rel_error(
                        gpu.tune_forward(lib, i, tensors)(), benchmark.reference(*(t.double() for t in tensors)))
            row["ok"] = all(e < gpu.TOLERANCE for e in row["rel_errors"].values())
            said = ", ".join(f"{k} {e:.1e}" for k, e in row["rel_errors"].items())
        except RuntimeError as e:  # a launch that fails: this candidate fails, the next one runs
            row.update({"ok": False, "error": gpu.first_line(e)})
            said = row["error"]
        out["checked"].append(row)
        print(f"{'PASS' if row['ok'] else 'FAIL'}  candidate {i} {shapes[i]}: {said}", flush=True)
        if row["ok"]:
            out["timed"].append(i)
        save()
    dense, cuda = modes.dense("cuda"), modes.stage("cuda")
    for shape in (gpu.BIG, gpu.SMALL_BATCH):
        tensors, _ = benchmark.inputs(*shape, "cuda", torch.float32, 0)
        fns = {"reference": gpu.forward_call(benchmark.reference, tensors),
               "version 0": gpu.version_call(0, dense, tensors)}
        for v in gpu.chapter_versions():
            fns[f"v{v}"] = gpu.version_call(v, dense, tensors)
        for i in out["timed"]:
            fns[f"candidate {i}"] = gpu.tune_forward(lib, i, tensors)
        fns, failed = gpu.runnable(fns)
        cuda.select_kernel(0)
        stats = timing.measure(fns, device="cuda", rounds=rounds)
        cuda.select_kernel(0)
        flops = 2 * shape[0] * shape[1] * shape[2]
        out["shapes"]["×".join(map(str, shape))] = {"shape": list(shape), "failed": failed, "rows": [
            {"line": name, "forward_us": st.median, "spread_us": st.spread, "gflops": flops / st.median / 1e3,
             "of_reference": gpu.speed_ratio(stats, name, "reference"),
             "of_version_0": gpu.speed_ratio(stats, name, "version 0")}
            for name, st in stats.items()]}
        save()
    return out
