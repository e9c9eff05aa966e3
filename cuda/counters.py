"""Nsight Compute's memory counters without a GPU: the CUDA chapter's kernels run in the CPU
emulation with every load, store, cp.async and ldmatrix observed, and their warp requests counted
as ncu counts them on sm_80 and newer: global load/store requests and 32-byte sectors, cp.async
copies (LDGSTS) as a kind of their own, shared-memory requests and wavefronts, ldmatrix (LDSM)
requests with their wavefronts among the shared loads', and the excessive wavefronts (those beyond
one per phase: what bank conflicts cost). cuda/emulate/counters.cpp says how, and what the model
leaves out.

What it covers: chapter 3's versions (1 to 12) in float32 and float64, v11 and v12 in bfloat16
and float16 too, the tensor-core versions v21 to v24 (bfloat16, float16) and v25, v26 (float32),
and the backward's elementwise kernel. Not Hopper's versions (31 to 35): wgmma reads its operands
and TMA copies its tiles where no instrumentation sees them.

The kernels' source is unchanged: a separate build of the emulation (GCC's -fsanitize=kernel-address
instrumentation, its callbacks defined by the counters) observes them. The plain emulation
(grad_check.py cuda --emulate) is not slowed by it.

Blocks of a GEMM are independent and its interior blocks alike: by default only the first, second
and last block along each grid dimension run, the second standing for every interior one, and the
counts are scaled to the whole grid (the table says how many blocks ran); the backward's
elementwise kernel is sampled along its columns only (SAMPLE_ELEMENTWISE). --full runs every block.

--shape given again adds a shape: every kernel is counted in every type at each, and the record's
rows say their shape (at() picks one). The chapters' record holds two: ncu's, 2048³, and the
timed one, 4096³ (TIMED_SHAPE).

Examples:
  python cuda/counters.py                                  # chapter 3's ncu table, 2048³, float32
  python cuda/counters.py --shape 4096 4096 4096           # the same kernels at the timed shape
  python cuda/counters.py --shape 256 256 256 --shape 512 512 256 --kernels 8:nt 12:nt   # two shapes
  python cuda/counters.py --shape 256 256 256 --kernels 5:nt 7:nt 10:nt
  python cuda/counters.py --shape 32 4096 4096 --kernels 9:nt 12:nt tune4:nt --sm-count 132
  python cuda/counters.py --shape 65 129 33 --kernels 3:tn --dtype float64 --full
  python cuda/counters.py --shape 4096 64 1 --kernels grad:1 grad:2 grad:3   # the backward's kernel
  python cuda/counters.py --shape 256 256 64 --kernels 8:nn 8:tn   # cp.async copies (LDGSTS)
  python cuda/counters.py --shape 256 256 256 --kernels 22:nt 23:nt --dtype bfloat16   # ldmatrix
  python cuda/counters.py --shape 256 256 256 --dtype bfloat16   # the tensor-core versions v21-v24
  python cuda/counters.py --shape 256 256 256 --dtype float32 bfloat16 --kernels 12:nt   # two types
  python cuda/counters.py --shape 256 256 64 --kernels 25:nt 26:nt   # TF32 on the tensor cores
  python cuda/counters.py --planted                        # the nine patterns with known counts
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # cli.py, benchmark.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

# What each count is (cuda/emulate/counters.cpp's Metric, in that order): ncu's metric of the same
# quantity, or, where ncu has no such metric, the model's own name (no "__" in it).
METRICS = (
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",  # cp.async (LDGSTS): its global side
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
    "smsp__inst_executed_op_shared_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "excessive_wavefronts_mem_shared_op_ld",  # wavefronts beyond one per phase
    "smsp__inst_executed_op_ldsm.sum",  # ldmatrix; its wavefronts are among the shared loads' above
    "smsp__inst_executed_op_shared_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "excessive_wavefronts_mem_shared_op_st",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum",  # cp.async: its shared side
    "excessive_wavefronts_mem_shared_op_ldgsts",
    "blocks_run",
    "blocks_stood_for",
)
# ncu's hardware counter of bank conflicts, which the tables set beside the excessive wavefronts
# as a second comparison: it is not the same quantity (it also counts what is not a conflict
# between the addresses of one request; KNOWN_DIFFERENCES below).
BANK_CONFLICT_COUNTERS = {kind: f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{kind}.sum"
                          for kind in ("ld", "st")}
# The kernels of chapter 3's ncu table (the newest docs/results/ncu_gemm_{card}.json): every
# version's forward, and v1's and v2's GEMM of the gradient of x.


def ncu_record() -> Path | None:
    """The newest ncu record of kind ncu_gemm_{card}.json (docs/records.py), or None."""
    found = cli.load_file("docs/records.py").of_kind("ncu_gemm_{card}.json")
    return ROOT / "docs" / "results" / found[0][0] if found else None


# The shape of chapter 3's timings (cuda/bench_gpu.py's BIG): the chapters' tables show the counts
# there, where they sit beside the times (chapter_table, tensor_core_table).
TIMED_SHAPE = (4096, 4096, 4096)


LAYOUTS = ("nt", "nn", "tn")
# The element types and their bytes, in dense_kernels::DType order (their codes: cuda/emulated.py's
# dtype_code); a kernel's name ends in its type's suffix (cuda/catalog.py's DTYPES: f32, ..., f16).
DTYPES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
DTYPE_CODES = {name: code for code, name in enumerate(DTYPES)}
PLANTED = ("coalesced", "column-major", "stride-32", "broadcast", "cp.async", "cp.async-one-bank", "ldmatrix",
           "ldmatrix-one-bank-group", "ldmatrix.x1")
FLAGS = ["-std=c++17", "-O3", "-fno-tree-vectorize", "-pthread", "-fPIC", "-fvisibility=hidden", f"-I{HERE}",
         "-DCUDA_EMU_COUNT"]
# GCC's names for the callbacks (clang's kernel-address instrumentation is set up differently).
INSTRUMENT = ["-fsanitize=kernel-address", "--param", "asan-instrumentation-with-call-threshold=0",
              "--param", "asan-stack=0", "--param", "asan-globals=0"]
KPLAIN, KBIAS_SIGMOID = 0, 1

_lib: ctypes.CDLL | None = None
# The counters keep one set of counts in the library: a count (reset, launches, read) is taken by
# one thread at a time. Each thread's own emulated shared memory is found by the library itself.
_counting = threading.Lock()


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
    return sorted([*HERE.glob("*.h"), *(HERE / "kernels").glob("*.cuh"), *(HERE / "tensor_cores").glob("*.cuh"),
                   *(HERE / "units").glob("*.cu"), *(HERE / "emulate").glob("*.h"), *(HERE / "emulate").glob("*.cpp")])


def library_path() -> Path:
    """Where the build of today's sources lies (build/counters/, one file per source state)."""
    digest = cli.source_digest(_sources(), compiler(), *FLAGS, *INSTRUMENT)
    return ROOT / "build" / "counters" / f"libdense_count_{digest}.so"


