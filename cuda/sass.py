"""What the compiler made, read: ptxas's resource lines and the SASS (``cuobjdump -sass``), for
cuda/static_report.py, ptx/sass_report.py and tiles/compiler_report.py.

The SASS is parsed into functions of instructions; a function's loops are found from its backward
branches, and the innermost loop that multiplies is summed up: the multiplies (FFMA/DFMA, or the
tensor cores' HMMA/HGMMA), shared loads (LDS, ldmatrix's LDSM), global loads (LDG) and cp.async
(LDGSTS) by width, and a census of the tensor-core and cp.async instructions. The tools come from
the CUDA toolkit or the package index (requirements-cuda.txt), found by cli.cuda_tool; no GPU is
needed.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cli

PIP_SASS = cli.CUDA_TOOLS_PIP
find_tool = cli.cuda_tool  # nvcc, ptxas, cuobjdump, nvdisasm: PATH, $CUDA_HOME, pip's wheels, /usr/local/cuda


def sass_tools() -> tuple[str | None, str]:
    """cuobjdump for -sass (it needs nvdisasm too), or None and the reason."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        missing = [n for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if p is None]
        return None, (f"the SASS needs {' and '.join(missing)}, not found: install the CUDA toolkit, "
                      f"or {PIP_SASS}")
    return cuobjdump, ""


def tool_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V[\d.]+", out)
    return m.group(0) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"




def disassemble(cubin: Path, cuobjdump: str) -> str:
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm:  # cuobjdump looks for nvdisasm on PATH or in NVDISASM_PATH
        env["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
        env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
    result = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"cuobjdump -sass failed:\n{result.stderr[-3000:]}")
    return result.stdout


def function_text(sass: str, name: str) -> str | None:
    """One function's part of cuobjdump -sass output (its header to the next function's), or None."""
    lines, inside = [], False
    for line in sass.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            if inside:
                break
            inside = m.group(1) == name
        if inside:
            lines.append(line)
    return "\n".join(lines) if lines else None


