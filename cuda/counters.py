"""Nsight Compute's memory counters without a GPU: the CUDA chapter's kernels run in the CPU
emulation with every load and store observed, and their warp requests counted as ncu counts them:
global load/store requests and 32-byte sectors, shared-memory requests, wavefronts and bank
conflicts (cuda/emulate/counters.cpp says how, and what the model leaves out).

The kernels' source is unchanged: a separate build of the emulation (GCC's -fsanitize=kernel-address
instrumentation, its callbacks defined by the counters) observes them. The plain emulation
(grad_check.py cuda --emulate) is not slowed by it.

Blocks of a GEMM are independent and its interior blocks alike: by default only the first, second
and last block along each grid dimension run, the second standing for every interior one, and the
counts are scaled to the whole grid (the table says how many blocks ran). --full runs every block.

Examples:
  python cuda/counters.py                                  # chapter 4's ncu table, 2048³, float32
  python cuda/counters.py --shape 256 256 256 --kernels 5:nt 7:nt 10:nt
  python cuda/counters.py --shape 32 4096 4096 --kernels 9:nt 12:nt tune4:nt --sm-count 132
  python cuda/counters.py --shape 65 129 33 --kernels 3:tn --dtype float64 --full
  python cuda/counters.py --shape 4096 64 1 --kernels grad:1 grad:2 grad:3   # the backward's kernel
  python cuda/counters.py --planted                        # the four patterns with known counts
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # cli.py, benchmark.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

# The ncu metric each count stands for (cuda/emulate/counters.cpp's Metric, in that order).
METRICS = (
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "smsp__inst_executed_op_shared_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smsp__inst_executed_op_shared_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "blocks_run",
    "blocks_stood_for",
)
# The kernels of chapter 4's ncu table (docs/results/ncu_gemm_h200.json): every version's
# forward, and v1's and v2's GEMM of the gradient of x.
NCU_RECORD = ROOT / "docs" / "results" / "ncu_gemm_h200.json"
LAYOUTS = ("nt", "nn", "tn")
DTYPES = {"float32": 4, "float64": 8}
PLANTED = ("coalesced", "column-major", "stride-32", "broadcast")
FLAGS = ["-std=c++17", "-O3", "-fno-tree-vectorize", "-pthread", "-fPIC", "-fvisibility=hidden", f"-I{HERE}",
         "-DCUDA_EMU_COUNT"]
# GCC's names for the callbacks (clang's kernel-address instrumentation is set up differently).
INSTRUMENT = ["-fsanitize=kernel-address", "--param", "asan-instrumentation-with-call-threshold=0",
              "--param", "asan-stack=0", "--param", "asan-globals=0"]
KPLAIN, KBIAS_SIGMOID = 0, 1

_lib: ctypes.CDLL | None = None


def compiler() -> str:
    return os.environ.get("CXX", "g++")


def unavailable_reason() -> str | None:
    """None if the instrumented build can be made here, else why not (and the way out)."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        return f"needs GCC's g++ for its -fsanitize=kernel-address instrumentation; {cxx!r} is not on the PATH " \
               "(install g++, or set CXX=g++)"
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    if "clang" in version.lower() or "Free Software Foundation" not in version:
        first = version.splitlines()[0] if version else "?"
        return f"needs GCC's g++ (its kernel-address callbacks); {cxx!r} is {first} (set CXX=g++)"
    return None


def _sources() -> list[Path]:
    return sorted([*HERE.glob("*.h"), *(HERE / "kernels").glob("*.cuh"), *(HERE / "units").glob("*.cu"),
                   *(HERE / "emulate").glob("*.h"), *(HERE / "emulate").glob("*.cpp")])