def built() -> bool:
    return library_path().exists()


def build() -> Path:
    """The instrumented library, built once per source state into build/counters/."""
    out = library_path()
    if out.exists():
        return out
    with cli.build_lock(out):
        return _build(out)


def _build(out: Path) -> Path:
    if out.exists():  # (another process may have built it while this one waited for the lock)
        return out
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"the counting build {reason}")
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"building the instrumented emulation in {out.parent.relative_to(ROOT)} (about a minute on 2 cores)...",
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
        """The count whose name holds `short` as a whole part ("requests_pipe_lsu_mem_global_op_ld"
        is the loads', not the LDGSTS')."""
        return self.metrics[metric(short)]

    def per_request(self, kind: str) -> float | None:
        """Sectors per global request, kind 'ld', 'st' or 'ldgsts'."""
        req = self.metrics[f"l1tex__t_requests_pipe_lsu_mem_global_op_{kind}.sum"]
        return self.metrics[f"l1tex__t_sectors_pipe_lsu_mem_global_op_{kind}.sum"] / req if req else None


def metric(short: str) -> str:
    """The one name of METRICS that holds `short`, followed by its end or by ".sum"."""
    found = [m for m in METRICS if re.search(re.escape(short) + r"(\.sum)?$", m)]
    if len(found) != 1:
        raise KeyError(f"{short!r} names {len(found)} of the counts, not one")
    return found[0]


# The grid dimensions (bit 0: x, 1: y, 2: z) whose interior blocks do the same work, and so may be
# sampled: a GEMM's tiles along x and y and its slices of K along z (equal but for the last); the
# backward's elementwise kernel only along its columns (x): its blocks along y take the rows in
# bands of 32 by turns, so that some of them may take one band more than others.
SAMPLE_GEMM, SAMPLE_ELEMENTWISE = 0b111, 0b001


def _begin(lib: ctypes.CDLL, sampled_dims: int, *buffers) -> None:
    if lib.cnt_reset(sampled_dims) != 0:
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


def catalog() -> ModuleType:
    """cuda/catalog.py: the versions cuda/dense_kernels.h declares, and the types each is built for."""
    return cli.load_file("cuda/catalog.py")


