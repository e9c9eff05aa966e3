"""The Markdown tables of cuda/bench_gpu.py's records, one function a part (``gemm_table``,
``roof_table``, ``ncu_table``, ...), each beside the record it renders: docs/render.py's
renderers() fills the chapters' marked tables with them, and bench_gpu.py prints ``table`` of
the record it wrote."""

from __future__ import annotations

import record_info


def candidates_table(record: dict) -> str:
    c = record["candidates"]
    rows = ["| shape B, I, O | line | tile BM×BN×BK, warp WM×WN (piece), min blocks | µs (IQR) | GFLOP/s | "
            "speed / reference (95% CI) | speed / version 0 (95% CI) |", "|---|---|---|---:|---:|---:|---:|"]
    for entry in c["shapes"].values():
        for r in entry["rows"]:
            shape = ""
            if r["line"].startswith("candidate "):
                bm, bn, bk, wm, wn, tm, tn, minb = c["candidates"][int(r["line"].split()[1])]
                shape = f"{bm}×{bn}×{bk}, {wm}×{wn} ({tm}×{tn}), {minb}"
            rows.append(f"| {', '.join(map(str, entry['shape']))} | {r['line']} | {shape} | {r['forward_us']:.0f} "
                        f"({r['spread_us']:.0f}) | {r['gflops']:.0f} | {r['of_reference']['speed']:.3f} "
                        f"({_ci(r['of_reference']['ci'])}) | {r['of_version_0']['speed']:.3f} "
                        f"({_ci(r['of_version_0']['ci'])}) |")
    failed = [x["candidate"] for x in c["checked"] if not x["ok"]]
    note = f"Not timed (failed the float64 check): {', '.join(map(str, failed))}. " if failed else ""
    return ("\n".join(rows) + f"\n\nForward, float32, {c['rounds']} rounds; every candidate checked against "
            f"float64 first. {note}" + _footer(record).strip())


def _ci(ci: list[float] | None) -> str:
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "–"


def _pct(ci: list[float] | None) -> str:
    return f"{100 * ci[0]:.1f}–{100 * ci[1]:.1f}%" if ci else "–"


def _footer(record: dict) -> str:
    return "\n" + record_info.footer(record, "TF32 off", card=True, sep="; ")


def gemm_table(record: dict) -> str:
    """SGEMM_CUDA's table: each version's forward, GFLOP/s and share of cuBLAS."""
    g = record["gemm"]
    b, i, o = g["shape"]
    return (_gemm_rows(g) + f"\n\nForward only, B={b} I={i} O={o}, {g['rounds']} rounds.{_not_timed(g)}"
            + _footer(record))


def _gemm_rows(g: dict) -> str:
    rows = ["| line | µs (IQR) | GFLOP/s | speed / cuBLAS x·Wᵀ (95% CI) | speed / reference |",
            "|---|---:|---:|---:|---:|"]
    for r in g["rows"]:
        rows.append(f"| {r['line']} | {r['forward_us']:.0f} ({r['spread_us']:.0f}) | {r['gflops']:.0f} | "
                    f"{100 * r['of_cublas']['speed']:.1f}% ({_pct(r['of_cublas']['ci'])}) | "
                    f"{100 * r['of_reference']['speed']:.1f}% |")
    return "\n".join(rows)


def _not_timed(part: dict) -> str:
    failed = part.get("failed") or {}
    return "".join(f" Not timed: {line} ({why})." for line, why in failed.items())


def small_table(record: dict) -> str:
    """gemm_table's columns at B = 32."""
    return gemm_table({**record, "gemm": record["small"]})


