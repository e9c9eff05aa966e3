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
Times come from timing.measure (CUDA events, L2 flushed before each call, variants
interleaved round by round); a ratio is the median of per-round ratios with its 95% interval.
This file is the command line: it runs the parts named, in order, and writes the record. The
parts are cuda/gpu_hand_kernels.py's (chapter 3's kernels, the PTX stage, the candidates),
cuda/gpu_tensor_cores.py's (roof, tf32, goals16) and cuda/gpu_profile.py's (profile, --ncu); what
they share is cuda/gpu_timing.py's, and the records' tables are cuda/gpu_tables.py's.

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
import torch  # noqa: E402

import modes  # noqa: E402
import record_info  # noqa: E402

gpu = cli.load_file("cuda/gpu_timing.py")  # the plumbing every part times with
hand = cli.load_file("cuda/gpu_hand_kernels.py")  # chapter 3's parts
tc = cli.load_file("cuda/gpu_tensor_cores.py")  # the tensor cores' chapter's parts
profiling = cli.load_file("cuda/gpu_profile.py")  # the profile part and Nsight Compute
tables = cli.load_file("cuda/gpu_tables.py")  # the records' tables

PARTS = ("check", "exact", "gemm", "goals", "small", "grad", "bf16", "roof", "tf32", "goals16", "ptx", "profile",
         "candidates")


def _writer(json_path: Path | None, record: dict) -> gpu.Save:
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
        return profiling.ncu_record(args, json_path)
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"name PARTs among {', '.join(PARTS)}, or --from-ncu CSV")
    needs = {"ptx"} if args.parts == ["ptx"] else {"cuda", "ptx"} if "ptx" in args.parts else {"cuda"}
    for mode in sorted(needs):
        reason = modes.available()[mode]
        if reason is not None:
            raise cli.UserError(f"mode {mode!r} is not available here: {reason}")
    gpu.KERNEL = args.kernel
    known = [0, *gpu.catalog.version_ids()]  # 0: no version line, the roofs alone
    if gpu.KERNEL is not None and gpu.KERNEL not in known:
        parser.error(f"--kernel {gpu.KERNEL}: no such version in {gpu.catalog.HEADER.name} (versions "
                     f"{', '.join(map(str, gpu.catalog.version_ids()))})")
    passed = cli.read_record(args.passed, "--passed", keys=("units", "order")) if args.passed else None
    record = record_info.record_header("cuda", torch.float32)
    save = _writer(json_path, record)
    run = {"check": lambda out: hand.check(args.odd_only, out=out, save=save),
           "exact": lambda out: hand.exact(out=out, save=save),
           "gemm": lambda out: hand.gemm(args.rounds, out, save),
           "goals": lambda out: hand.goals(args.rounds, out, save),
           "small": lambda out: hand.small(args.rounds, out, save),
           "grad": lambda out: hand.grad(args.rounds, out, save),
           "bf16": lambda out: hand.bf16(args.rounds, out, save),
           "roof": lambda out: tc.roof(args.rounds, out, save),
           "tf32": lambda out: tc.tf32(args.rounds, out, save),
           "goals16": lambda out: tc.goals16(args.rounds, out, save),
           "ptx": lambda out: hand.ptx(args.rounds, out, save),
           "profile": lambda out: out.update(profiling.profile(passed)),
           "candidates": lambda out: hand.candidates(args.rounds, out=out, save=save)}
    for part in PARTS:
        if part in args.parts:
            print(f"{part}...", file=sys.stderr, flush=True)
            record[part] = {}
            run[part](record[part])
            save()
    code = cli.publish(tables.table(record), [(json_path, cli.json_writer(record))])
    failed_candidates = any(not c["ok"] for c in record.get("candidates", {}).get("checked", []))
    wrong_roof = any(not r["checked"] for r in record.get("roof", {}).get("roofs", {}).values())
    failed = (record.get("check", {}).get("failed") or record.get("exact", {}).get("status", "SAME") != "SAME"
              or failed_candidates
              or wrong_roof)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    cli.run(main)