def suffix(dtype: str) -> str:
    """A kernel name's type suffix: "float32" -> "f32", "bfloat16" -> "bf16"."""
    return catalog().DTYPES[DTYPE_CODES[dtype]]


def kernel_name(version: int, layout: str, dtype: str) -> str:
    kind = f"tune{version - TUNE_BASE}" if version >= TUNE_BASE else f"v{version}"
    return f"dense_gemm_{kind}_{layout}_{suffix(dtype)}"


def candidates() -> range:
    """The autotuning candidates' indices (DENSE_TUNE_CANDIDATES in cuda/dense_kernels.h)."""
    return range(len(catalog().candidates()))


def hopper_versions() -> range:
    """Hopper's versions (dense_kernels::needs_sm90a): wgmma and TMA, which the counters leave out."""
    text = catalog().HEADER.read_text()
    found = re.search(r"needs_sm90a\(int version\) \{ return version >= (\d+) && version <= (\d+); \}", text)
    if not found:
        raise RuntimeError("cuda/dense_kernels.h's needs_sm90a is not the range cuda/counters.py reads")
    return range(int(found.group(1)), int(found.group(2)) + 1)


def versions(dtype: str) -> list[int]:
    """The GEMM versions the counters run in `dtype`: those built for it, Hopper's left out."""
    hopper = hopper_versions()
    return [v for v in catalog().version_ids(dtype=suffix(dtype)) if v not in hopper]


def _tensors(dtype: str) -> tuple[torch.dtype, torch.dtype]:
    """(element type, accumulator type) as torch dtypes: workspaces are of the accumulator."""
    import torch

    return getattr(torch, dtype), torch.float64 if dtype == "float64" else torch.float32


def count_gemm(version: int, layout: str, m: int, n: int, k: int, dtype: str = "float32", sm_count: int = 132,
               sample: bool = True, seed: int = 0) -> list[Counts]:
    """Counts for one GEMM call (one launch, or two with split-K's reduction), in the epilogue the
    layer uses there: bias + sigmoid for the forward ("nt"), none for the backward's layouts."""
    import torch

    lib = library()
    element, acc = _tensors(dtype)
    g = torch.Generator().manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, dtype=acc).to(element)

    a = randn(k, m) if layout == "tn" else randn(m, k)
    b = randn(n, k) if layout == "nt" else randn(k, n)
    c = torch.empty(m, n, dtype=element)
    forward = layout == "nt"
    bias = randn(n) if forward else None
    code = DTYPE_CODES[dtype]
    size = lib.emu_gemm_workspace(version, code, m, n, k, sm_count)
    work = torch.empty(max(size, 0), dtype=acc)
    reduce = f"dense_splitk_reduce_{suffix(dtype)}"
    with _counting:
        _begin(lib, SAMPLE_GEMM if sample else 0, a, b, c, bias, work)
        rc = lib.emu_gemm(version, layout.encode(), code, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                          None if bias is None else bias.data_ptr(), m, n, k, KBIAS_SIGMOID if forward else KPLAIN,
                          sm_count, work.data_ptr() if size > 0 else None)
        if rc != 0:
            raise RuntimeError(f"the emulated GEMM v{version} {layout} returned {rc}")
        return _read(lib, [kernel_name(version, layout, dtype), reduce])


def count_sigmoid_grad(version: int, rows: int, cols: int, dtype: str = "float32", sm_count: int = 132,
                       sample: bool = True, seed: int = 0) -> list[Counts]:
    """Counts for the backward's elementwise kernel (and v3's second pass), db included."""
    import torch

    lib = library()
    element, acc = _tensors(dtype)
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(rows, cols, generator=g, dtype=acc).to(element)
    y = torch.rand(rows, cols, generator=g, dtype=acc).to(element)
    dz, db = torch.empty(rows, cols, dtype=element), torch.empty(cols, dtype=element)
    size = lib.emu_sigmoid_grad_workspace(version, rows, cols, sm_count)
    work = torch.empty(max(size, 0), dtype=acc)
    end = suffix(dtype)
    with _counting:
        _begin(lib, SAMPLE_ELEMENTWISE if sample else 0, grad, y, dz, db, work)
        rc = lib.emu_sigmoid_grad(version, DTYPE_CODES[dtype], 0, grad.data_ptr(), y.data_ptr(),
                                  dz.data_ptr(), db.data_ptr(), rows, cols, sm_count,
                                  work.data_ptr() if size > 0 else None)
        if rc != 0:
            raise RuntimeError(f"the emulated sigmoid-grad v{version} returned {rc}")
        return _read(lib, [f"dense_sigmoid_grad_v{version}_{end}", f"dense_bias_grad_v3_{end}"])