def library_path() -> Path:
    """Where the build of today's sources lies (build/counters/, one file per source state)."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join([compiler(), *FLAGS, *INSTRUMENT]).encode())
    return ROOT / "build" / "counters" / f"libdense_count_{digest.hexdigest()[:12]}.so"


def built() -> bool:
    return library_path().exists()


def build() -> Path:
    """The instrumented library, built once per source state into build/counters/."""
    out = library_path()
    if out.exists():
        return out
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"the counting build {reason}")
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"building the instrumented emulation in {out.parent.relative_to(ROOT)} (about 10 s)...",
          file=sys.stderr, flush=True)
    tmp = out.parent / f"tmp{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    steps = [
        [compiler(), *FLAGS, *INSTRUMENT, "-c", str(HERE / "emulate" / "counted.cpp"), "-o", str(tmp / "counted.o")],
        [compiler(), *FLAGS, "-c", str(HERE / "emulate" / "counters.cpp"), "-o", str(tmp / "counters.o")],
        [compiler(), "-shared", "-pthread", str(tmp / "counted.o"), str(tmp / "counters.o"), "-ldl", "-o",
         str(tmp / "lib.so")],
    ]
    for cmd in steps:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the counters failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}")
    os.replace(tmp / "lib.so", out)  # atomic: a concurrent build never loads half a file
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(build()))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.emu_gemm.argtypes = [i32, ctypes.c_char_p, i32, p, p, p, p, i64, i64, i64, i32, i32, p]
        lib.emu_gemm_workspace.argtypes = [i32, i32, i64, i64, i64, i32]
        lib.emu_sigmoid_grad.argtypes = [i32, i32, i32, p, p, p, p, i64, i64, i32, p]
        lib.emu_sigmoid_grad_workspace.argtypes = [i32, i64, i64, i32]
        lib.emu_gemm.restype = lib.emu_sigmoid_grad.restype = i32
        lib.emu_gemm_workspace.restype = lib.emu_sigmoid_grad_workspace.restype = i64
        lib.cnt_reset.argtypes = [i32]
        lib.cnt_add_global.argtypes = [p, i64]
        lib.cnt_read.argtypes = [i32, ctypes.POINTER(ctypes.c_double)]
        lib.cnt_planted.argtypes = [i32, p, p]
        lib.cnt_shared_bytes.restype = i64
        if lib.cnt_metrics() != len(METRICS):
            raise RuntimeError("cuda/counters.py's METRICS and cuda/emulate/counters.cpp disagree")
        _lib = lib
    return _lib


@dataclass
class Counts:
    """One launch's counts, each scaled to the whole grid."""

    kernel: str
    metrics: dict[str, float]
    grid_blocks: int

    def get(self, short: str) -> float:
        return self.metrics[next(m for m in METRICS if short in m)]

    def per_request(self, kind: str) -> float | None:
        """Sectors per global request, kind 'ld' or 'st'."""
        req = self.metrics[f"l1tex__t_requests_pipe_lsu_mem_global_op_{kind}.sum"]
        return self.metrics[f"l1tex__t_sectors_pipe_lsu_mem_global_op_{kind}.sum"] / req if req else None


def _begin(lib: ctypes.CDLL, sample: bool, *buffers) -> None:
    if lib.cnt_reset(int(sample)) != 0:
        raise RuntimeError("the counters could not find the shared-memory range of their own library")
    for t in buffers:
        if t is not None and t.numel():
            lib.cnt_add_global(t.data_ptr(), t.numel() * t.element_size())


def _read(lib: ctypes.CDLL, names: list[str]) -> list[Counts]:
    out = []
    for i in range(lib.cnt_launches()):
        buf = (ctypes.c_double * len(METRICS))()
        lib.cnt_read(i, buf)
        values = dict(zip(METRICS, buf))
        out.append(Counts(names[i] if i < len(names) else f"launch {i}", values, int(values["blocks_stood_for"])))
    return out


TUNE_BASE = 100  # launch_gemm's "version" 100 + I runs autotuning candidate I (cuda/dense_kernels.h)


def kernel_name(version: int, layout: str, element_bytes: int) -> str:
    kind = f"tune{version - TUNE_BASE}" if version >= TUNE_BASE else f"v{version}"
    return f"dense_gemm_{kind}_{layout}_{'f32' if element_bytes == 4 else 'f64'}"


def candidates() -> range:
    """The autotuning candidates' indices (DENSE_TUNE_CANDIDATES in cuda/dense_kernels.h)."""
    return range(len(cli.load_file("cuda/catalog.py", "dense_cuda_catalog").candidates()))