def grad_table(record: dict) -> str:
    """The backward's elementwise kernels against torch's, per number of rows."""
    g = record["grad"]
    rows = ["| rows × columns | line | µs (IQR) | GB/s (g, y read; dz written) | speed / torch (95% CI) |",
            "|---|---|---:|---:|---:|"]
    for entry in g["shapes"].values():
        for r in entry["lines"]:
            rows.append(f"| {entry['rows']} × {g['cols']} | {r['line']} | {r['us']:.1f} ({r['spread_us']:.1f}) | "
                        f"{r['gb_per_s']:.0f} | {r['of_torch']['speed']:.3f} ({_ci(r['of_torch']['ci'])}) |")
    failed = "".join(_not_timed(e) for e in g["shapes"].values())
    return ("\n".join(rows) + f"\n\ndz = g·y·(1 − y) and the bias gradient Σ_rows dz, float32, {g['rounds']} rounds; "
            f"each kernel checked against float64 first.{failed}" + _footer(record))


def bf16_table(record: dict) -> str:
    """The bfloat16 versions beside cuBLAS's bfloat16 x·Wᵀ and the reference in bfloat16."""
    b = record["bf16"]
    out = []
    for entry in b["shapes"].values():
        bb, i, o = entry["shape"]
        out.append(_gemm_rows(entry) + f"\n\nbfloat16, forward only, B={bb} I={i} O={o}, {entry['rounds']} rounds."
                   + _not_timed(entry))
    bad = [f"{v} ({c['error'] if 'error' in c else format(c['rel_error'], '.1e')})"
           for v, c in b["checked"].items() if not c["ok"]]
    return "\n\n".join(out) + (f"\n\nNot timed (failed the float64 check, tolerance {b['tolerance']}): "
                               f"{', '.join(bad)}." if bad else "") + _footer(record)


def goals_table(record: dict) -> str:
    rows = ["| goal | shape B, I, O | cuda µs | reference µs | speed / reference (95% CI) | goal | verdict |",
            "|---|---|---:|---:|---:|---:|---|"]
    for name, r in record["goals"]["goals"].items():
        verdict = "met" if r["met"] else "missed" if r["missed"] else "not settled"
        rows.append(f"| {name} | {', '.join(map(str, r['shape']))} | {r['cuda_us']:.0f} | {r['reference_us']:.0f} | "
                    f"{r['speed']:.3f} ({_ci(r['ci'])}) | ≥ {r['goal']} | {verdict} |")
    tail = "same card and command as the GEMM table" if "gemm" in record else _footer(record).strip()
    return "\n".join(rows) + f"\n\nThe automatic version, {record['goals']['rounds']} rounds; {tail}."


def roof_table(record: dict) -> str:
    """The roofs beside cuBLAS and the tensor-core versions: TFLOP/s, the share of each one's own
    instruction's roof, the speed against cuBLAS's bfloat16 x·Wᵀ; the goal; how each roof ran."""
    r = record["roof"]
    rows = ["| line | instruction | µs (IQR) | TFLOP/s (IQR) | share of its instruction's roof (95% CI) | "
            "speed / cuBLAS bf16 x·Wᵀ (95% CI) |", "|---|---|---:|---:|---:|---:|"]
    for row in r["rows"]:
        share = row.get("of_roof")
        cublas = row.get("of_cublas")
        lo, hi = row["tflops_iqr"]
        rows.append(f"| {row['line']} | {row['instruction'] or '–'} | {row['us']:.0f} ({row['spread_us']:.0f}) | "
                    f"{row['tflops']:.0f} ({lo:.0f}–{hi:.0f}) | "
                    + (f"{share['share']:.3f} ({_ci(share['ci'])}) | " if share else "– | ")
                    + (f"{cublas['speed']:.3f} ({_ci(cublas['ci'])}) |" if cublas else "– |"))
    ran = "; ".join(f"{name}: {x['blocks']} blocks of {x['threads']} threads ({x['blocks_per_sm']} an SM), "
                    f"{x['iterations']} iterations, every thread's sum {'exact' if x['checked'] else 'WRONG'}"
                    for name, x in r["roofs"].items())
    goals = " ".join(f"Goal: {line} ≥ {g['goal']} of the {g['roof']} roof: {g['verdict']}"
                     + (f" ({g['share']:.3f}, {_ci(g['ci'])})." if "share" in g else ".")
                     for line, g in r["goals"].items())
    bad = [f"{v} ({c['error'] if 'error' in c else format(c['rel_error'], '.1e')})"
           for v, c in r["checked"].items() if not c["ok"]]
    failed = {k: why for k, why in r["failed"].items() if k not in r["checked"]}
    b, i, o = r["shape"]
    return ("\n".join(rows) + f"\n\nbfloat16, forward only, B={b} I={i} O={o}, {r['rounds']} rounds; a share is "
            "the line's FLOP rate over its roof's in the same round. The cuBLAS line's instruction on Hopper is "
            f"wgmma. Roofs: {ran or 'none ran'}. {goals}"
            + (f" Not timed (failed the float64 check, tolerance {r['tolerance']}): {', '.join(bad)}." if bad else "")
            + "".join(f" Not timed: {line} ({why})." for line, why in failed.items()) + _footer(record))


