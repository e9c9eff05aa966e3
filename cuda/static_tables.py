"""The static record's tables (docs/results/cuda_static_sm90.json, written by
cuda/static_report.py): the hand-written kernels' chapter's table of its versions, the candidates',
the tensor-core chapter's, and the backward's kernels'. docs/render.py renders them (marker kinds
"static" and "tensor_static"); static_report prints them.
"""

from __future__ import annotations

import re

import cli

DTYPES = cli.load_file("cuda/catalog.py").DTYPES  # dense_kernels::kDTypeNames, in order


# The figures every architecture gets for every entry (Report.archs), beside the first one's full records.
COMPACT = ("registers", "spill_stores", "spill_loads", "stack_bytes", "shared_bytes", "threads", "blocks_per_sm",
           "occupancy_limited_by")


def compact(rec: dict) -> dict:
    """One entry's figures on one architecture: ptxas's, the occupancy, and where there is SASS
    the main loop's multiplies (FFMA/DFMA, HMMA), ldmatrix's and the census of the tensor-core and
    cp.async instructions, in the loop and in the whole kernel."""
    out = {x: rec.get(x) for x in COMPACT}
    if loop := rec.get("inner_loop"):
        out["loop"] = {"fma": loop["fma"], "mma": loop["mma"], "ldsm": loop["ldsm"], "census": loop["census"]}
    if rec.get("census"):
        out["census"] = rec["census"]
    return out


def mix_cell(loop: dict | None, sep: str = " : ") -> str:
    if not loop:
        return "–"
    def widths(d: dict) -> str:
        return "+".join(f"{n}×{w}" for w, n in sorted(d.items(), key=lambda kv: int(kv[0]))) or "0"
    cp_async = f" + cp.async {widths(loop['ldgsts'])}" if loop["ldgsts"] else ""
    return f"{loop['fma']}{sep}{widths(loop['lds'])}{sep}{widths(loop['ldg'])}{cp_async}"


def uses_tensor_cores(rec: dict) -> bool:
    """A GEMM record of a tensor-core version: TILES says so, or its main loop has HMMA's."""
    return "tensor_cores" in rec.get("napkin", {}) or bool((rec.get("inner_loop") or {}).get("mma"))


def _dtype_order(dt: str) -> int:
    return DTYPES.index(dt) if dt in DTYPES else len(DTYPES)


def table(record: dict) -> str:
    """One row per CUDA-core version and dtype; registers for the three layouts, the rest for nt
    (forward). The tensor-core versions have a table of their own (tensor_core_table)."""
    by = {}
    for k in record["kernels"]:
        if not uses_tensor_cores(k):
            by.setdefault((k["version"], k["dtype"]), {})[k["layout"]] = k
    times = {(t["version"], t["dtype"]): t for t in record.get("timings", [])}
    sass = record["tools"]["sass"]["available"]
    timed = " GFLOP/s | % of cuBLAS |" if times else ""
    head = ["| v | dtype | tile BM×BN (TM×TN) | threads | FLOP/B | regs nt/nn/tn | smem B | spills | blocks/SM "
            f"nt/nn/tn (bound by) | inner loop FMA:LDS:LDG |{timed}",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if times else "")]
    rows: list = []
    for (v, dt), lay in sorted(by.items(), key=lambda kv: (kv[0][0], _dtype_order(kv[0][1]))):
        nt = lay.get("nt") or next(iter(lay.values()))
        tile = nt.get("tile")
        tile_cell = f"{tile['bm']}×{tile['bn']} ({tile['tm']}×{tile['tn']})" if tile else "?"
        ai = f"{nt['napkin']['flop_per_byte']:.2f}" if nt.get("napkin") else "?"
        regs = "/".join(str(lay[x]["registers"]) if x in lay else "–" for x in ("nt", "nn", "tn"))
        spills = max(x["spill_bytes"] for x in lay.values())
        blocks = "/".join(str(lay[x]["blocks_per_sm"]) if lay.get(x, {}).get("blocks_per_sm") is not None else "–"
                          for x in ("nt", "nn", "tn"))
        bound = sorted({b for x in lay.values() for b in x.get("occupancy_limited_by") or []})
        occ = f"{blocks} ({'+'.join(bound)})" if bound else blocks
        loop = mix_cell(nt.get("inner_loop"), ":") if sass else "no SASS"  # compact: tables count as words
        row = (f"| {v} | {dt} | {tile_cell} | {nt['threads']} | {ai} | {regs} | {nt['shared_bytes']} | "
               f"{spills} | {occ} | {loop} |")
        if times:
            t = times.get((v, dt))
            gf, share = (f"{t['gflops']:.0f}", f"{100 * t['share_of_cublas']:.1f}") if t else ("not measured",) * 2
            row += f" {gf} | {share} |"
        rows.append(row)
    d = record["device"]
    notes = [f"\n{record['arch']}, ptxas {record['tools']['ptxas']}, {d['name']}, K={record['k']} for FLOP/B, "
             f"{record['date']}: `{record['command']}`"]
    split: dict[int, set] = {}
    for k in record["kernels"]:
        if k.get("napkin", {}).get("slices", 1) > 1:
            split.setdefault(k["version"], set()).add((k["dtype"], k["napkin"]["slices"]))
            at = k["napkin"]["slices_at"]
    if split:
        each = "; ".join(f"v{v} " + ", ".join(f"{s} slices ({dt})" for dt, s in
                                              sorted(split[v], key=lambda x: _dtype_order(x[0])))
                         for v in sorted(split))
        notes.append(f"Split-K: FLOP/B includes the partial products ({each}), the slices taken at "
                     f"B={at['batch']}, I=O={at['in']} on {at['sm_count']} SMs.")
    if not sass:
        notes.append(f"SASS columns left out: {record['tools']['sass']['reason']}.")
    if record.get("timings"):
        src = sorted({f"{t['device']} ({t['file']})" for t in record["timings"]})
        notes.append("Timings: forward only, from " + ", ".join(src) + ".")
    else:
        notes.append("GPU timings: none joined (--timings).")
    for w in record.get("warnings", []):
        notes.append(f"Warning: {w}")
    return "\n".join(head + rows + notes + _other_table(record))


