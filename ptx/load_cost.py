"""What loading the PTX costs: the first call of a GPU stage in a fresh process, against the calls after it.

The PTX stage's first call hands the PTX text to the driver (cuModuleLoadDataEx), which
compiles it for the GPU at hand before anything runs; the cuda stage carries machine code for
sm_90 (and PTX for newer GPUs) in its library, so on an H100/H200 its first call compiles
nothing. The driver keeps what it compiled in its compute cache on disk ($CUDA_CACHE_PATH,
by default ~/.nv/ComputeCache), so the next process that loads the same PTX skips the
compilation. Each case runs in fresh processes:

  cold      an empty cache folder: the PTX is compiled
  warm      the same folder again: the compiled code comes from the cache
  disabled  CUDA_CACHE_DISABLE=1: compiled every time

Needs a GPU. Examples:
  python ptx/load_cost.py                      # print the table
  python ptx/load_cost.py --repeats 5 --json /tmp/ptx_load.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (first: a Ctrl-C during the imports below is one line too)

# isort: split
import record_info  # noqa: E402

# One process: build/load the stage, warm torch up, then time the first call and the next ones.
PROBE = r"""
import json, sys, time, torch, modes
mode = sys.argv[1]
f = modes.dense(mode)
x = torch.randn(256, 256, device="cuda"); w = torch.randn(256, 256, device="cuda")
torch.sigmoid(x @ w.t()); torch.cuda.synchronize()   # torch's own first-use costs, before timing
times = []
for _ in range(6):
    t = time.perf_counter(); f(x, w, None); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
print(json.dumps({"first_ms": times[0] * 1e3, "next_ms": sorted(times[1:])[2] * 1e3}))
"""


def probe(mode: str, env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"the {mode} stage's probe failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(repeats: int) -> list[dict]:
    rows = []
    for mode in ("ptx", "cuda"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "CUDA_CACHE_PATH": cache}
            env.pop("CUDA_CACHE_DISABLE", None)
            cases = {"cold": [], "warm": [], "disabled": []}
            for _ in range(repeats):
                shutil.rmtree(cache)  # an empty cache for every cold start
                Path(cache).mkdir()
                cases["cold"].append(probe(mode, env))
                cases["warm"].append(probe(mode, env))
                cases["disabled"].append(probe(mode, {**env, "CUDA_CACHE_DISABLE": "1"}))
            cache_bytes = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file())
        for case, runs in cases.items():
            rows.append({"mode": mode, "case": case, "first_ms": statistics.median(r["first_ms"] for r in runs),
                         "next_ms": statistics.median(r["next_ms"] for r in runs), "runs": len(runs),
                         "cache_bytes": cache_bytes})
    return rows


def table(record: dict) -> str:
    """The record as Markdown (medians over fresh processes), under benchmark.py's footer."""
    lines = ["| stage | compute cache | first call (ms) | later calls (ms) |", "|---|---|---:|---:|"]
    for r in record["results"]:
        lines.append(f"| {r['mode']} | {r['case']} | {r['first_ms']:.1f} | {r['next_ms']:.3f} |")
    # The card's driver (nvidia-smi) holds the JIT compiler that the cold rows time.
    lines.append("\n" + record_info.footer(record, f"median of {record['results'][0]['runs']} fresh processes each",
                                         tools=[f"CUDA driver API {record['driver']}"], card=True))
    return "\n".join(lines)


def driver_version() -> int:
    """The driver's CUDA version, e.g. 13000 (through the PTX stage's loader, which is built)."""
    import torch

    return int(torch.ops.dense_ptx.driver_version())


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--repeats", type=cli.positive(int), default=3, help="fresh processes per case (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write the record as JSON (the folder must exist)")
    args = parser.parse_args(argv)
    json_path = cli.check_output(args.json, "--json")
    import torch

    if not torch.cuda.is_available():
        raise cli.UserError("needs a GPU: torch.cuda.is_available() is False")
    import modes

    for mode in ("ptx", "cuda"):
        modes.build(mode)  # built (or found) before any process is timed
    driver = driver_version()
    # The probes time float32 tensors on the current device (cuda:0 unless CUDA_VISIBLE_DEVICES says).
    record = {**record_info.record_header("cuda", torch.float32), "benchmark": "ptx_load_cost",
              "driver": f"{driver // 1000}.{driver % 1000 // 10}", "results": measure(args.repeats)}
    return cli.publish(table(record), [(json_path, cli.json_writer(record, indent=1))])


if __name__ == "__main__":
    cli.run(main)