def count_planted(which: str) -> Counts:
    """One warp running one of the planted patterns (cuda/emulate/counted.cpp), counted in full."""
    import torch

    lib = library()
    src, dst = torch.randn(32 * 32), torch.empty(32)
    with _counting:
        _begin(lib, 0, src, dst)
        lib.cnt_planted(PLANTED.index(which), src.data_ptr(), dst.data_ptr())
        return _read(lib, [which])[0]


# ---------------------------------------------------------------------------------------------
# The table, in the columns of chapter 3's ncu table, beside ncu's own numbers where a record holds
# the same kernel at the same shape.
# ---------------------------------------------------------------------------------------------


def at(record: dict, shape: tuple[int, int, int] | list[int]) -> dict:
    """The record's counts at one of its shapes, as a record of that shape alone: its "kernels"
    those counted there, with that shape's "shape" and "seconds". KeyError if it holds none there."""
    shape = tuple(shape)
    found = [s for s in record["shapes"] if tuple(s["shape"]) == shape]
    if not found:
        held = "; ".join("M={} N={} K={}".format(*s["shape"]) for s in record["shapes"])
        raise KeyError("the record holds no counts at M={} N={} K={} (it holds {})".format(*shape, held))
    return {**{key: value for key, value in record.items() if key != "shapes"}, "shape": list(shape),
            "seconds": found[0]["seconds"], "kernels": [k for k in record["kernels"] if tuple(k["shape"]) == shape]}


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


NOT_MEASURED = "not measured yet"  # ncu's record holds the kernel, but not this metric


def rows(record: dict) -> list[dict]:
    """The table's rows of a record at one shape (at()): each kernel's counts, beside ncu's from
    the record `compare` names (read now, not copied into the counts' record) where it holds the
    same kernel at the same shape.
    An ncu number is None where that record lacks the kernel or the metric; `in_ncu` says which."""
    ncu = {}
    if record.get("compare") and "float32" in record["dtypes"]:  # (ncu's record: float32 kernels)
        ncu = ncu_metrics(json.loads((ROOT / record["compare"]).read_text()), tuple(record["shape"]))
    out = []
    for k in record["kernels"]:
        r = Counts(k["kernel"], k["metrics"], int(k["metrics"]["blocks_stood_for"]))
        theirs = ncu.get(r.kernel, {})
        t_req = theirs.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")
        t_sect = theirs.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")
        row = {
            "kernel": r.kernel,
            "blocks": f"{int(r.metrics['blocks_run'])} of {r.grid_blocks}",
            "ld_requests": r.get("requests_pipe_lsu_mem_global_op_ld"),
            "ld_sectors_per_request": r.per_request("ld"),
            "st_sectors_per_request": r.per_request("st"),
            "ldgsts_requests": r.get("requests_pipe_lsu_mem_global_op_ldgsts"),
            "ldgsts_sectors_per_request": r.per_request("ldgsts"),
            "ldgsts_wavefronts": r.get("data_pipe_lsu_wavefronts_mem_shared_op_ldgsts"),
            "ldgsts_excessive": r.get("excessive_wavefronts_mem_shared_op_ldgsts"),
            "in_ncu": r.kernel in ncu,
            "ncu_ld_sectors_per_request": t_sect / t_req if t_req else None,
        }
        row["ldsm_requests"] = r.get("inst_executed_op_ldsm")
        for kind in ("ld", "st"):
            row[f"shared_{kind}_requests"] = r.get(f"inst_executed_op_shared_{kind}")
            row[f"shared_{kind}_wavefronts"] = r.get(f"data_pipe_lsu_wavefronts_mem_shared_op_{kind}")
            row[f"shared_{kind}_excessive"] = r.get(f"excessive_wavefronts_mem_shared_op_{kind}")
            row[f"ncu_shared_{kind}_wavefronts"] = theirs.get(metric(f"data_pipe_lsu_wavefronts_mem_shared_op_{kind}"))
            row[f"ncu_shared_{kind}_conflicts"] = theirs.get(BANK_CONFLICT_COUNTERS[kind])
        out.append(row)
    return out


def _pair(row: dict, key: str) -> str:
    """"loads, stores" of one quantity; for ncu's, what its record lacks said as such."""
    ld, st = row[key.format("ld")], row[key.format("st")]
    if key.startswith("ncu_") and ld is None and st is None:
        return NOT_MEASURED if row["in_ncu"] else "–"
    return f"{_num(ld)}, {_num(st)}"