DTYPE_CODES = {4: 0, 8: 1}  # element bytes -> dense_kernels::DType (float32, float64): what is counted here


def count_gemm(version: int, layout: str, m: int, n: int, k: int, element_bytes: int = 4, sm_count: int = 132,
               sample: bool = True, seed: int = 0) -> list[Counts]:
    """Counts for one GEMM call (one launch, or two with split-K's reduction), in the epilogue the
    layer uses there: bias + sigmoid for the forward ("nt"), none for the backward's layouts."""
    import torch

    lib = library()
    dtype = torch.float32 if element_bytes == 4 else torch.float64
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, m, generator=g, dtype=dtype) if layout == "tn" else torch.randn(m, k, generator=g, dtype=dtype)
    b = torch.randn(n, k, generator=g, dtype=dtype) if layout == "nt" else torch.randn(k, n, generator=g, dtype=dtype)
    c = torch.empty(m, n, dtype=dtype)
    forward = layout == "nt"
    bias = torch.randn(n, generator=g, dtype=dtype) if forward else None
    code = DTYPE_CODES[element_bytes]
    size = lib.emu_gemm_workspace(version, code, m, n, k, sm_count)
    work = torch.empty(max(size, 0), dtype=dtype)
    _begin(lib, sample, a, b, c, bias, work)
    rc = lib.emu_gemm(version, layout.encode(), code, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                      None if bias is None else bias.data_ptr(), m, n, k, KBIAS_SIGMOID if forward else KPLAIN,
                      sm_count, work.data_ptr() if size > 0 else None)
    if rc != 0:
        raise RuntimeError(f"the emulated GEMM v{version} {layout} returned {rc}")
    reduce = f"dense_splitk_reduce_{'f32' if element_bytes == 4 else 'f64'}"
    return _read(lib, [kernel_name(version, layout, element_bytes), reduce])


def count_sigmoid_grad(version: int, rows: int, cols: int, element_bytes: int = 4, sm_count: int = 132,
                       sample: bool = True, seed: int = 0) -> list[Counts]:
    """Counts for the backward's elementwise kernel (and v3's second pass), db included."""
    import torch

    lib = library()
    dtype = torch.float32 if element_bytes == 4 else torch.float64
    g = torch.Generator().manual_seed(seed)
    grad, y = torch.randn(rows, cols, generator=g, dtype=dtype), torch.rand(rows, cols, generator=g, dtype=dtype)
    dz, db = torch.empty(rows, cols, dtype=dtype), torch.empty(cols, dtype=dtype)
    size = lib.emu_sigmoid_grad_workspace(version, rows, cols, sm_count)
    work = torch.empty(max(size, 0), dtype=dtype)
    _begin(lib, sample, grad, y, dz, db, work)
    rc = lib.emu_sigmoid_grad(version, DTYPE_CODES[element_bytes], 0, grad.data_ptr(), y.data_ptr(), dz.data_ptr(),
                              db.data_ptr(), rows, cols, sm_count, work.data_ptr() if size > 0 else None)
    if rc != 0:
        raise RuntimeError(f"the emulated sigmoid-grad v{version} returned {rc}")
    suffix = "f32" if element_bytes == 4 else "f64"
    return _read(lib, [f"dense_sigmoid_grad_v{version}_{suffix}", f"dense_bias_grad_v3_{suffix}"])


def count_planted(which: str) -> Counts:
    """One warp running one of the planted patterns (cuda/emulate/counted.cpp), counted in full."""
    import torch

    lib = library()
    src, dst = torch.randn(32 * 32), torch.empty(32)
    _begin(lib, False, src, dst)
    lib.cnt_planted(PLANTED.index(which), src.data_ptr(), dst.data_ptr())
    return _read(lib, [which])[0]


# ---------------------------------------------------------------------------------------------
# The table, in the columns of chapter 4's ncu table, beside ncu's own numbers where a record holds
# the same kernel at the same shape.
# ---------------------------------------------------------------------------------------------


