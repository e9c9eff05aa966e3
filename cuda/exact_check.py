"""Every GEMM entry on the GPU against the CPU emulation's bits, one version to a process.

The entries are those cuda/dense_kernels.h lists (cuda/catalog.py): each version (0, the automatic
choice, included) in each element type it is built for, and each autotuning candidate (float32),
in layouts nt, nn and tn, at the small odd shapes of EXACT_SHAPES (the TMA versions, whose rows
must be whole 16 bytes, at those whose every dimension is a multiple of 8, or 4 in float32), no
epilogue. The inputs are small integers, -2 to 2, made by a formula of integer arithmetic (not a
random generator, whose stream may change between torch versions), so every product and every
partial sum is exact and any order of summation gives the same bits: any difference is a bug.

  expect  on the CPU, before a lease: run every entry through the emulation (cuda/emulated.py),
          check each result against the exact product rounded once to its type, and write the
          hash of each result's bits (EXPECTED, committed): the lease carries the file, so on the
          GPU a process only launches and compares.
  one     on the GPU: every entry of one version (or candidate), launched by its number through
          the cuda stage's library (dense_gemm_launch), each result hashed and compared with
          EXPECTED. The last line is RESULT {json}: SAME, DIFF (which entry, where, the two values),
          FAULT (the launch's or the synchronisation's CUDA error; a sticky error ends the
          process's use of the GPU, so the version stops there). Exit status 0, 1 or 3.
  check   on the CPU: the committed file against the emulation as it is now (every entry, or
          --version's), and the entries against the catalogue (one missing is a difference).

cuda/isolated.py runs `one` for each version in a process of its own under a limit of its own, so
that a fault or a hang costs that version alone.

Examples:
  python cuda/exact_check.py expect                   # CPU: write cuda/exact_expected.json
  python cuda/exact_check.py check --version 33       # CPU: the file still holds the emulation's bits
  python cuda/exact_check.py one --version 33         # GPU: v33's entries against the file
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

# isort: split
import hashlib  # noqa: E402
import json  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

catalog = cli.load_file("cuda/catalog.py")

EXPECTED = ROOT / "cuda" / "exact_expected.json"
# M, N, K. Odd, a single row, K longer than a tile; then shapes whose every dimension is a multiple
# of 8, the only ones the TMA versions take (their rows are whole 16 bytes), which still leave
# partial tiles: 72×40 against tiles of 64 rows and 128 or 256 columns, K in 3 steps of 64, the
# last one partial; a batch of 8 with K under one step; K = 264, 5 steps through the 4-stage rings.
EXACT_SHAPES = ((33, 17, 65), (1, 129, 31), (67, 45, 257), (72, 40, 136), (8, 136, 40), (40, 24, 264))
LAYOUTS = ("nt", "nn", "tn")
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}
CODE_OF = {name: code for code, name in enumerate(catalog.DTYPES)}  # dense_kernels::DType
SAME, DIFF, FAULT = 0, 1, 3  # exit statuses of `one`
DIGITS = 16  # hex digits of each result's hash kept in EXPECTED: 64 bits


def exact_entries() -> list[tuple[str, int, str]]:
    """(label, version as launch_gemm takes it, element type) for every GEMM entry the header
    lists: each version (0 included) in each of its types, and each candidate (float32 only)."""
    entries = [(f"v{v.id}", v.id, t) for v in catalog.versions() for t in v.dtypes]
    entries += [(f"candidate {c.index}", c.version, "f32") for c in catalog.candidates()]
    return entries


def operands(layout: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of A and B for C[m×n] = op(A)·op(B) in layout nt, nn or tn (cuda/dense_kernels.h)."""
    return {"nt": ((m, k), (n, k)), "nn": ((m, k), (k, n)), "tn": ((k, m), (k, n))}[layout]


def integer_operands(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Integers -2 to 2 from a hash of each element's index and `seed`, in integer arithmetic (the
    same on any machine and torch). Every product and every partial sum of up to 2^20 of them is
    an integer float32 holds exactly, so any order of summation gives the same bits; bfloat16 and
    float16 hold the inputs exactly (their one rounding is at the store, to nearest even on both);
    TF32 holds them too, so cvt.rna.tf32 leaves them as they are and split-TF32's small parts are 0."""
    i = torch.arange(shape[0] * shape[1], dtype=torch.int64)
    h = (i * 2654435761 + (seed % 2**31) * 40503 + 12345) % 2**32
    h = ((h ^ (h >> 15)) * 1274126177) % 2**32  # < 2^63: no overflow
    return ((h >> 11) % 5 - 2).to(torch.float32).view(shape)