# ---------------------------------------------------------------------------------------
# ptxas -v and PTX
# ---------------------------------------------------------------------------------------
def parse_ptxas(output: str) -> dict[str, dict]:
    """ptxas -v output -> {entry: registers, barriers, shared_bytes, spill stores/loads, stack}."""
    info: dict[str, dict] = {}
    entry = props_for = None
    for line in output.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            entry = m.group(1)
            info[entry] = {"registers": 0, "barriers": 0, "shared_bytes": 0, "spill_stores": 0, "spill_loads": 0,
                           "stack_bytes": 0}
        elif m := re.search(r"Function properties for (\w+)", line):
            props_for = m.group(1)
        elif props_for and "spill stores" in line:
            if props_for in info:
                nums = [int(x) for x in re.findall(r"(\d+) bytes", line)]
                info[props_for].update(stack_bytes=nums[0], spill_stores=nums[1], spill_loads=nums[2])
            props_for = None
        elif entry and (m := re.search(r"Used (\d+) registers", line)):
            rec = info[entry]
            rec["registers"] = int(m.group(1))
            if b := re.search(r"used (\d+) barriers", line):
                rec["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                rec["shared_bytes"] = int(s.group(1))
    return info


def launch_bounds(ptx: str) -> dict[str, int]:
    """Each entry's .maxntid (its __launch_bounds__), as a thread count."""
    bounds = {}
    for m in re.finditer(r"\.entry (\w+)\((?:.*?)\)\s*((?:\.\w+[^\n{]*\n\s*)*)\{", ptx, re.S):
        if nt := re.search(r"\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)", m.group(2)):
            bounds[m.group(1)] = math.prod(int(x) for x in nt.groups())
    return bounds


# ---------------------------------------------------------------------------------------
# SASS: functions, loops, the instruction mix
# ---------------------------------------------------------------------------------------
@dataclass
class Instr:
    addr: int
    pred: str
    op: str
    args: str


# An opcode may hold lower-case letters: wgmma's HGMMA.64x128x16.F32.BF16.
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][\w.]*)\s*([^;]*);")


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass output -> {function name: its instructions in address order}."""
    functions: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in text.splitlines():
        if m := re.match(r"\s*Function : (\S+)", line):
            current = functions.setdefault(m.group(1), [])
        elif current is not None and (m := LINE.search(line)):
            current.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return functions


def branch_target(ins: Instr) -> int | None:
    if not ins.op.startswith("BRA"):
        return None
    m = re.findall(r"0x([0-9a-f]+)", ins.args)
    return int(m[-1], 16) if m else None


def loops(code: list[Instr]) -> list[tuple[int, int]]:
    """Every backward branch makes a loop: [its target, the branch]."""
    return sorted({(t, i.addr) for i in code if (t := branch_target(i)) is not None and t <= i.addr})


def call_targets(code: list[Instr]) -> set[int]:
    """The addresses a kernel CALLs (subroutines ptxas placed after the kernel's own code)."""
    return {int(re.findall(r"0x([0-9a-f]+)", i.args)[-1], 16) for i in code
            if i.op.startswith("CALL") and re.search(r"0x[0-9a-f]+", i.args)}


def callee_addresses(code: list[Instr], targets: set[int] | None = None) -> set[int]:
    """The addresses of the code a kernel reaches by CALL: each callee spans its target to the
    first RET after it."""
    inside = set()
    for t in sorted(call_targets(code) if targets is None else targets):
        for i in code:
            if i.addr >= t:
                inside.add(i.addr)
                if i.op.startswith("RET"):
                    break
    return inside


def calls(code: list[Instr]) -> dict:
    """How many subroutines a kernel calls, and where its MUFU.EX2 (the sigmoid's exponential)
    is: in the kernel's own code (the sigmoid is inlined) or in a subroutine (a call per output).
    A subroutine spans its entry to the first RET after it."""
    targets = call_targets(code)
    inside = callee_addresses(code, targets)
    ex2 = [i for i in code if i.op.startswith("MUFU.EX2")]
    return {"targets": len(targets), "mufu_ex2_inline": sum(i.addr not in inside for i in ex2),
            "mufu_ex2_in_callees": sum(i.addr in inside for i in ex2)}


def is_fma(op: str) -> bool:
    """A float32/float64 multiply-add. Not HFMA2: the kernels do no half-precision maths, and
    ptxas uses `HFMA2.MMA Rn, -RZ, RZ, 0, 0` to zero a register (it would count as an FMA)."""
    return op.split(".")[0] in ("FFMA", "DFMA", "FFMA2")


def width(op: str) -> str:
    """Access width in bits from a memory opcode's modifiers (LDS.128 -> 128, LDG.E -> 32)."""
    mods = op.split(".")[1:]
    for w in ("128", "64", "U16", "S16", "U8", "S8"):
        if w in mods:
            return {"U16": "16", "S16": "16", "U8": "8", "S8": "8"}.get(w, w)
    return "32"


def never_runs(ins: Instr) -> bool:
    """Predicated on !PT (never true): ptxas pads before each cp.async with `@!PT LDS RZ, [RZ]`,
    which no thread executes; counting them would add shared loads that never happen."""
    return ins.pred == "@!PT"


def mix(code: list[Instr]) -> dict:
    """Counts that tell the story of a GEMM loop: multiply-adds, and loads by kind and width,
    of the instructions that can run. (Instructions: all but the NOPs that pad a function to
    its alignment.)"""
    out: dict = {"instructions": sum(1 for i in code if i.op != "NOP"), "fma": 0,
                 "lds": {}, "ldg": {}, "ldgsts": {}, "sts": {}, "stg": {}, "bar": 0, "shfl": 0, "mufu": {}}
    for i in code:
        if never_runs(i):
            continue
        base = i.op.split(".")[0]
        if is_fma(i.op):
            out["fma"] += 1
        elif base in ("LDS", "LDG", "LDGSTS", "STS", "STG"):
            bucket = out[base.lower()]
            bucket[width(i.op)] = bucket.get(width(i.op), 0) + 1
        elif base == "BAR":
            out["bar"] += 1
        elif base == "SHFL":
            out["shfl"] += 1
        elif base == "MUFU":
            out["mufu"][i.op] = out["mufu"].get(i.op, 0) + 1
    lds = sum(out["lds"].values())
    out["fma_per_lds"] = out["fma"] / lds if lds else None
    return out


def is_mma(op: str) -> bool:
    """A tensor-core mma: mma.sync's HMMA.16816.F32.BF16 (bfloat16), HMMA.16816.F32 (float16),
    HMMA.1688.F32.TF32 (tf32), or wgmma's HGMMA (sm_90a). Not HFMA2.MMA, which is a
    half-precision FMA (see is_fma)."""
    return op.split(".")[0] in ("HMMA", "HGMMA")


# The opcodes a census names in full: the tensor cores' mma's, ldmatrix (LDSM.16.M88.4; .MT88 with
# .trans), cp.async (LDGSTS) with its commit (LDGDEPBAR) and wait (DEPBAR); on sm_90a wgmma's
# HGMMA with its WARPGROUP fences, and TMA's UTMALDG.
CENSUS = ("HMMA", "HGMMA", "LDSM", "LDGSTS", "LDGDEPBAR", "DEPBAR", "WARPGROUP", "UTMALDG")


def census(code: list[Instr]) -> dict[str, int]:
    """The tensor-core and cp.async instructions by full opcode, with their counts (static)."""
    out: dict[str, int] = {}
    for i in code:
        if i.op.split(".")[0] in CENSUS and not never_runs(i):
            out[i.op] = out.get(i.op, 0) + 1
    return dict(sorted(out.items()))


def inner_loop(code: list[Instr]) -> dict | None:
    """The innermost loop that multiplies, and its instruction mix.

    Method: each backward branch (a BRA to a lower address) closes a loop spanning its target
    to itself. Keep the loops that contain FFMA/DFMA or HMMA; drop those that contain another
    such loop; of the rest take the one with the most of them (v1's unrolled main loop rather
    than its remainder). Counts are static: each instruction in the address range once, nested
    loops (e.g. a tile-loading loop inside the k loop) included once. Besides mix(): `mma`, the
    HMMA count, `ldsm`, the ldmatrix count, and `census`, those and cp.async's by full opcode.
    """
    def multiplies(op: str) -> bool:
        return is_fma(op) or is_mma(op)

    spans = []
    for start, end in loops(code):
        body = [i for i in code if start <= i.addr <= end]
        if any(multiplies(i.op) for i in body):
            spans.append((start, end, body))
    inner = [s for s in spans if not any(o is not s and s[0] <= o[0] and o[1] <= s[1] and (o[0], o[1]) != (s[0], s[1])
                                         for o in spans)]
    if not inner:
        return None
    start, end, body = max(inner, key=lambda s: (sum(multiplies(i.op) for i in s[2]), -(s[1] - s[0])))
    nested = sum(1 for a, b in loops(code) if start <= a and b <= end and (a, b) != (start, end))
    return {"start": f"{start:#06x}", "end": f"{end:#06x}", "nested_loops": nested, **mix(body),
            "mma": sum(is_mma(i.op) for i in body), "ldsm": sum(i.op.startswith("LDSM") for i in body),
            "census": census(body)}