def ncu_metrics(record: dict | None, shape: tuple[int, int, int]) -> dict[str, dict]:
    if not record or tuple(record.get("shape", ())) != shape:
        return {}
    return {k["kernel"]: k["metrics"] for k in record["kernels"]}


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if x == 0:
        return "0"
    return f"{x:.2g}" if abs(x) >= 1e4 else f"{x:.4g}" if x != int(x) else f"{int(x)}"


def rows(record: dict) -> list[dict]:
    """The table's rows: each kernel's counts, beside ncu's from the record `compare` names (read
    now, not copied into the counts' record) where it holds the same kernel at the same shape."""
    ncu = {}
    if record.get("compare") and record["dtype"] == "float32":
        ncu = ncu_metrics(json.loads((ROOT / record["compare"]).read_text()), tuple(record["shape"]))
    out = []
    for k in record["kernels"]:
        r = Counts(k["kernel"], k["metrics"], int(k["metrics"]["blocks_stood_for"]))
        theirs = ncu.get(r.kernel, {})
        t_req = theirs.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")
        t_sect = theirs.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")
        out.append({
            "kernel": r.kernel,
            "blocks": f"{int(r.metrics['blocks_run'])} of {r.grid_blocks}",
            "ld_requests": r.metrics[METRICS[0]],
            "ld_sectors_per_request": r.per_request("ld"),
            "st_sectors_per_request": r.per_request("st"),
            "shared_ld_requests": r.metrics[METRICS[4]],
            "shared_ld_conflicts": r.metrics[METRICS[6]],
            "shared_st_requests": r.metrics[METRICS[7]],
            "shared_st_conflicts": r.metrics[METRICS[9]],
            "ncu_ld_sectors_per_request": t_sect / t_req if t_req else None,
            "ncu_shared_ld_conflicts": theirs.get(METRICS[6]),
            "ncu_shared_st_conflicts": theirs.get(METRICS[9]),
        })
    return out