def tf32_table(record: dict) -> str:
    """The float32 tensor-core versions: speed at 4096³, then their errors against float64 beside
    cuBLAS's, as a multiple of cuBLAS float32's; the goals."""
    t = record["tf32"]
    timing = t["timing"]
    b, i, o = timing["shape"]
    parts = [_gemm_rows(timing) + f"\n\nfloat32, forward only, B={b} I={i} O={o}, {timing['rounds']} rounds, "
             f"TF32 off for cuBLAS and the reference.{_not_timed(timing)}"]
    rows = ["| B = I = O | line | largest error | ‖error‖ / ‖truth‖ | largest error / cuBLAS float32's |",
            "|---:|---|---:|---:|---:|"]
    for entry in t["errors"].values():
        for name, e in entry["lines"].items():
            rows.append(f"| {entry['shape'][0]} | {name} | " + (
                f"failed: {e['error']} | – | – |" if "error" in e else
                f"{e['max_abs']:.2e} | {e['rel']:.2e} | {e['of_cublas_f32']:.2f} |"))
    parts.append("\n".join(rows) + "\n\nx·Wᵀ alone (no bias, no sigmoid), x ~ N(0, 1), W ~ N(0, 1/I), against "
                 "float64 arithmetic on the same float32 inputs; cuBLAS TF32 is torch's allow_tf32.")
    goals = ["| goal | value (95% CI) | target | verdict |", "|---|---:|---:|---|"]
    for g in t["goals"]:
        value = "–" if "value" not in g else f"{g['value']:.3f}" + (f" ({_ci(g['ci'])})" if g.get("ci") else "")
        goals.append(f"| {g['goal']} | {value} | {g['target']} | {g['verdict']} |")
    parts.append("\n".join(goals))
    return "\n\n".join(parts) + _footer(record)


def goals16_table(record: dict) -> str:
    """goals_table's rows in bfloat16, and at B = 32 the time to read W once beside the forward's."""
    g = record["goals16"]
    if not g["goals"]:
        bad = ", ".join(f"{shape}: {c.get('error', c.get('rel_error'))}" for shape, c in g["checked"].items())
        return f"Not timed: version 0 failed the bfloat16 check against float64 ({bad})." + _footer(record)
    rows = goals_table({**record, "goals": g}).split("\n\n")[0]
    text = rows + f"\n\nThe automatic version in bfloat16, {g['rounds']} rounds, checked against float64 first."
    w = g.get("w_read")
    if w:
        b, i, o = w["shape"]
        sheet = w["datasheet_bytes_per_s"]
        text += (f" At B = {b}, I = {i}, O = {o}: W is {w['w_bytes'] / 2**20:.0f} MiB in bfloat16 (x, y and b "
                 f"{w['other_bytes'] / 2**20:.2f} MiB more); reading them once at the bandwidth a device copy "
                 f"reaches here ({w['copy']['bytes_per_s'] / 1e12:.2f} TB/s, bytes read plus written, of "
                 f"{w['copy']['bytes'] // 2**30} GiB) takes {w['bound_us']:.1f} µs"
                 + (f", at the datasheet's {sheet / 1e12:.2f} TB/s {w['datasheet_bound_us']:.1f} µs" if sheet else
                    " (no datasheet bandwidth known for this card)")
                 + (f"; the forward takes {w['cuda_us']:.1f} µs, {w['cuda_us'] / w['bound_us']:.2f} times the "
                    "measured bound." if w["cuda_us"] else "."))
    return text + _footer(record)


