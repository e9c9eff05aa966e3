"""What Triton's compiler made of the stage's kernels for sm_90 (H100/H200), without a GPU.

Compiles tiles/kernels.py with triton.compile for GPUTarget("cuda", 90, 32), specialised as
Triton's JIT specialises them for contiguous float tensors at M = N = K = 4096 (16-byte aligned
pointers, sizes that are multiples of 16, unit strides folded into constants). For each kernel:
registers and spills from Triton's own ptxas (-v), the shared memory Triton allocates, the
occupancy these allow (cuda/static_report.py's rules), and from the SASS the instruction mix of
the main loop: multiply-adds (FFMA/DFMA) or tensor-core instructions (HMMA/HGMMA/DMMA), shared
loads (LDS), global loads (LDG) and cp.async copies (LDGSTS), by width. The same columns as
cuda/static_report.py's table, so the table puts the hand-written GEMMs of chapter 3 beside them.
The kernels are compiled in float32 and float64, and in bfloat16 as the stage launches them on a
GPU (INTERPRETED=False); for those a second table names what their tl.dot became: the dot's
operand and accumulator types in the TTGIR, the tensor-core instructions in the PTX and in the
main loop's SASS, and the PTX's float32 → bfloat16 roundings.

The SASS needs cuobjdump and nvdisasm: Triton's wheel ships both (or CUDA toolkit / pip).

Examples:
  python tiles/compiler_report.py                     # print the table, write nothing
  python tiles/compiler_report.py --json /tmp/triton_static.json
  python tiles/compiler_report.py --keep /tmp/triton_asm   # also keep the PTX, TTGIR and SASS there
(The committed table in tiles/README.md is docs/results/triton_static_sm90.json rendered by
docs/render.py; the record holds the command that wrote it.)
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

ARCH = 90
SIZE = 4096  # M = N = K: what the JIT is told about the sizes (multiples of 16) and strides
COMPARE_WITH = "docs/results/cuda_static_sm90.json"  # chapter 3's record: its nt f32 rows join the table
HAND_WRITTEN = (3, 4, 5, 6, 7, 8)


sr = cli.load_file("cuda/static_report.py")  # occupancy, the devices
disasm = cli.load_file("cuda/sass.py")  # SASS parsing
tables = cli.load_file("cuda/static_tables.py")  # the table's cells


# ---------------------------------------------------------------------------------------
# What to compile: (label, kernel, dtype, tl.dot precision, launch configuration)
# ---------------------------------------------------------------------------------------
def variants(kernels) -> list[dict]:
    fwd, bwd = kernels.FORWARD_CONFIGS[0], kernels.BACKWARD_CONFIG
    f64 = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3}  # v5-v8's f64 tile
    return [
        {"label": "forward", "kernel": "forward_kernel", "dtype": "f32", "precision": "ieee", "config": fwd},
        {"label": "forward, TF32", "kernel": "forward_kernel", "dtype": "f32", "precision": "tf32", "config": fwd},
        {"label": "forward", "kernel": "forward_kernel", "dtype": "f64", "precision": "ieee", "config": f64},
        {"label": "grad x (dz W)", "kernel": "grad_x_kernel", "dtype": "f32", "precision": "ieee", "config": bwd},
        {"label": "grad W, b (dzᵀ x, Σ dz)", "kernel": "grad_w_kernel", "dtype": "f32", "precision": "ieee",
         "config": bwd},
        # bfloat16 tiles into a float32 accumulator, as the stage launches them on a GPU.
        {"label": "forward", "kernel": "forward_kernel", "dtype": "bf16", "precision": "ieee", "config": fwd},
        {"label": "grad x (dz W)", "kernel": "grad_x_kernel", "dtype": "bf16", "precision": "ieee", "config": bwd},
        {"label": "grad W, b (dzᵀ x, Σ dz)", "kernel": "grad_w_kernel", "dtype": "bf16", "precision": "ieee",
         "config": bwd},
    ]


DTYPES = {"f32": "float32", "f64": "float64", "bf16": "bfloat16"}  # the table's names, torch's


def _arguments(kernel: str, dtype: str, precision: str, config: dict):
    """Arguments as a launch at M = N = K = SIZE on contiguous tensors passes them. Pointers
    matter only by dtype and alignment, so small CPU tensors stand in for the big ones."""
    import torch

    t = torch.empty(16, 16, dtype=getattr(torch, DTYPES[dtype]))
    n = SIZE
    # INTERPRETED=False: the kernel a launch on the GPU compiles, bfloat16 dot included.
    common = {"PRECISION": precision, "INTERPRETED": False, **config}
    if kernel == "forward_kernel":  # x, W, b, y; M, N, K; strides of x, W, b, y
        return (t, t, t, t, n, n, n, n, 1, n, 1, 1, n, 1), {"HAS_BIAS": True, **common}
    if kernel == "grad_x_kernel":  # g, y, W, dx; M, N, K; strides of g, y, W, dx
        return (t, t, t, t, n, n, n, n, 1, n, 1, n, 1, n, 1), common
    # grad_w_kernel: g, y, x, dW, db; M, N, K; strides of g, y, x, dW
    return (t, t, t, t, t, n, n, n, n, 1, n, 1, n, 1, n, 1), {"DW": True, "DB": True, **common}


def compile_kernel(kernels, kernel: str, dtype: str, precision: str, config: dict):
    """triton.compile of one kernel for sm_90, specialised by Triton's own binder (the code
    its JIT runs at a launch), so the compile is the one a launch on the GPU would make."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = getattr(kernels, kernel)
    target = GPUTarget("cuda", ARCH, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args, kwargs = _arguments(kernel, dtype, precision, config)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _ptxas() -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(ARCH).path


def _sass_tools() -> tuple[str | None, str | None]:
    """cuobjdump and nvdisasm: the ones in Triton's wheel, else the toolkit's or pip's."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    found = []
    for name in ("cuobjdump", "nvdisasm"):
        p = bundled / name
        found.append(str(p) if p.is_file() and os.access(p, os.X_OK) else disasm.find_tool(name))
    return found[0], found[1]


def disassemble(cubin: Path, cuobjdump: str, nvdisasm: str) -> str:
    env = {**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent),
           "PATH": str(Path(nvdisasm).parent) + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"cuobjdump -sass failed:\n{result.stderr[-2000:]}")
    return result.stdout


# ---------------------------------------------------------------------------------------
# The SASS: cuda/static_report.py's parser and mix, plus the tensor-core instructions
# ---------------------------------------------------------------------------------------
MMA = ("HMMA", "HGMMA", "DMMA", "IMMA")


def is_mma(op: str) -> bool:
    return op.split(".")[0] in MMA


def mma_name(i) -> str:
    """A tensor-core instruction's whole name, shape and types included (HGMMA.64x128x16.F32.BF16).
    The SASS parser's opcode stops at the shape's lowercase x; the rest heads its arguments."""
    return i.op + i.args.split()[0] if i.args[:1] == "x" else i.op


def main_loop(code: list) -> dict | None:
    """The innermost loop that multiplies (FFMA/DFMA or MMA), as disasm.inner_loop chooses it,
    with its tensor-core instructions counted too."""
    spans = []
    for start, end in disasm.loops(code):
        body = [i for i in code if start <= i.addr <= end]
        if any(disasm.is_fma(i.op) or is_mma(i.op) for i in body):
            spans.append((start, end, body))
    inner = [s for s in spans if not any(o is not s and s[0] <= o[0] and o[1] <= s[1] and (o[0], o[1]) != (s[0], s[1])
                                         for o in spans)]
    if not inner:
        return None
    start, end, body = max(inner, key=lambda s: sum(disasm.is_fma(i.op) or is_mma(i.op) for i in s[2]))
    return {"start": f"{start:#06x}", "end": f"{end:#06x}", **disasm.mix(body), "mma": _mma_counts(body),
            "ldsm": sum(i.op.startswith("LDSM") for i in body)}  # ldmatrix: the MMA's operands from shared


def ptx_counts(ptx: str) -> dict:
    """What the PTX asks for, before ptxas: cp.async copies, vector loads, warpgroup MMAs."""
    def count(pattern: str) -> int:
        return len(re.findall(pattern, ptx))

    return {"cp_async": count(r"\bcp\.async\.c[ag]\."), "cp_async_wait": count(r"\bcp\.async\.wait"),
            "ld_global_v4": count(r"\bld\.global[\w.]*\.v4\."), "ld_shared_v4": count(r"\bld\.shared[\w.]*\.v4\."),
            "st_global_v4": count(r"\bst\.global[\w.]*\.v4\."), "wgmma": count(r"\bwgmma\.mma_async"),
            "mma_sync": count(r"\bmma\.sync"), "fma": count(r"\bfma\.rn\.f(32|64)")}


def _tally(names: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        out[name] = out.get(name, 0) + 1
    return out


def ptx_names(ptx: str) -> dict[str, dict[str, int]]:
    """The PTX's instructions by whole name, where the name is the point: the tensor-core ones
    (shape, accumulator and operand types) and the float32 → bfloat16 roundings (cvt.rn: to
    nearest even; .bf16x2 rounds two values at once)."""
    return {"mma": _tally(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx)),
            "cvt_bf16": _tally(re.findall(r"\b(cvt\.\w+\.bf16(?:x2)?\.f32)\b", ptx))}


def dot_types(ttgir: str) -> dict[str, int]:
    """The TTGIR's dots (tt.dot, or Hopper's ttng.warp_group_dot) by the element types of their
    operands and result, as the compiler lowered them: {"ttng.warp_group_dot bf16 × bf16 → f32": 1}."""
    found = []
    for line in ttgir.splitlines():
        m = re.search(r"= (tt\.dot|ttng\.warp_group_dot) .* : (.*?) -> (.*?)(?: loc\(|$)", line)
        if m:
            a, b = (re.search(r"<(?:\d+x)+(\w+?)[,>]", t).group(1) for t in m.group(2).split(" * "))
            result = re.search(r"<(?:\d+x)+(\w+?)[,>]", m.group(3)).group(1)
            found.append(f"{m.group(1)} {a} × {b} → {result}")
    return _tally(found)


def accumulator_layout(ttgir: str, bm: int, bn: int) -> dict | None:
    """How the dot's BM×BN accumulator is spread over threads and warps (its TTGIR layout), and
    the footprint of one warp: the distinct rows and columns of the tile its lanes own. Per k,
    a warp reads one operand value per row and one per column of its footprint (chapter 3's
    warp tiling shrinks exactly that). None for a tensor-core (#mma) layout: the MMA
    instruction fixes who holds what."""
    dot = re.search(r"\btt\.dot\b[^\n]*->\s*tensor<\d+x\d+xf\d+,\s*#(\w+)>", ttgir)
    if not dot:
        return None
    m = re.search(rf"^#{dot.group(1)} = #ttg\.blocked<\{{(.*?)\}}>", ttgir, re.M)
    if not m:
        return None
    fields = {k: [int(x) for x in v.split(",")] for k, v in re.findall(r"(\w+) = \[([\d, ]+)\]", m.group(1))}
    spt, tpw, wpc = fields["sizePerThread"], fields["threadsPerWarp"], fields["warpsPerCTA"]
    rows = spt[0] * tpw[0] * max(1, bm // (spt[0] * tpw[0] * wpc[0]))
    cols = spt[1] * tpw[1] * max(1, bn // (spt[1] * tpw[1] * wpc[1]))
    return {"size_per_thread": spt, "threads_per_warp": tpw, "warps_per_cta": wpc,
            "warp_footprint": [rows, cols], "values_per_k_per_warp": rows + cols}


def compiled_kernels():
    """tiles/kernels.py for the compiler: a module of its own, apart from the stage's, because
    @triton.jit reads TRITON_INTERPRET when it decorates (build sets it to 0 first; the stage
    loads the file with the interpreter on a machine without a GPU)."""
    return cli.load_file("tiles/kernels.py", "tiles_kernels_compiled")


def build(keep: Path | None = None) -> dict:
    os.environ["TRITON_INTERPRET"] = "0"  # @triton.jit decides when kernels.py runs: compile, do not interpret
    import triton

    kernels = compiled_kernels()
    cuobjdump, nvdisasm = _sass_tools()
    if cuobjdump is None or nvdisasm is None:
        raise SystemExit(f"cuobjdump and nvdisasm not found (Triton's wheel ships them; or {disasm.PIP_SASS})")
    ptxas = _ptxas()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        for v in variants(kernels):
            c = compile_kernel(kernels, v["kernel"], v["dtype"], v["precision"], v["config"])
            stem = f"{v['kernel']}_{v['dtype']}_{v['precision']}"
            ptx, cubin = work / f"{stem}.ptx", work / f"{stem}.cubin"
            ptx.write_text(c.asm["ptx"])
            cubin.write_bytes(c.asm["cubin"])
            if keep:
                (work / f"{stem}.ttgir").write_text(c.asm["ttgir"])
            # Registers and spills: Triton's ptxas on Triton's PTX, with the options Triton gives it.
            log = subprocess.run([ptxas, "-lineinfo", "-v", f"--gpu-name=sm_{ARCH}a", str(ptx), "-o",
                                  str(work / f"{stem}.v.cubin")], capture_output=True, text=True, timeout=300)
            if log.returncode != 0:
                raise SystemExit(f"ptxas failed on {stem}:\n{log.stderr[-2000:]}")
            usage = disasm.parse_ptxas(log.stdout + log.stderr)[c.metadata.name]
            sass = disassemble(cubin, cuobjdump, nvdisasm)
            if keep:
                (work / f"{stem}.sass").write_text(sass)
            code = disasm.parse_sass(sass)[c.metadata.name]
            cfg = v["config"]
            threads = 32 * c.metadata.num_warps
            shared = c.metadata.shared  # dynamic shared memory, which ptxas -v does not see
            occ = sr.occupancy(usage["registers"], threads, usage["shared_bytes"], shared, usage["barriers"],
                               optin=usage["shared_bytes"] + shared > sr.H100.shared_per_block)
            rows.append({**{k: v[k] for k in ("label", "kernel", "dtype", "precision")},
                         "tile": {"bm": cfg["BLOCK_M"], "bn": cfg["BLOCK_N"], "bk": cfg["BLOCK_K"]},
                         "num_warps": c.metadata.num_warps, "num_stages": cfg["num_stages"], "threads": threads,
                         "registers": usage["registers"], "barriers": usage["barriers"],
                         "spill_bytes": usage["spill_stores"] + usage["spill_loads"],
                         "static_shared_bytes": usage["shared_bytes"], "dynamic_shared_bytes": shared,
                         "occupancy": occ["occupancy"], "blocks_per_sm": occ["blocks_per_sm"],
                         "occupancy_limited_by": occ["limited_by"],
                         "sass_instructions": sum(1 for i in code if i.op != "NOP"),
                         "kernel_mix": {**disasm.mix(code), "mma": _mma_counts(code)},
                         "main_loop": main_loop(code), "ptx": ptx_counts(c.asm["ptx"]),
                         "ptx_names": ptx_names(c.asm["ptx"]), "dots": dot_types(c.asm["ttgir"]),
                         "accumulator": accumulator_layout(c.asm["ttgir"], cfg["BLOCK_M"], cfg["BLOCK_N"])})
    return {"arch": f"sm_{ARCH}a", "size": SIZE, "triton": triton.__version__,
            "ptxas": disasm.tool_version(ptxas), "cuobjdump": disasm.tool_version(cuobjdump),
            "device": asdict(sr.H100), "compare_with": COMPARE_WITH, "kernels": rows}


def _mma_counts(code: list) -> dict[str, int]:
    return _tally([mma_name(i) for i in code if is_mma(i.op)])


# ---------------------------------------------------------------------------------------
# The table (docs/render.py marker kind "triton_static")
# ---------------------------------------------------------------------------------------
def _loop_cell(loop: dict | None) -> str:
    if not loop:
        return "–"
    cell = tables.mix_cell(loop)
    mma = loop.get("mma") or 0  # a count, or (Triton's rows) a count per instruction name
    mma = sum(mma.values()) if isinstance(mma, dict) else mma
    cell += f" + LDSM {loop['ldsm']}" if loop.get("ldsm") else ""
    return f"{cell} + MMA {mma}" if mma else cell


def _occ(k: dict) -> str:
    return f"{k['blocks_per_sm']} ({100 * k['occupancy']:.0f}%, {'+'.join(k['occupancy_limited_by'])})"


def table(record: dict) -> str:
    """Chapter 3's hand-written forward GEMMs (nt, f32) and Triton's kernels, the same columns."""
    head = ["| kernel | dtype | tile BM×BN×BK | threads | regs | smem B | spills | blocks/SM (occupancy) "
            "| main loop FMA : LDS : LDG (+ cp.async, + LDSM, + MMA) |",
            "|---|---|---|---:|---:|---:|---:|---|---|"]
    rows = []
    cuda_path = ROOT / record["compare_with"]
    cuda = json.loads(cuda_path.read_text()) if cuda_path.exists() else None
    if cuda:
        for k in cuda["kernels"]:
            if k["layout"] == "nt" and k["dtype"] == "f32" and k["version"] in HAND_WRITTEN:
                t = k["tile"]
                occ = (f"{k['blocks_per_sm']} ({100 * k['occupancy']:.0f}%, {'+'.join(k['occupancy_limited_by'])})"
                       if k.get("occupancy") is not None else "?")
                rows.append(f"| hand-written v{k['version']}: {k['idea'].split(':')[0]} | f32 | {t['bm']}×{t['bn']} | "
                            f"{k['threads']} | {k['registers']} | {k['shared_bytes'] + k['dynamic_shared_bytes']} | "
                            f"{k['spill_bytes']} | {occ} | {_loop_cell(k.get('inner_loop'))} |")
    for k in record["kernels"]:
        t = k["tile"]
        rows.append(f"| Triton {k['label']} | {k['dtype']} | {t['bm']}×{t['bn']}×{t['bk']} | {k['threads']} "
                    f"| {k['registers']} | {k['static_shared_bytes'] + k['dynamic_shared_bytes']} | {k['spill_bytes']} "
                    f"| {_occ(k)} "
                    f"| {_loop_cell(k['main_loop'])} |")
    notes = [f"\nsm_90 (Triton compiles for {record['arch']}), Triton {record['triton']} with its ptxas "
             f"{record['ptxas']}, kernels specialised for contiguous tensors at M = N = K = {record['size']}; "
             + (f"hand-written rows from `{record['compare_with']}` (ptxas {cuda['tools']['ptxas']}, nt layout = "
                "the forward). " if cuda else f"`{record['compare_with']}` not found: hand-written rows left out. ")
             + "Main loop: counts in the innermost loop that multiplies, each instruction once (count×bits for "
             f"loads). {record['date']}: `{record['command']}`"]
    return "\n".join(head + rows + notes + ideas(record) + bfloat16_dot(record))


def bfloat16_dot(record: dict) -> list[str]:
    """What the bfloat16 kernels' tl.dot became for sm_90: the dot's types in the TTGIR, its
    tensor-core instructions in the PTX and in the main loop's SASS, and the PTX's roundings."""
    kernels = [k for k in record["kernels"] if k["dtype"] == "bf16"]
    if not kernels:
        return []

    def names(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} `{name}`" for name, n in counts.items()) or "none"

    rows = ["", "The bfloat16 kernels' `tl.dot`, compiled as the stage launches it on a GPU (`INTERPRETED=False`):",
            "", "| kernel | dot in the TTGIR | tensor-core instructions in the PTX | in the main loop's SASS "
            "| float32 → bfloat16 in the PTX |", "|---|---|---|---|---|"]
    for k in kernels:
        loop = (k["main_loop"] or {}).get("mma", {})
        rows.append(f"| {k['label']} | {names(k['dots'])} | {names(k['ptx_names']['mma'])} | {names(loop)} "
                    f"| {names(k['ptx_names']['cvt_bf16'])} |")
    return rows


def ideas(record: dict) -> list[str]:
    """Chapter 3's ideas, and whether the SASS of Triton's forward kernels shows each one."""
    fwd = next(k for k in record["kernels"] if k["kernel"] == "forward_kernel" and k["precision"] == "ieee"
               and k["dtype"] == "f32")
    tf32 = next((k for k in record["kernels"] if k["precision"] == "tf32"), None)
    loop, mix = fwd["main_loop"] or {}, fwd["kernel_mix"]
    lds, ldgsts = loop.get("lds", {}), loop.get("ldgsts", {})
    outputs = fwd["tile"]["bm"] * fwd["tile"]["bn"] // fwd["threads"]
    stage_bytes = (fwd["tile"]["bm"] + fwd["tile"]["bn"]) * fwd["tile"]["bk"] * 4
    buffers = fwd["dynamic_shared_bytes"] // stage_bytes
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    acc = fwd.get("accumulator")
    if acc:
        (r, c), (tr, tc) = acc["warp_footprint"], acc["size_per_thread"]
        # The most compact rectangle of the same number of outputs, sides powers of two (64×32 for
        # 2048, the warp tile of chapter 3's v7): the fewest operand values per k.
        best = min((a + r * c // a, a) for a in (2 ** i for i in range(1, 16)) if (r * c) % a == 0)
        warp_cell = (f"{yes(r + c == best[0])} | each warp owns {r}×{c} outputs (the accumulator's layout in the "
                     f"TTGIR: {tr}×{tc} per thread and repeat), so per k a warp reads {r + c} operand values; "
                     f"a compact {best[1]}×{r * c // best[1]} warp tile would read {best[0]} |")
    else:
        warp_cell = "– | no blocked accumulator layout in the TTGIR (a tensor-core layout, or none found) |"
    widths = "+".join(f"{n}×{w}" for w, n in sorted(lds.items(), key=lambda kv: int(kv[0]))) or "none"
    rows = ["", "Chapter 3's ideas in Triton's float32 forward (IEEE), read from the table's row and its SASS:", "",
            "| idea (chapter 3) | applied? | evidence |", "|---|---|---|",
            f"| shared-memory tiles (v3) | {yes(bool(lds) and fwd['dynamic_shared_bytes'] > 0)} | "
            f"{fwd['dynamic_shared_bytes']} B of shared memory; main loop reads it with LDS {widths} |",
            f"| register blocking (v4, v5) | {yes(outputs > 1 and (loop.get('fma_per_lds') or 0) > 1)} | "
            f"{outputs} outputs per thread; {loop.get('fma', 0)} FFMA for {sum(lds.values())} LDS in the main loop |",
            f"| 128-bit global loads (v6) | {yes('128' in ldgsts or '128' in loop.get('ldg', {}))} | main loop: "
            + (", ".join(f"{n} {kind}.{w}" for kind, d in (("LDG", loop.get("ldg", {})), ("LDGSTS", ldgsts))
                         for w, n in sorted(d.items())) or "no global loads")
            + f"; the epilogue stores with {mix['stg'].get('128', 0)} STG.128 |",
            f"| double buffering, cp.async (v8) | {yes(bool(ldgsts) and buffers > 1)} | "
            f"{buffers} buffers of {stage_bytes} B (num_stages={fwd['num_stages']}); {sum(ldgsts.values())} LDGSTS "
            f"(cp.async) in the main loop, {fwd['ptx']['cp_async_wait']} cp.async.wait in the PTX |",
            f"| warp tiling (v7) | {warp_cell}"]
    if tf32:
        mma = tf32["main_loop"]["mma"] if tf32["main_loop"] else {}
        rows.append(f"| tensor cores (TF32 only) | {yes(bool(mma))} | IEEE: {sum(fwd['kernel_mix']['mma'].values())} "
                    f"MMA instructions; TF32: {', '.join(f'{n} {op}' for op, n in mma.items()) or 'none'} "
                    f"in the main loop, {tf32['ptx']['wgmma']} wgmma.mma_async in the PTX |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (the folder must exist)")
    parser.add_argument("--keep", metavar="DIR", help="keep the PTX, TTGIR, cubin and SASS in DIR (must exist)")
    args = parser.parse_args(argv)
    json_path = cli.check_output(args.json, "--json")
    keep = Path(args.keep) if args.keep else None
    if keep is not None and not keep.is_dir():
        parser.error(f"--keep: no such folder: {keep}")
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("triton").origin is None:
        raise cli.UserError("needs Triton: pip install triton==3.6.0 (the release the GPU machines run)")
    record = build(keep)
    record.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command=" ".join(["python tiles/compiler_report.py", *(sys.argv[1:] if argv is None else argv)]))
    return cli.publish(table(record), [(json_path, cli.json_writer(record, indent=1))])


if __name__ == "__main__":
    cli.run(main)