def table(record: dict) -> str:
    table_rows = rows(record)
    with_ncu = any(r["in_ncu"] for r in table_rows)
    head = ["kernel", "blocks run", "global load requests", "sectors / request (loads)", "(stores)",
            "LDGSTS requests", "sectors / request (LDGSTS)", "shared loads, stores", "ldmatrix (LDSM) requests",
            "shared wavefronts (loads with LDSM's, stores)", "excessive wavefronts (loads with LDSM's, stores)",
            "LDGSTS shared wavefronts (excessive)"]
    if with_ncu:
        head += ["ncu: sectors / request", "ncu: shared wavefronts (loads, stores)",
                 "ncu: bank-conflict counter (loads, stores)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in table_rows:
        cells = [r["kernel"], r["blocks"], _num(r["ld_requests"]), _num(r["ld_sectors_per_request"]),
                 _num(r["st_sectors_per_request"]), _num(r["ldgsts_requests"]), _num(r["ldgsts_sectors_per_request"]),
                 _pair(r, "shared_{}_requests"), _num(r["ldsm_requests"]), _pair(r, "shared_{}_wavefronts"),
                 _pair(r, "shared_{}_excessive"), f"{_num(r['ldgsts_wavefronts'])} ({_num(r['ldgsts_excessive'])})"]
        if with_ncu:
            cells += [_num(r["ncu_ld_sectors_per_request"]), _pair(r, "ncu_shared_{}_wavefronts"),
                      _pair(r, "ncu_shared_{}_conflicts")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def conditions(record: dict, dtypes: list[str] | None = None) -> str:
    """The line under a table of a record at one shape (at()): where, how and by which command the
    record was taken, and how long that shape's counts took (`dtypes`: the types of the rows
    shown, else the record's)."""
    m, n, k = record["shape"]
    sampled = "a sample of blocks, scaled to the grid" if record["sample"] else "every block"
    return (f"Emulated on the CPU ({record['compiler']}), M={m} N={n} K={k}, {', '.join(dtypes or record['dtypes'])}, "
            f"{record['sm_count']} SMs assumed, {sampled}; {record['seconds']:.0f} s; {record['date']}: "
            f"`{record['command']}`")


# Where the excessive wavefronts and ncu's hardware bank-conflict counter disagree, and why
# (cuda/README.md tells the reader). The test (tests/test_counters.py) checks that these rows
# still differ and that every other row agrees. The counter is not the quantity the model counts:
# on v3's stores, 32 consecutive words a warp, no two lanes share a bank, yet the counter counts.
KNOWN_DIFFERENCES = {
    ("dense_gemm_v3_nt_f32", "st"): "bank-conflict counter on stores: ncu counts some, the addresses make none",
    ("dense_gemm_v4_nt_f32", "st"): "bank-conflict counter on stores: ncu counts some, the addresses make none",
    ("dense_gemm_v5_nt_f32", "st"): "bank-conflict counter on stores: ncu counts some, the addresses make none",
}
ZERO = 0.01  # excessive wavefronts (or conflicts) under 1% of the requests count as none
CLOSE = 0.10  # sectors per request and wavefronts agree within 10%


def _close(mine: float | None, theirs: float | None) -> bool | None:
    if mine is None or theirs is None:
        return None
    return abs(mine - theirs) <= CLOSE * abs(theirs)


def agreement(row: dict) -> dict[str, bool | None]:
    """Whether the emulated counts agree with ncu's on one row (None: ncu has no number):
    "sectors", sectors per global load request within 10%; "ld_wavefronts", "st_wavefronts", the
    shared wavefronts within 10%; "ld_counter", "st_counter", the excessive wavefronts against ncu's
    bank-conflict counter: both under 1% of the requests, or both above it and within a factor of 2."""
    out: dict[str, bool | None] = {"sectors": _close(row["ld_sectors_per_request"], row["ncu_ld_sectors_per_request"])}
    for kind in ("ld", "st"):
        out[f"{kind}_wavefronts"] = _close(row[f"shared_{kind}_wavefronts"], row[f"ncu_shared_{kind}_wavefronts"])
        ours, ncu = row[f"shared_{kind}_excessive"], row[f"ncu_shared_{kind}_conflicts"]
        requests = row[f"shared_{kind}_requests"] + (row["ldsm_requests"] if kind == "ld" else 0)
        base = max(requests, 1.0)
        if ncu is None:
            out[f"{kind}_counter"] = None
        elif ours < ZERO * base or ncu < ZERO * base:
            out[f"{kind}_counter"] = ours < ZERO * base and ncu < ZERO * base
        else:
            out[f"{kind}_counter"] = ncu / 2 <= ours <= 2 * ncu
    return out


def render(record: dict) -> str:
    """The script's output: every count, beside ncu's where its record has the kernel at that
    shape; a table for each shape."""
    views = [at(record, s["shape"]) for s in record["shapes"]]
    return "\n\n".join(table(view) + "\n\n" + conditions(view) for view in views)


def _verdict(row: dict) -> str:
    if not row["in_ncu"]:
        return "–"
    v = agreement(row)

    def say(*keys: str) -> str:
        if all(v[k] is None for k in keys):
            return NOT_MEASURED
        return ", ".join("–" if v[k] is None else "yes" if v[k] else "no" for k in keys)

    return (f"sectors {say('sectors')}; wavefronts {say('ld_wavefronts', 'st_wavefronts')}; "
            f"counter {say('ld_counter', 'st_counter')}")


def chapter_table(record: dict, shape: tuple[int, int, int] = TIMED_SHAPE) -> str:
    """Chapter 3's shorter table (docs/render.py's "counters" marker), at `shape`: sectors per
    load request and shared wavefronts, counted beside ncu's; the excessive wavefronts beside
    ncu's hardware bank-conflict counter, a different quantity (KNOWN_DIFFERENCES); and whether
    they agree. The tensor-core versions' rows are left to their chapter's table (tensor_core_table)."""
    record = at(record, shape)
    lines = ["| kernel | sectors / request (loads): counted, ncu | shared wavefronts (loads, stores): counted | "
             "ncu | excessive wavefronts (loads, stores) | ncu's bank-conflict counter | agree (sectors; "
             "wavefronts; counter) |", "|---|---:|---:|---:|---:|---:|---|"]
    tensor_cores = {row["kernel"] for row in tensor_core_rows(record)}
    shown = [r for r in rows(record) if r["kernel"] not in tensor_cores]
    for r in shown:
        cells = [r["kernel"], f"{_num(r['ld_sectors_per_request'])}, {_num(r['ncu_ld_sectors_per_request'])}",
                 _pair(r, "shared_{}_wavefronts"), _pair(r, "ncu_shared_{}_wavefronts"),
                 _pair(r, "shared_{}_excessive"), _pair(r, "ncu_shared_{}_conflicts"), _verdict(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + conditions(record, _dtypes(record, {r["kernel"] for r in shown}))


def _dtypes(record: dict, kernels: set[str]) -> list[str]:
    """The element types of a record's rows of these kernels, in DTYPES' order."""
    return sorted({row["dtype"] for row in record["kernels"] if row["kernel"] in kernels}, key=list(DTYPES).index)


def tensor_core_rows(record: dict) -> list[dict]:
    """The rows of the tensor-core versions (above chapter 3's progression) a record at one shape
    (at()) holds."""
    last = max(catalog().cuda_core_versions())
    out = []
    for row in record["kernels"]:
        found = re.match(r"dense_gemm_v(\d+)_", row["kernel"])
        if found and int(found.group(1)) > last:
            out.append(row)
    return out


def tensor_core_table(record: dict, shape: tuple[int, int, int] = TIMED_SHAPE) -> str:
    """The tensor-core chapter's table (docs/render.py's "counters_tc" marker), at `shape`: for
    each tensor-core version the record holds, its global loads (sectors per request), its
    cp.async copies, the shared stores that stage its tiles and the shared loads (ldmatrix's) that
    read its fragments, each with its wavefronts and the excessive ones."""
    record = at(record, shape)
    lines = ["| kernel | global loads | sectors / request | LDGSTS (sectors / request) | shared stores | "
             "store wavefronts (excessive) | shared loads: LDS, LDSM | load wavefronts (excessive) | "
             "load wavefronts / request |", "|---|" + "---:|" * 8]
    rows_tc = tensor_core_rows(record)
    for k in rows_tc:
        r = Counts(k["kernel"], k["metrics"], int(k["metrics"]["blocks_stood_for"]))
        lds, ldsm = r.get("inst_executed_op_shared_ld"), r.get("inst_executed_op_ldsm")
        load_wavefronts = r.get("data_pipe_lsu_wavefronts_mem_shared_op_ld")
        cells = [r.kernel, _num(r.get("requests_pipe_lsu_mem_global_op_ld")), _num(r.per_request("ld")),
                 f"{_num(r.get('requests_pipe_lsu_mem_global_op_ldgsts'))} ({_num(r.per_request('ldgsts'))})",
                 _num(r.get("inst_executed_op_shared_st")),
                 f"{_num(r.get('data_pipe_lsu_wavefronts_mem_shared_op_st'))} "
                 f"({_num(r.get('excessive_wavefronts_mem_shared_op_st'))})",
                 f"{_num(lds)}, {_num(ldsm)}",
                 f"{_num(load_wavefronts)} ({_num(r.get('excessive_wavefronts_mem_shared_op_ld'))})",
                 _num(load_wavefronts / (lds + ldsm)) if lds + ldsm else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + conditions(record, _dtypes(record, {row["kernel"] for row in rows_tc}))


GRAD_VERSIONS = (1, 2, 3)  # dense_kernels::kGradVersions


def parse_kernel(text: str, versions: list[int] | range, dtype: str = "float32") -> tuple[int, str]:
    """"8:nt" -> (8, "nt"): a GEMM version and layout (one of `versions`, those counted in
    `dtype`); "tune4:nt" -> (104, "nt"): autotuning candidate 4 (float32 only); "grad:3" ->
    (3, "grad"): the backward's elementwise kernel (M×N is then its rows × columns; K is unused)."""
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
        counted = ", ".join(map(str, versions))
        hopper = hopper_versions()
        if v in hopper:
            raise ValueError(f"version {v} is one of Hopper's ({hopper[0]} to {hopper[-1]}), which the counters leave "
                             f"out: wgmma and TMA read memory where no instrumentation sees it; in {dtype} they "
                             f"count {counted}")
        if v in catalog().version_ids():
            raise ValueError(f"version {v} is not built for {dtype}: in {dtype} the counters run {counted} "
                             "(cuda/dense_kernels.h)")
        raise ValueError(f"no version {v}: in {dtype} the counters run {counted} (cuda/dense_kernels.h)")
    return v, match.group(2)


def default_kernels(dtype: str) -> list[tuple[int, str]]:
    """float32 and float64: every version's forward of chapter 3's progression, v1's and v2's GEMM
    of the gradient of x (ncu's record has them), and the backward's elementwise kernel in each of
    its versions (at M×N, the forward's output). bfloat16 and float16: the forward of each
    tensor-core version built for the type."""
    if DTYPES[dtype] > 2:
        return [(v, "nt") for v in catalog().cuda_core_versions()] + [(1, "nn"), (2, "nn")] + \
            [(v, "grad") for v in GRAD_VERSIONS]
    return [(v, "nt") for v in versions(dtype) if v not in catalog().cuda_core_versions()]


def memory_bytes(kernels: list[tuple[int, str]], m: int, n: int, k: int, dtype: str, sm_count: int,
                 lib: ctypes.CDLL | None = None) -> int:
    """The most memory one of `kernels` holds while it is counted (they run one at a time): its
    operands, output and bias, and the workspace its launch asks for (split-K's partial products,
    as many as it has slices; the backward's partial column sums), in the accumulator's type.
    Without `lib` the workspaces are left out: a lower bound, known before the build."""
    element_bytes, acc_bytes = DTYPES[dtype], 8 if dtype == "float64" else 4
    most = 0
    for v, layout in kernels:
        if layout == "grad":  # grad and y in, dz and db out (count_sigmoid_grad)
            elements = 3 * m * n + n
            work = lib.emu_sigmoid_grad_workspace(v, m, n, sm_count) if lib else 0
        else:
            elements = m * k + n * k + m * n + (n if layout == "nt" else 0)
            work = lib.emu_gemm_workspace(v, DTYPE_CODES[dtype], m, n, k, sm_count) if lib else 0
        most = max(most, element_bytes * elements + acc_bytes * max(work, 0))
    return most


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    size = cli.positive(int)
    parser.add_argument("--shape", type=size, nargs=3, metavar=("M", "N", "K"), action="append",
                        help="C is M×N, the reduction K; given again, one more shape, every kernel counted at "
                             "each (default 2048 2048 2048, ncu's record)")
    parser.add_argument("--kernels", nargs="+", metavar="V:LAYOUT",
                        help="e.g. 5:nt 7:nt 2:nn grad:3, counted in each --dtype (default: float32 and float64 "
                             "every version's nt of chapter 3, 1:nn 2:nn, and grad:1 grad:2 grad:3; bfloat16 and "
                             "float16 the nt of each tensor-core version built for them)")
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["float32"], metavar="DTYPE",
                        help=f"element types, one or more of {', '.join(DTYPES)}, counted one after the other "
                             "(default float32)")
    parser.add_argument("--sm-count", type=size, default=132,
                        help="the SMs of the device assumed (v9's and v12's slices of K, the backward's v3)")
    parser.add_argument("--full", action="store_true", help="run every block instead of a sample")
    parser.add_argument("--planted", action="store_true", help="count the nine planted patterns instead")
    parser.add_argument("--compare", metavar="PATH",
                        help="an ncu record to set beside (default: the newest docs/results/ncu_gemm_{card}.json; "
                             "'none' for none)")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as a record")
    args = parser.parse_args(argv)

    dtypes = list(dict.fromkeys(args.dtype))  # (each once, in the order given)
    kernels: list[tuple[str, int, str]] = []  # (type, version, layout)
    try:
        for dtype in dtypes:
            counted = versions(dtype)
            kernels += [(dtype, *parse_kernel(t, counted, dtype)) for t in args.kernels] if args.kernels else \
                [(dtype, *vl) for vl in default_kernels(dtype)]
    except ValueError as e:
        raise cli.UserError(str(e)) from None
    if any(v >= TUNE_BASE and dtype != "float32" for dtype, v, _ in kernels):
        raise cli.UserError("the autotuning candidates are float32 only (--dtype float32)")
    out = cli.check_output(args.json, "--json")
    compare = None
    if args.compare is None:
        args.compare = str(ncu_record() or "none")
    if args.compare != "none":
        cli.read_record(args.compare, "--compare", keys=("kernels", "shape"))  # one line if it is unusable
        compare = os.path.relpath(Path(args.compare).resolve(), ROOT)
    # (each once, in the order given; argparse's append leaves None where --shape is not given)
    shapes = list(dict.fromkeys(tuple(shape) for shape in args.shape or [(2048, 2048, 2048)]))

    def check_memory(lib: ctypes.CDLL | None) -> None:
        """Each shape's kernels run one at a time: the most any one of them holds must fit."""
        for m, n, k in shapes:
            most = max(memory_bytes([(v, layout) for t, v, layout in kernels if t == dtype], m, n, k, dtype,
                                    args.sm_count, lib) for dtype in dtypes)
            cli.check_memory(most, what=f"M={m} N={n} K={k}")

    if not args.planted:  # (without the workspaces first: too large a shape is refused before the build)
        check_memory(None)
    if not built() and unavailable_reason():
        raise cli.UserError(f"cannot count: the instrumented build {unavailable_reason()}")
    try:
        lib = library()
    except RuntimeError as e:
        raise cli.UserError(str(e).splitlines()[0]) from None

    if args.planted:
        print("| pattern | requests (loads, stores, LDGSTS, LDSM) | sectors / request (loads, LDGSTS) | "
              "shared requests (loads, stores) | shared wavefronts (loads with LDSM's, stores, LDGSTS) | excessive |")
        print("|---|---:|---:|---:|---:|---:|")
        for which in PLANTED:
            c = count_planted(which)

            def each(fmt: str, kinds: tuple[str, ...] = ("ld", "st", "ldgsts"), c: Counts = c) -> str:
                return ", ".join(_num(c.get(fmt.format(kind))) for kind in kinds)

            # (every pattern also stores one coalesced value per lane: its request has 4 sectors)
            print(f"| {which} | {each('requests_pipe_lsu_mem_global_op_{}')}, {_num(c.get('inst_executed_op_ldsm'))} | "
                  f"{_num(c.per_request('ld'))}, {_num(c.per_request('ldgsts'))} | "
                  f"{each('inst_executed_op_shared_{}', ('ld', 'st'))} | "
                  f"{each('data_pipe_lsu_wavefronts_mem_shared_op_{}')} | "
                  f"{each('excessive_wavefronts_mem_shared_op_{}')} |")
        return 0
    check_memory(lib)

    rows_counted: list[tuple[tuple[int, int, int], str, Counts]] = []
    seconds: list[float] = []
    for m, n, k in shapes:
        start = time.perf_counter()
        for dtype, v, layout in kernels:
            if layout == "grad":
                counted = count_sigmoid_grad(v, m, n, dtype, args.sm_count, sample=not args.full)
            else:
                counted = count_gemm(v, layout, m, n, k, dtype, args.sm_count, sample=not args.full)
            rows_counted += [((m, n, k), dtype, c) for c in counted]
        seconds.append(time.perf_counter() - start)
    import record_info

    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    record = {
        "source": "python cuda/counters.py (the CPU emulation, instrumented)",
        "compiler": version,
        "torch": __import__("torch").__version__,
        **record_info.provenance(),
        "shapes": [{"shape": list(shape), "seconds": round(s, 1)} for shape, s in zip(shapes, seconds)],
        "dtypes": dtypes,
        "sm_count": args.sm_count,
        "sample": not args.full,
        "metrics": list(METRICS),
        "kernels": [{"kernel": c.kernel, "dtype": dtype, "shape": list(shape), "metrics": c.metrics}
                    for shape, dtype, c in rows_counted],
        "compare": compare,  # the ncu record the tables set beside these counts
    }
    return cli.publish(render(record), [(out, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