def chapter_table(record: dict) -> str:
    """The chapter's version of table(): float32 rows, without the backward's kernels (the script
    prints all of them; a chapter's tables count against its word budget)."""
    kept = {**record, "kernels": [k for k in record["kernels"] if k["dtype"] == "f32" and not uses_tensor_cores(k)],
            "other_kernels": []}
    text = table(kept)
    return text + "\n\nfloat64 rows and the backward's kernels: `python cuda/static_report.py`."


def candidates_table(record: dict) -> str:
    """The autotuning candidates: one row each (float32), registers and blocks per SM per layout.
    The script prints it after table(); a page shows it through a marker of its own."""
    return "\n".join(_candidates_table(record)).strip()


def _candidates_table(record: dict) -> list[str]:
    by: dict[int, dict] = {}
    for k in record.get("candidates", []):
        by.setdefault(k["candidate"], {})[k["layout"]] = k
    if not by:
        return []
    sass = record["tools"]["sass"]["available"]
    rows = ["", "The autotuning candidates: v11's template at other shapes (float32; `dense_kernels::kTuneCandidates`, "
            "tile BM×BN×BK, warp tile WM×WN in pieces of TM×TN, a lane's outputs in brackets):", "",
            "| # | tile | warp (piece) [lane] | threads | min blocks | FLOP/B | regs nt/nn/tn | smem B | spills | "
            "blocks/SM nt/nn/tn | inner loop FMA:LDS:LDG |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for i, lay in sorted(by.items()):
        nt = lay.get("nt") or next(iter(lay.values()))
        sh, tile = nt.get("shape"), nt.get("tile")
        shape = f"{sh['bm']}×{sh['bn']}×{sh['bk']}" if sh else "?"
        warp = f"{sh['wm']}×{sh['wn']} ({sh['tm']}×{sh['tn']}) [{tile['tm']}×{tile['tn']}]" if sh else "?"
        ai = f"{nt['napkin']['flop_per_byte']:.2f}" if nt.get("napkin") else "?"
        regs = "/".join(str(lay[x]["registers"]) if x in lay else "–" for x in ("nt", "nn", "tn"))
        blocks = "/".join(str(lay[x]["blocks_per_sm"]) if lay.get(x, {}).get("blocks_per_sm") is not None else "–"
                          for x in ("nt", "nn", "tn"))
        rows.append(f"| {i} | {shape} | {warp} | {nt['threads']} | {sh['min_blocks'] if sh else '?'} | {ai} | "
                    f"{regs} | {nt['shared_bytes']} | {max(x['spill_bytes'] for x in lay.values())} | {blocks} | "
                    f"{mix_cell(nt.get('inner_loop'), ':') if sass else 'no SASS'} |")
    return rows


def _arch_entries(record: dict) -> dict[str, dict]:
    """{architecture: {entry name: compact figures}}, lowest architecture first: the record's
    per-architecture figures, or for a record without them its own (one architecture's) records."""
    found = {a: x["entries"] for a, x in record.get("archs", {}).items()} or \
        {record["arch"]: {r["name"]: compact(r) for r in
                          record["kernels"] + record.get("candidates", []) + record.get("other_kernels", [])}}
    return dict(sorted(found.items(), key=lambda kv: int(re.sub(r"\D", "", kv[0]) or 0)))


def _loop_cell(loop: dict | None) -> str:
    """A main loop in a few words: multiply-adds, the tensor-core and cp.async instructions by
    their SASS names, and plain shared and global loads as count×bits."""
    if not loop:
        return "–"
    def widths(d: dict) -> str:
        return "+".join(f"{n}×{w}" for w, n in sorted(d.items(), key=lambda kv: int(kv[0])))
    # where the tensor cores multiply, FFMA's in the loop's range are the epilogue's or conversions
    parts = [f"{loop['fma']} FFMA"] if loop["fma"] and not loop.get("mma") else []
    parts += [f"{n} {op}" for op, n in loop.get("census", {}).items()
              if op.startswith(("HMMA", "HGMMA", "LDSM", "LDGSTS", "UTMALDG"))]
    parts += [f"{name} {widths(loop[key])}" for name, key in (("LDS", "lds"), ("LDG", "ldg")) if loop[key]]
    return ", ".join(parts)


def tensor_core_table(record: dict) -> str:
    """The tensor-core versions, after the CUDA-core versions built for bfloat16 and float16 (their
    baseline): one row per version and element type; registers and blocks per SM on each
    architecture of the record, for the three layouts; shared memory, spills and stack frame
    (the most of any layout and architecture); the main loop's instructions per pass (one k-step)
    for nt on the record's first architecture, and its mma count (HMMA, HGMMA) on each; "–" where
    a version does not run (its kernels there are a trap)."""
    entries = _arch_entries(record)
    archs = list(entries)
    by: dict[tuple[int, str], dict] = {}
    elsewhere: dict[str, set] = {}  # versions built for an architecture the record does not have
    for k in record["kernels"]:
        if k.get("needs") and k["needs"] not in archs:
            elsewhere.setdefault(k["needs"], set()).add(k["version"])
        elif uses_tensor_cores(k) or k["dtype"] in ("bf16", "f16"):
            by.setdefault((k["version"], k["dtype"]), {})[k["layout"]] = k
    if not by:
        return "No tensor-core or 16-bit GEMM entries in this record."
    sass = record["tools"]["sass"]["available"]
    per_arch = " | ".join(f"regs nt/nn/tn {a}" for a in archs)
    blocks_head = " | ".join(f"blocks/SM {a}" for a in archs)
    head = [f"| v | dtype | tile BM×BN×BK (warp) | threads | FLOP/B | {per_arch} | smem B | spills, stack B | "
            f"{blocks_head} | MMA per pass {'/'.join(archs)} | main loop per pass, nt, {record['arch']} |",
            "|---|---|---|---:|---:|" + "---:|" * len(archs) + "---:|---:|" + "---:|" * len(archs) + "---:|---|"]
    rows: list = []
    for (v, dt), lay in sorted(by.items(), key=lambda kv: (kv[0][0], _dtype_order(kv[0][1]))):
        nt = lay.get("nt") or next(iter(lay.values()))
        names = [lay[x]["name"] if x in lay else None for x in ("nt", "nn", "tn")]
        t = nt.get("tile")
        if t and "bk" in t:
            tile_cell = f"{t['bm']}×{t['bn']}×{t['bk']} ({t['wm']}×{t['wn']})"
        elif t:
            tile_cell = f"{t['bm']}×{t['bn']} ({t['tm']}×{t['tn']})"
        else:
            tile_cell = "?"
        ai = f"{nt['napkin']['flop_per_byte']:.2f}" if nt.get("napkin") else "?"

        runs = [a for a in archs if not nt.get("needs") or nt["needs"] == a]  # elsewhere a trap: no figures

        def each(arch: str, key: str, names: list = names, runs: list = runs) -> str:
            return "/".join(str(entries[arch][n][key]) if arch in runs and n in entries[arch]
                            and entries[arch][n].get(key) is not None else "–" for n in names)
        figures = [entries[a][n] for a in runs for n in names if n in entries[a]]
        sizes = [str(lay[x]["shared_bytes"] + lay[x].get("dynamic_shared_bytes", 0)) if x in lay else "–"
                 for x in ("nt", "nn", "tn")]
        smem = sizes[0] if len(set(sizes)) == 1 else "/".join(sizes)
        spills = max((f["spill_stores"] or 0) + (f["spill_loads"] or 0) for f in figures)
        stack = max(f["stack_bytes"] or 0 for f in figures)
        hmma = "/".join(str(entries[a].get(nt["name"], {}).get("loop", {}).get("mma", "–")) if a in runs else "–"
                        for a in archs) if sass else "no SASS"
        loop = _loop_cell(nt.get("inner_loop")) if sass else "no SASS"
        cells = (f"{tile_cell} | {nt['threads']} | {ai} | " + " | ".join(each(a, "registers") for a in archs)
                 + f" | {smem} | {spills}, {stack} | " + " | ".join(each(a, "blocks_per_sm") for a in archs)
                 + f" | {hmma}")
        if dt == "f16" and rows and rows[-1][:2] == (v, cells):  # float16 as bfloat16: one row for both
            rows[-1] = (v, cells, "bf16, f16", rows[-1][3])
            continue
        rows.append((v, cells, dt, loop))
    rows = [f"| {v} | {dt} | {cells} | {loop} |" for v, cells, dt, loop in rows]
    devices = {a: record.get("archs", {}).get(a, {}).get("device", record["device"])["name"] for a in archs}
    notes = ["", f"{', '.join(f'{a} ({devices[a]})' for a in archs)}, ptxas {record['tools']['ptxas']}, "
                 f"K={record['k']} for FLOP/B, {record['date']}: `{record['command']}`",
             "Static counts, each instruction once, in the address range a loop's backward branch closes: "
             "a pass's global loads include the element-by-element path taken where a tile is not 16-byte "
             "aligned, and where ptxas lays out other code inside that range (the TMA versions) it is counted "
             "too. smem B: static and dynamic, per layout nt/nn/tn where they differ. \"bf16, f16\": the same "
             "figures in both types (the main loop shown is bfloat16's)."]
    for arch, versions in sorted(elsewhere.items()):
        notes.append(f"{', '.join(f'v{v}' for v in sorted(versions))}: {arch} only, "
                     f"`python cuda/static_report.py --arch {arch}`.")
    if not sass:
        notes.append(f"SASS columns left out: {record['tools']['sass']['reason']}.")
    return "\n".join(head + rows + notes)


ROOF_PREFIX = "dense_roof_"  # cuda/tensor_cores/roof.cuh's entries: in the record, not in the backward's table
OTHER_ORDER = ("dense_sigmoid_grad_v1", "dense_sigmoid_grad_v1_x4", "dense_sigmoid_grad_v2", "dense_sigmoid_grad_v3",
               "dense_bias_grad_v3", "dense_splitk_reduce")


def _other_table(record: dict) -> list[str]:
    """The kernels that are not GEMMs (the backward's sigmoid-grad versions, the two second
    passes): one row per kernel, its element types side by side; memory and shuffle instructions
    counted over the whole kernel (static counts, loops once)."""
    by: dict[str, dict] = {}
    for k in record.get("other_kernels", []):
        if k["name"].startswith(ROOF_PREFIX):  # the tensor cores' roofs: micro-benchmarks, not the backward's
            continue
        base, _, dt = k["name"].rpartition("_")
        by.setdefault(base, {})[dt] = k
    if not by:
        return []
    sass = record["tools"]["sass"]["available"]
    types = sorted({dt for lay in by.values() for dt in lay}, key=_dtype_order)

    def pair(lay: dict, f) -> str:
        return "/".join(f(lay[dt]) if dt in lay else "–" for dt in types)

    def occ(k: dict) -> str:
        return f"{k['blocks_per_sm']} ({100 * k['occupancy']:.0f}%)" if k.get("occupancy") is not None else "?"

    def loads(k: dict) -> str:
        mx = k.get("mix")
        if not mx:
            return "–"
        cell = [f"{name} " + "+".join(f"{n}×{w}" for w, n in sorted(mx[key].items(), key=lambda kv: int(kv[0])))
                for name, key in (("LDG", "ldg"), ("STG", "stg"), ("LDS", "lds"), ("STS", "sts")) if mx[key]]
        return ", ".join(cell + ([f"SHFL {mx['shfl']}"] if mx["shfl"] else []))

    rows = ["", f"The backward's kernels and the two second passes ({'/'.join(types)}; instructions over the whole "
            "kernel, f32, count×bits):", "",
            "| kernel | threads | regs | smem B | spills | blocks/SM (occupancy) | memory and shuffle instructions |",
            "|---|---:|---:|---:|---:|---|---|"]
    order = {n: i for i, n in enumerate(OTHER_ORDER)}
    for base, lay in sorted(by.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
        first = lay.get("f32") or next(iter(lay.values()))
        rows.append(f"| `{base}` | {first['threads']} | {pair(lay, lambda k: str(k['registers']))} | "
                    f"{pair(lay, lambda k: str(k['shared_bytes']))} | {max(k['spill_bytes'] for k in lay.values())} | "
                    f"{pair(lay, occ)} | {loads(first) if sass else 'no SASS'} |")
    return rows