def entry_key(label: str, dtype: str, layout: str, shape: tuple[int, int, int]) -> str:
    return f"{label} {dtype} {layout} M={shape[0]} N={shape[1]} K={shape[2]}"


def entry_inputs(key: str, layout: str, shape: tuple[int, int, int], dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B of one entry, seeded by its key (CRC-32: stable across processes and machines)."""
    sa, sb = operands(layout, *shape)
    a = integer_operands(sa, zlib.crc32(f"{key} A".encode()))
    b = integer_operands(sb, zlib.crc32(f"{key} B".encode()))
    return a.to(TORCH_DTYPES[dtype]), b.to(TORCH_DTYPES[dtype])


def exact_product(layout: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(A)·op(B) in float64 (exact for these integers), rounded once to the inputs' type."""
    a64, b64 = a.double(), b.double()
    a64 = a64.t() if layout == "tn" else a64
    b64 = b64.t() if layout == "nt" else b64
    return (a64 @ b64).to(a.dtype)


def digest(c: torch.Tensor) -> str:
    """The hash of a result's bits (row-major, the machine's byte order: little-endian on both)."""
    return hashlib.sha256(c.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:DIGITS]


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None if the two are the same bits, else where they first differ and the two values."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype} {tuple(got.shape)} against the expected {want.dtype} {tuple(want.shape)}"
    a, b = got.contiguous().view(-1), want.contiguous().view(-1)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = a.view(bits) == b.view(bits)
    if bool(same.all()):
        return None
    i = int((~same).nonzero()[0])
    n = got.shape[1]
    return (f"first at [{i // n}, {i % n}]: {float(a[i])!r} against the expected {float(b[i])!r} "
            f"({int((~same).sum())} of {same.numel()} elements differ)")


def row_multiples() -> Callable[[int, torch.dtype], int]:
    """emulated.row_multiple (what every dimension must be a multiple of for a version: a TMA
    version's rows are whole 16 bytes), from the emulation's own launcher."""
    return cli.load_file("cuda/emulated.py").row_multiple


def exact_shapes(version: int, dtype: str, row_multiple: Callable[[int, torch.dtype], int]) -> list[tuple]:
    """The shapes of EXACT_SHAPES that `version` takes in `dtype`."""
    r = row_multiple(version, TORCH_DTYPES[dtype])
    return [s for s in EXACT_SHAPES if all(d % r == 0 for d in s)]


def plan(row_multiple: Callable[[int, torch.dtype], int] | None = None) -> list[dict]:
    """Every comparison: {"key", "label", "version", "dtype", "layout", "shape"}, entries in the
    catalogue's order. An entry that takes none of the shapes is an error: it would go unchecked."""
    row_multiple = row_multiple or row_multiples()
    out = []
    for label, version, dtype in exact_entries():
        shapes = exact_shapes(version, dtype, row_multiple)
        if not shapes:
            raise cli.UserError(f"{label} {dtype}: none of {EXACT_SHAPES} is a multiple of "
                                f"{row_multiple(version, TORCH_DTYPES[dtype])} in every dimension, as it needs")
        out += [{"key": entry_key(label, dtype, layout, s), "label": label, "version": version, "dtype": dtype,
                 "layout": layout, "shape": list(s)} for layout in LAYOUTS for s in shapes]
    return out


# ---------------------------------------------------------------------------------------
# The CPU side: the emulation's bits, written before the lease
# ---------------------------------------------------------------------------------------
def emulation_gemm(sm_count: int) -> Callable:
    """C = op(A)·op(B) through the CPU emulation (cuda/emulated.py), with the GPU's SM count, so
    that version 0 and split-K choose as they do on the GPU."""
    emulated = cli.load_file("cuda/emulated.py")
    lib = emulated.library()

    def run(version: int, layout: str, a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> torch.Tensor:
        c = torch.full((m, n), float("nan"), dtype=a.dtype)
        emulated.gemm(version, layout, a.contiguous(), b.contiguous(), c, None, m, n, k, emulated.KPLAIN, sm_count,
                      lib)
        return c
    return run


def expect(gemm: Callable, entries: list[dict], say: Callable[[str], None] = print) -> dict[str, str]:
    """{key: digest} of each entry's result through `gemm`, each checked first against the exact
    product rounded once: where they differ, the emulation (or the reasoning above) is wrong, and
    no expected bits are written for it."""
    out, wrong = {}, []
    for e in entries:
        a, b = entry_inputs(e["key"], e["layout"], tuple(e["shape"]), e["dtype"])
        c = gemm(e["version"], e["layout"], a, b, *e["shape"])
        diff = first_difference(c, exact_product(e["layout"], a, b))
        if diff:
            wrong.append(f"{e['key']}: {diff}")
        out[e["key"]] = digest(c)
    if wrong:
        raise cli.UserError("the emulation's result is not the exact product: " + "; ".join(wrong[:3])
                            + (f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""))
    say(f"{len(out)} results, each the exact product rounded once to its type")
    return out


# The SM count the expected bits are made with: the lent cards' (H100 SXM, H200), where version 0
# and split-K choose by it. The GPU side compares only where its own count is this.
SM_COUNT = 132


def write_expected(path: Path, sm_count: int = SM_COUNT) -> dict:
    entries = plan()
    record = {"command": f"python cuda/exact_check.py expect --sm-count {sm_count}", "sm_count": sm_count,
              "shapes": [list(s) for s in EXACT_SHAPES], "inputs": "integer_operands, seeded by CRC-32 of the key",
              "digest": f"sha256 of the result's bytes, first {DIGITS} hex digits",
              "expected": expect(emulation_gemm(sm_count), entries)}
    path.write_text(json.dumps(record, indent=0, sort_keys=False) + "\n")
    return record


def read_expected(path: Path | None = None) -> dict:
    return cli.read_record(str(path or EXPECTED), "--expected", keys=("expected", "sm_count"))


# ---------------------------------------------------------------------------------------
# The GPU side: one version's entries, launched and compared
# ---------------------------------------------------------------------------------------
def library():
    """The cuda stage's loaded library (the same copy, context and streams as the stage), with
    its exported C entry points typed: dense_tune_*, dense_gemm_launch, dense_gemm_workspace."""
    import ctypes

    import modes

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


class Fault(RuntimeError):
    """A CUDA error: the launch's return code, or one the synchronisation raised (sticky ones end
    the process's use of the GPU)."""


def gpu_gemm(lib=None, sm_count: int | None = None) -> Callable:
    """C = op(A)·op(B) by the cuda stage's entry (dense_gemm_launch), by the version's number, on
    the GPU, then to the CPU. The workspace is the largest any version asks for at the shape:
    version 0 resolves its choice inside the launch (by the operands' alignment too), so no
    single version's size can be trusted to be the one it runs."""
    lib = lib or library()
    sms = sm_count or torch.cuda.get_device_properties(0).multi_processor_count
    ids = sorted({v for _, v, _ in exact_entries()})

    def run(version: int, layout: str, a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> torch.Tensor:
        code = CODE_OF[next(name for name, t in TORCH_DTYPES.items() if t == a.dtype)]
        a, b = a.cuda(), b.cuda()
        c = torch.full((m, n), float("nan"), dtype=a.dtype, device="cuda")  # any element not written shows
        size = max(lib.dense_gemm_workspace(v, code, m, n, k, sms) for v in ids if v == version or version == 0)
        work = torch.empty(max(size, 1), dtype=torch.float64 if a.dtype == torch.float64 else torch.float32,
                           device="cuda")
        rc = lib.dense_gemm_launch(version, layout.encode(), code, a.data_ptr(), b.data_ptr(), c.data_ptr(), None,
                                   m, n, k, 0, sms, work.data_ptr(), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise Fault(f"the launch returned cudaError {rc}")
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:  # an error of the kernel itself (illegal address, trap): sticky
            raise Fault(_first_line(e)) from e
        return c.cpu()
    return run


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def compare(entries: list[dict], expected: dict[str, str], gemm: Callable,
            say: Callable[[str], None] = print) -> dict:
    """Each entry through `gemm` against its expected digest, in order, stopping at the first
    fault (after a sticky error nothing more on the GPU can be trusted in this process).
    {"status": SAME/DIFF/FAULT, "compared", "differences": [...], "fault": where and the error}."""
    out: dict = {"status": "SAME", "compared": 0, "differences": [], "missing": []}
    for e in entries:
        want = expected.get(e["key"])
        if want is None:  # an entry the file does not hold: the file predates it
            out["missing"].append(e["key"])
            continue
        a, b = entry_inputs(e["key"], e["layout"], tuple(e["shape"]), e["dtype"])
        try:
            got = gemm(e["version"], e["layout"], a, b, *e["shape"])
        except Fault as f:
            out.update({"status": "FAULT", "fault": f"{e['key']}: {f}"})
            say(f"FAULT {e['key']}: {f}")
            return out
        out["compared"] += 1
        if digest(got) != want:
            why = first_difference(got, exact_product(e["layout"], a, b)) or "the bits differ from the file's"
            out["differences"].append(f"{e['key']}: {why}")
            say(f"DIFF  {e['key']}: {why}")
    if out["differences"] or out["missing"]:
        out["status"] = "DIFF"
    for key in out["missing"]:
        say(f"DIFF  {key}: not in {EXPECTED.name} (python cuda/exact_check.py expect writes it anew)")
    if out["status"] == "SAME":
        say(f"SAME  {out['compared']} entries, bit for bit")
    return out


def from_keys(keys: list[str]) -> list[dict]:
    """The comparisons a file of expected bits holds, read back from its keys (entry_key): the GPU
    side needs neither the emulation nor its row multiples to know what to launch."""
    launch = {f"v{v}": v for v in catalog.version_ids()} | {"v0": 0}
    launch |= {f"candidate {c.index}": c.version for c in catalog.candidates()}
    out = []
    for key in keys:
        *label, dtype, layout, m, n, k = key.split(" ")
        name = " ".join(label)
        if name not in launch:
            raise cli.UserError(f"{EXPECTED.name}: {key!r} names no version or candidate of the catalogue: "
                                "python cuda/exact_check.py expect writes the file anew")
        shape = [int(x.split("=")[1]) for x in (m, n, k)]
        out.append({"key": key, "label": name, "version": launch[name], "dtype": dtype, "layout": layout,
                    "shape": shape})
    return out


def entries_of(unit: str, entries: list[dict]) -> list[dict]:
    """The entries of one unit: "v33" (a version, every type), "candidate 3"."""
    chosen = [e for e in entries if e["label"] == unit]
    if not chosen:
        raise cli.UserError(f"no GEMM version or candidate {unit!r} in cuda/dense_kernels.h "
                            f"(units: {', '.join(units())})")
    return chosen


def units() -> list[str]:
    """The processes of an isolated run, one a version or candidate, in the catalogue's order."""
    return list(dict.fromkeys(label for label, _, _ in exact_entries()))


def unit_name(text: str) -> str:
    """--version 33 -> "v33"; --version candidate3 or "candidate 3" -> "candidate 3"."""
    text = text.strip()
    if text.isdigit():
        return f"v{int(text)}"
    if text.replace(" ", "").startswith("candidate"):
        return f"candidate {int(text.replace(' ', '').removeprefix('candidate'))}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("action", choices=("expect", "one", "check"))
    parser.add_argument("--version", metavar="N", help="one/check: a version's number (33) or candidateN")
    parser.add_argument("--expected", metavar="PATH", help=f"the expected bits (default {EXPECTED.relative_to(ROOT)})")
    parser.add_argument("--sm-count", type=cli.positive(int), default=SM_COUNT,
                        help=f"expect: the SM count version 0 and split-K choose by (default {SM_COUNT}, the H100's "
                             "and H200's)")
    args = parser.parse_args(argv)
    path = Path(args.expected) if args.expected else EXPECTED
    if args.action == "expect":
        record = write_expected(path, args.sm_count)
        print(f"wrote {len(record['expected'])} expected results to {path}")
        return 0
    expected = read_expected(path)
    if args.action == "check":  # the catalogue's entries as they are now: one the file lacks is a difference
        entries = plan()
        if args.version:
            entries = entries_of(unit_name(args.version), entries)
        result = compare(entries, expected["expected"], emulation_gemm(expected["sm_count"]))
        extra = sorted(set(expected["expected"]) - {e["key"] for e in plan()})
        if extra and not args.version:
            print(f"DIFF  {len(extra)} entries of {path.name} are in no version of the catalogue: {extra[:3]}")
            result["status"] = "DIFF"
        return 0 if result["status"] == "SAME" else 1
    entries = from_keys(list(expected["expected"]))  # on the GPU: what the file holds, no emulation
    if args.version:
        entries = entries_of(unit_name(args.version), entries)
    if not args.version:
        parser.error("one takes --version")
    if not torch.cuda.is_available():
        raise cli.UserError("no GPU here: `one` launches on the GPU (check compares with the emulation on the CPU)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms != expected["sm_count"]:
        raise cli.UserError(f"{path.name} holds bits made for {expected['sm_count']} SMs (version 0 and split-K "
                            f"choose by it), this GPU has {sms}: python cuda/exact_check.py expect --sm-count {sms}")
    result = compare(entries, expected["expected"], gpu_gemm(sm_count=sms))
    print("RESULT " + json.dumps({"unit": unit_name(args.version), **result}), flush=True)
    return {"SAME": SAME, "DIFF": DIFF, "FAULT": FAULT}[result["status"]]


if __name__ == "__main__":
    cli.run(main)
