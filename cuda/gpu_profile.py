"""cuda/bench_gpu.py under Nsight Compute: the profile part (each version's and candidate's
forward once at 2048³, v1's and v2's backward, each sigmoid-grad kernel once, and nothing else),
the kernels and metrics ncu is asked for, and the reading of its CSV into a record (--ncu runs
bench_gpu.py's profile part under ncu; --from-ncu reads an earlier CSV)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import benchmark
import cli
import modes
import record_info

gpu = cli.load_file("cuda/gpu_timing.py")
tables = cli.load_file("cuda/gpu_tables.py")

PROFILE_SHAPE = (2048, 2048, 2048)


def profile_units(passed: dict | None = None) -> list[str]:
    """What profile launches, in order: with an isolated exact run's record (cuda/isolated.py
    exact: its units in the order they ran, never-run versions first), the versions and candidates
    it found SAME; without one, every version and candidate of the header, never-run ones first."""
    if passed is not None:
        return [u for u in passed["order"] if passed["units"].get(u, {}).get("status") == "SAME" and u != "v0"]
    order = cli.load_file("cuda/isolated.py").never_run_first()
    return [name for name, _ in order if name != "v0"]


def profile(passed: dict | None = None) -> dict:
    cuda, dense = modes.stage("cuda"), modes.dense("cuda")
    (x, w, b), g = benchmark.inputs(*PROFILE_SHAPE, "cuda", torch.float32, 0)
    half = [t.bfloat16() for t in (x, w, b)]  # the tensor cores' versions that take no float32
    units = profile_units(passed)
    for unit in units:  # each forward once, in its type (float32 where built for it, else bfloat16)
        if unit.startswith("candidate"):
            gpu.tune_forward(gpu.library(), int(unit.split()[1]), [x, w, b])()
        else:
            v = int(unit[1:])
            gpu.version_call(v, dense, [x, w, b] if v in gpu.versions("f32") else half)()
    # v1 and v2 once more with the backward: its grad_x GEMM reads W in the "nn" layout, where
    # v2's neighbouring columns are neighbouring addresses (in the forward's "nt" they are not).
    for v in (1, 2):
        cuda.select_kernel(v)
        torch.autograd.grad(dense(x, w, b), (x,), g)
    cuda.select_kernel(0)
    # Each sigmoid-grad kernel once, with the bias gradient, on the forward's output: B × O.
    launch, sms = gpu.grad_launcher(gpu.library()), torch.cuda.get_device_properties(0).multi_processor_count
    rows, cols = PROFILE_SHAPE[0], PROFILE_SHAPE[2]
    y = torch.rand(rows, cols, device="cuda")
    dz, db, work = torch.empty_like(y), torch.empty(cols, device="cuda"), torch.empty(sms * cols, device="cuda")
    for v in range(1, gpu.catalog_grad_versions() + 1):
        rc = launch(v, gpu.DTYPE_CODES["f32"], False, g.data_ptr(), y.data_ptr(), dz.data_ptr(), db.data_ptr(),
                    rows, cols, sms, work.data_ptr(), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"sigmoid-grad v{v}: the launch failed with cudaError {rc}")
    torch.cuda.synchronize()
    return {"shape": list(PROFILE_SHAPE), "units": units, "grad_versions": gpu.catalog_grad_versions()}


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
                sys.executable, str(cli.ROOT / "cuda" / "bench_gpu.py"), "profile",
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
              **record_info.provenance()}
    if torch.cuda.is_available():
        record["gpu"] = record_info.describe_gpu()
    return cli.publish(tables.ncu_table(record), [(json_path, cli.json_writer(record))])