def table(record: dict) -> str:
    table_rows = rows(record)
    with_ncu = any(r["ncu_ld_sectors_per_request"] is not None for r in table_rows)
    head = ["kernel", "blocks run", "global load requests", "sectors / request (loads)", "(stores)",
            "shared loads", "bank conflicts (loads)", "shared stores", "bank conflicts (stores)"]
    if with_ncu:
        head += ["ncu: sectors / request", "ncu: conflicts (loads, stores)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in table_rows:
        cells = [r["kernel"], r["blocks"], _num(r["ld_requests"]), _num(r["ld_sectors_per_request"]),
                 _num(r["st_sectors_per_request"]), _num(r["shared_ld_requests"]), _num(r["shared_ld_conflicts"]),
                 _num(r["shared_st_requests"]), _num(r["shared_st_conflicts"])]
        if with_ncu:
            cells += [_num(r["ncu_ld_sectors_per_request"]),
                      f"{_num(r['ncu_shared_ld_conflicts'])}, {_num(r['ncu_shared_st_conflicts'])}"
                      if r["ncu_shared_ld_conflicts"] is not None else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def conditions(record: dict) -> str:
    m, n, k = record["shape"]
    sampled = "a sample of blocks, scaled to the grid" if record["sample"] else "every block"
    return (f"Emulated on the CPU ({record['compiler']}), M={m} N={n} K={k}, {record['dtype']}, "
            f"{record['sm_count']} SMs assumed, {sampled}; {record['seconds']:.0f} s; {record['date']}: "
            f"`{record['command']}`")


# Rows where the model and ncu disagree, and why (cuda/README.md tells the reader). The test
# (tests/test_counters.py) checks that these rows still differ and that every other row agrees.
KNOWN_DIFFERENCES = {
    ("dense_gemm_v3_nt_f32", "st"): "store conflicts: ncu counts some, the addresses have none",
    ("dense_gemm_v4_nt_f32", "st"): "store conflicts: ncu counts some, the addresses have none",
    ("dense_gemm_v5_nt_f32", "st"): "store conflicts: ncu counts some, the addresses have none",
}
ZERO = 0.01  # conflicts under 1% of requests count as none


def agreement(row: dict) -> dict[str, bool | None]:
    """Whether the emulated counts agree with ncu's on one row (None: ncu has no number):
    sectors per global load request within 10%; bank conflicts (loads, stores) both under 1% of the
    requests, or both above it and within a factor of 2."""
    out: dict[str, bool | None] = {}
    mine, theirs = row["ld_sectors_per_request"], row["ncu_ld_sectors_per_request"]
    out["sectors"] = None if theirs is None or mine is None else abs(mine - theirs) <= 0.10 * theirs
    for kind in ("ld", "st"):
        ours, ncu, requests = row[f"shared_{kind}_conflicts"], row[f"ncu_shared_{kind}_conflicts"], row[
            f"shared_{kind}_requests"]
        if ncu is None:
            out[kind] = None
            continue
        base = max(requests, 1.0)
        if ours < ZERO * base or ncu < ZERO * base:
            out[kind] = ours < ZERO * base and ncu < ZERO * base
        else:
            out[kind] = ncu / 2 <= ours <= 2 * ncu
    return out


def render(record: dict) -> str:
    """The script's output: every count, beside ncu's where the record has the kernel."""
    return table(record) + "\n\n" + conditions(record)


def chapter_table(record: dict) -> str:
    """The chapter's shorter table (docs/render.py's "counters" marker): what ncu's table shows,
    counted, beside ncu's number, and whether the two agree (see agreement)."""
    lines = ["| kernel | sectors / request (loads): counted, ncu | bank conflicts (loads, stores): counted | ncu | "
             "agree |", "|---|---:|---:|---:|---|"]
    for r in rows(record):
        ncu = r["ncu_ld_sectors_per_request"]
        verdict = agreement(r)
        agree = "–" if ncu is None else ", ".join(
            f"{name} {'yes' if verdict[key] else 'no'}" for key, name in (("sectors", "sectors"), ("ld", "loads"),
                                                                          ("st", "stores")))
        theirs = "–" if r["ncu_shared_ld_conflicts"] is None else \
            f"{_num(r['ncu_shared_ld_conflicts'])}, {_num(r['ncu_shared_st_conflicts'])}"
        lines.append(f"| {r['kernel']} | {_num(r['ld_sectors_per_request'])}, {_num(ncu)} | "
                     f"{_num(r['shared_ld_conflicts'])}, {_num(r['shared_st_conflicts'])} | {theirs} | {agree} |")
    return "\n".join(lines) + "\n\n" + conditions(record)


GRAD_VERSIONS = (1, 2, 3)  # dense_kernels::kGradVersions


def parse_kernel(text: str, versions: range) -> tuple[int, str]:
    """"8:nt" -> (8, "nt"): a GEMM version and layout; "tune4:nt" -> (104, "nt"): autotuning
    candidate 4 (float32 only); "grad:3" -> (3, "grad"): the backward's elementwise kernel (M×N is
    then its rows × columns; K is unused)."""
    match = re.fullmatch(r"v?(\d+):(nt|nn|tn)|grad:(\d+)|tune(\d+):(nt|nn|tn)", text)
    if not match:
        raise ValueError(f"--kernels takes VERSION:LAYOUT (layouts {', '.join(LAYOUTS)}), e.g. 8:nt, tuneI:LAYOUT for "
                         f"autotuning candidate I, or grad:VERSION for the backward's elementwise kernel; got {text!r}")
    if match.group(4):
        i = int(match.group(4))
        if i not in candidates():
            raise ValueError(f"no autotuning candidate {i}: they are 0 to {len(candidates()) - 1}")
        return TUNE_BASE + i, match.group(5)
    if match.group(3):
        v = int(match.group(3))
        if v not in GRAD_VERSIONS:
            raise ValueError(f"no sigmoid-grad version {v}: they are {GRAD_VERSIONS[0]} to {GRAD_VERSIONS[-1]}")
        return v, "grad"
    v = int(match.group(1))
    if v not in versions:
        raise ValueError(f"no version {v}: the versions are {versions[0]} to {versions[-1]} (cuda/dense_kernels.h)")
    return v, match.group(2)


def default_kernels(versions: range) -> list[tuple[int, str]]:
    return [(v, "nt") for v in versions] + [(1, "nn"), (2, "nn")]


def main(argv: list[str] | None = None) -> int:
    emulated = cli.load_file("cuda/emulated.py", "dense_cuda_emulated")

    parser = cli.parser(__doc__ or "")
    size = cli.positive(int)
    parser.add_argument("--shape", type=size, nargs=3, metavar=("M", "N", "K"), default=[2048, 2048, 2048],
                        help="C is M×N, the reduction K (default 2048 2048 2048, ncu's record)")
    parser.add_argument("--kernels", nargs="+", metavar="V:LAYOUT",
                        help="e.g. 5:nt 7:nt 2:nn (default: every version's nt, and 1:nn 2:nn)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--sm-count", type=size, default=132, help="the SMs of the device assumed (v9's split)")
    parser.add_argument("--full", action="store_true", help="run every block instead of a sample")
    parser.add_argument("--planted", action="store_true", help="count the four planted patterns instead")
    parser.add_argument("--compare", metavar="PATH", default=str(NCU_RECORD.relative_to(ROOT)),
                        help="an ncu record to set beside (default: %(default)s; 'none' for none)")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as a record")
    args = parser.parse_args(argv)

    versions = emulated.versions()[1:]
    try:
        kernels = [parse_kernel(t, versions) for t in args.kernels] if args.kernels else default_kernels(versions)
    except ValueError as e:
        raise cli.UserError(str(e)) from None
    if args.dtype != "float32" and any(v >= TUNE_BASE for v, _ in kernels):
        raise cli.UserError("the autotuning candidates are float32 only (--dtype float32)")
    out = cli.check_output(args.json, "--json")
    compare = None
    if args.compare != "none":
        cli.read_record(args.compare, "--compare", keys=("kernels", "shape"))  # one line if it is unusable
        compare = os.path.relpath(Path(args.compare).resolve(), ROOT)
    m, n, k = args.shape
    eb = DTYPES[args.dtype]
    # A, B, C, bias and the largest split-K workspace (at most C once per SM).
    cli.check_memory(eb * (m * k + n * k + m * n * (1 + args.sm_count) + n), what=f"M={m} N={n} K={k}")
    if not built() and unavailable_reason():
        raise cli.UserError(f"cannot count: the instrumented build {unavailable_reason()}")
    try:
        library()
    except RuntimeError as e:
        raise cli.UserError(str(e).splitlines()[0]) from None

    if args.planted:
        print("| pattern | sectors / request (loads) | shared requests (ld+st) | bank conflicts per request |")
        print("|---|---:|---:|---:|")
        for which in PLANTED:
            c = count_planted(which)
            sreq = c.get("inst_executed_op_shared_ld") + c.get("inst_executed_op_shared_st")
            conf = c.get("bank_conflicts_pipe_lsu_mem_shared_op_ld") + c.get("bank_conflicts_pipe_lsu_mem_shared_op_st")
            # (every pattern also stores one coalesced value per lane: its request has 4 sectors)
            print(f"| {which} | {_num(c.per_request('ld'))} | {_num(sreq)} | {_num(conf / sreq if sreq else None)} |")
        return 0

    start = time.perf_counter()
    results: list[Counts] = []
    for v, layout in kernels:
        if layout == "grad":
            results.extend(count_sigmoid_grad(v, m, n, eb, args.sm_count, sample=not args.full))
        else:
            results.extend(count_gemm(v, layout, m, n, k, eb, args.sm_count, sample=not args.full))
    seconds = time.perf_counter() - start
    import benchmark  # the record's date and command, written once

    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    record = {
        "source": "python cuda/counters.py (the CPU emulation, instrumented)",
        "compiler": version,
        "torch": __import__("torch").__version__,
        **benchmark.provenance(),
        "shape": [m, n, k],
        "dtype": args.dtype,
        "sm_count": args.sm_count,
        "sample": not args.full,
        "seconds": round(seconds, 1),
        "metrics": list(METRICS),
        "kernels": [{"kernel": r.kernel, "metrics": r.metrics} for r in results],
        "compare": compare,  # the ncu record the tables set beside these counts
    }
    return cli.publish(render(record), [(out, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