def ptx_table(record: dict) -> str:
    rows = ["| shape B, I, O | timed | compiler's PTX µs | edited PTX µs | speed-up (95% CI) | verdict |",
            "|---|---|---:|---:|---:|---|"]
    for rows_ in record["ptx"]["shapes"].values():
        for k in ("forward", "fwd+bwd"):
            r = rows_[k]
            rows.append(f"| {', '.join(map(str, rows_['shape']))} | {k} | {r['compiler_us']:.0f} | "
                        f"{r['edited_us']:.0f} | {r['speedup']:.3f} ({_ci(r['ci'])}) | {r['verdict']} |")
    return "\n".join(rows) + f"\n\n{record['ptx']['rounds']} rounds, the two PTX files alternating." + _footer(record)


def ncu_table(record: dict) -> str:
    rows = ["| kernel | µs | registers | achieved occupancy | sectors / request (global loads) | shared-memory bank "
            "conflicts (loads, stores) | DRAM throughput | SM throughput | FFMA / (B·I·O) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    b, i, o = record.get("shape", [2048, 2048, 2048])
    seen = set()
    for k in record["kernels"]:
        if k["kernel"] in seen:  # the profile launches v1's and v2's forward twice
            continue
        seen.add(k["kernel"])
        m = k["metrics"]
        requests = max(m["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"], 1)
        spr = m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / requests
        # B·I·O multiply-adds is a GEMM's work; the elementwise kernels do none of it
        ffma = (f"{m['smsp__sass_thread_inst_executed_op_ffma_pred_on.sum'] / (b * i * o):.2f}"
                if k["kernel"].startswith("dense_gemm_") else "–")
        rows.append(f"| {k['kernel']} | {m['gpu__time_duration.sum'] / 1e3:.0f} | "
                    f"{m['launch__registers_per_thread']:.0f} | "
                    f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.0f}% | {spr:.1f} | "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum']:.2g}, "
                    f"{m['l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum']:.2g} | "
                    f"{m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.1f}% | "
                    f"{m['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.0f}% | {ffma} |")
    return "\n".join(rows) + "\n\nNsight Compute on " + record_info.footer(
        record, f"one call of each at B=I=O={b} (`python cuda/bench_gpu.py profile`)", sep="; ")


def exact_summary(record: dict) -> str:
    e = record["exact"]
    return "\n".join([f"exact: {e['status']}, {e['compared']} GEMMs compared with the emulation's bits"]
                     + [f"  DIFFERENT: {m}" for m in e["differences"] + e["missing"]]
                     + ([f"  FAULT: {e['fault']}"] if "fault" in e else []))


def table(record: dict) -> str:
    shown = {"exact": exact_summary, "gemm": gemm_table, "goals": goals_table, "small": small_table,
             "grad": grad_table, "bf16": bf16_table, "roof": roof_table, "tf32": tf32_table,
             "goals16": goals16_table, "ptx": ptx_table, "candidates": candidates_table}
    parts = [show(record) for part, show in shown.items() if part in record]
    if "check" in record:
        c = record["check"]
        parts.append(f"check: {len(c['rows']) - c['failed']} of {len(c['rows'])} passed "
                     f"(‖out − ref‖ / ‖ref‖ under {c['tolerance']})")
    return "\n\n".join(parts)
