"""The machine code (SASS, sm_90) before and after each hand edit of the PTX, without a GPU.

Finds the edits by comparing the committed PTX with the compiler's (from `bash ptx/regen.sh`),
function by function; assembles both with ptxas -arch=sm_90 and disassembles them with
cuobjdump -sass; then, for each edited function, counts the instructions on both sides. An
edited .func (the sigmoid) is measured inside the smallest kernel that calls it, as the code
that kernel reaches by CALL (the function and any helper it calls in turn).

Needs ptxas, cuobjdump and nvdisasm (the CUDA toolkit, or python -m pip install -r
requirements-cuda.txt: no GPU needed); nvcc too unless --generated names the compiler's PTX.

Examples:
  python ptx/sass_report.py                          # print the comparison, write nothing
  python ptx/sass_report.py --assemble               # does the edited PTX assemble? ptxas -v's answer
  python ptx/sass_report.py --json /tmp/sass.json
(The committed figures in ptx/README.md are docs/results/ptx_sass_sm90.json rendered by
docs/render.py; the record holds the command that wrote it, docs/README.md lists them all.)
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

EDITED = ROOT / "ptx" / "dense_kernels.ptx"


disasm = cli.load_file("cuda/sass.py")  # the tool lookup and the SASS parser

HEAD = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?(\w+)\s*\(", re.M)


def functions(ptx: str) -> dict[str, tuple[str, str]]:
    """PTX text -> {name: (kind 'entry'|'func', full text from the header to its closing brace)}.

    A declaration without a body (a prototype ending in ';') is skipped.
    """
    found = {}
    for m in HEAD.finditer(ptx):
        end = ptx.find("\n}", m.end())
        brace, semi = ptx.find("{", m.end()), ptx.find(";", m.end())
        if end < 0 or brace < 0 or (0 <= semi < brace and ")" in ptx[m.end():semi] and
                                    "{" not in ptx[m.end():semi]):
            continue
        found[m.group(2)] = (m.group(1), ptx[m.start():end + 2])
    return found


def normalised(text: str) -> list[str]:
    """Code lines only: comments go, and the hash of the source's path in internal names too."""
    lines = []
    for line in text.splitlines():
        code = line.split("//", 1)[0].rstrip()
        if code.strip():
            lines.append(re.sub(r"(_INTERNAL_|_GLOBAL__N__)[0-9a-f]{8}_", r"\1", code))
    return lines


def edited_functions(compiler: str, edited: str) -> list[str]:
    """Names of the functions whose code differs between the two PTX files, in file order."""
    a, b = functions(compiler), functions(edited)
    return [n for n in b if n in a and normalised(a[n][1]) != normalised(b[n][1])]


def tag(text: str) -> str | None:
    """The edit's marker in the PTX comments: EDIT-A, EDIT-B, ..."""
    m = re.search(r"//.*?\b(EDIT-[A-Z]\w*)", text)
    return m.group(1) if m else None


def called_code(code: list) -> list | None:
    """What a kernel reaches by CALL: each callee spans its target to the first RET after it."""
    keep = disasm.callee_addresses(code)
    return [i for i in code if i.addr in keep] if keep else None


def summary(code: list) -> dict:
    ops: dict[str, int] = {}
    for i in code:
        ops[i.op] = ops.get(i.op, 0) + 1
    calls = sum(1 for i in code if i.op.startswith("CALL"))
    return {**disasm.mix(code), "calls": calls, "opcodes": dict(sorted(ops.items()))}


def compare(before: dict, after: dict) -> dict[str, list[int]]:
    """Opcodes whose count changed: {opcode: [compiler's count, edited count]}."""
    names = sorted(set(before["opcodes"]) | set(after["opcodes"]))
    return {n: [before["opcodes"].get(n, 0), after["opcodes"].get(n, 0)] for n in names
            if before["opcodes"].get(n, 0) != after["opcodes"].get(n, 0)}


def assemble(ptx: Path, cubin: Path, ptxas: str, cuobjdump: str) -> tuple[dict, dict]:
    result = subprocess.run([ptxas, "-arch=sm_90", "-v", str(ptx), "-o", str(cubin)], capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"ptxas could not assemble {ptx}:\n{result.stderr[-3000:]}")
    return disasm.parse_sass(disasm.disassemble(cubin, cuobjdump)), disasm.parse_ptxas(result.stdout + result.stderr)


def compiler_ptx(generated: str | None) -> tuple[Path, str]:
    """The compiler's PTX: the given file, or what `bash ptx/regen.sh` writes."""
    if generated:
        return Path(generated), f"--generated {generated}"
    if disasm.find_tool("nvcc") is None:
        raise SystemExit("nvcc is needed to regenerate the compiler's PTX (bash ptx/regen.sh); "
                         "or pass --generated PATH")
    result = subprocess.run(["bash", str(ROOT / "ptx" / "regen.sh")], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"bash ptx/regen.sh failed:\n{result.stderr[-3000:]}")
    m = re.search(r"generated (\S+\.ptx)", result.stdout)
    path = ROOT / m.group(1).rstrip(";") if m else None
    if path is None or not path.is_file():
        made = sorted((ROOT / "ptx" / "generated").glob("*.ptx"), key=lambda p: p.stat().st_mtime)
        if not made:
            raise SystemExit("bash ptx/regen.sh ran but no PTX was found under ptx/generated/")
        path = made[-1]
    return path, "bash ptx/regen.sh"


def build(edited: Path, generated: str | None) -> dict:
    ptxas = disasm.find_tool("ptxas")
    cuobjdump, why = disasm.sass_tools()
    if ptxas is None or cuobjdump is None:
        raise SystemExit("this report needs ptxas and cuobjdump: " + (why or "ptxas not found"))
    compiler_path, how = compiler_ptx(generated)
    before_text, after_text = compiler_path.read_text(), edited.read_text()
    names = edited_functions(before_text, after_text)
    if not names:
        raise SystemExit(f"{edited.name} has the same code as the compiler's PTX: no edit to report")
    after_funcs = functions(after_text)
    with tempfile.TemporaryDirectory() as tmp:
        sass_b, use_b = assemble(compiler_path, Path(tmp) / "compiler.cubin", ptxas, cuobjdump)
        sass_a, use_a = assemble(edited, Path(tmp) / "edited.cubin", ptxas, cuobjdump)
    edits = []
    for name in names:
        kind, text = after_funcs[name]
        rec: dict = {"function": name, "kind": kind, "tag": tag(text)}
        if kind == "entry":
            rec["measured_in"] = name
            rec["scope"] = "the whole kernel"
            before, after = summary(sass_b[name]), summary(sass_a[name])
            rec["registers"] = [use_b.get(name, {}).get("registers"), use_a.get(name, {}).get("registers")]
        else:
            callers = [n for n, (k, t) in after_funcs.items()
                       if k == "entry" and re.search(rf"\bcall[^;]*\b{re.escape(name)}\b", t, re.S)]
            if not callers:
                rec["note"] = "no kernel calls it: nothing to measure"
                edits.append(rec)
                continue
            # The kernel whose calls go to the fewest places (ideally the edited function only: a
            # 64-bit `%` or `/` is a call to a helper too, and would be counted with it), then the smallest.
            probe = min(callers, key=lambda n: (len(disasm.call_targets(sass_a.get(n, []))), len(sass_a.get(n, [])), n))
            rec["measured_in"] = probe
            part_b, part_a = called_code(sass_b[probe]), called_code(sass_a[probe])
            if part_b is None or part_a is None:
                rec["scope"] = "the whole calling kernel (ptxas inlined the function)"
                part_b, part_a = sass_b[probe], sass_a[probe]
            else:
                rec["scope"] = "the code the kernel reaches by CALL: the function and its helpers"
            before, after = summary(part_b), summary(part_a)
        rec.update(compiler=before, edited=after, changed=compare(before, after))
        edits.append(rec)
    return {"arch": "sm_90", "edited_ptx": os.path.relpath(edited, ROOT), "compiler_ptx_from": how,
            "tools": {"ptxas": disasm.tool_version(ptxas), "cuobjdump": disasm.tool_version(cuobjdump)},
            "edits": edits}


# ---------------------------------------------------------------------------------------
# The table (docs/render.py marker kind "sass")
# ---------------------------------------------------------------------------------------
def _loads(d: dict) -> str:
    return "+".join(f"{n}×{w}-bit" for w, n in sorted(d.items(), key=lambda kv: int(kv[0]))) or "0"


def table(record: dict) -> str:
    rows = ["| edit | function (measured in) | SASS | instructions | FFMA | MUFU | CALL | LDG | STG |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for e in record["edits"]:
        if "compiler" not in e:
            continue
        where = e["function"] if e["measured_in"] == e["function"] else f"{e['function']} (in {e['measured_in']})"
        for side in ("compiler", "edited"):
            s = e[side]
            mufu = ", ".join(f"{n}× {op}" for op, n in s["mufu"].items()) or "0"
            label = "compiler's PTX" if side == "compiler" else "edited PTX"
            rows.append(f"| {e['tag'] or '–'} | {where} | {label} | {s['instructions']} | {s['fma']} | {mufu} | "
                        f"{s['calls']} | {_loads(s['ldg'])} | {_loads(s['stg'])} |")
    rows.append(f"\n{record['arch']}, ptxas {record['tools']['ptxas']}, compiler's PTX from "
                f"`{record['compiler_ptx_from']}`, {record['date']}: `{record['command']}`")
    for e in record["edits"]:
        if "compiler" in e:
            changed = ", ".join(f"`{op}` {a}→{b}" for op, (a, b) in e["changed"].items())
            rows.append(f"\n{e['tag'] or e['function']}: {e['scope']}; opcodes whose count changed "
                        f"(compiler's → edited): {changed}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = cli.parser(doc)
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    parser.add_argument("--ptx", default=str(EDITED), metavar="PATH", help="the hand-edited PTX (default: %(default)s)")
    parser.add_argument("--generated", metavar="PATH",
                        help="the compiler's PTX (default: run bash ptx/regen.sh and use what it writes)")
    parser.add_argument("--assemble", action="store_true",
                        help="only assemble the PTX (--ptx) for sm_90 and print what ptxas -v says (needs ptxas alone)")
    args = parser.parse_args(argv)
    if not Path(args.ptx).is_file():
        parser.error(f"no such PTX file: {args.ptx}")
    if args.assemble:
        ptxas = disasm.find_tool("ptxas")
        if ptxas is None:
            raise cli.UserError("ptxas not found (it comes with the CUDA toolkit; or set CUDA_HOME to its folder)")
        result = subprocess.run([ptxas, "-arch=sm_90", "-v", args.ptx, "-o", os.devnull], capture_output=True,
                                text=True, timeout=900)
        print((result.stdout + result.stderr).strip())
        name = os.path.relpath(args.ptx)
        print(f"{name}: {'assembles' if result.returncode == 0 else 'does NOT assemble'} for sm_90 ({ptxas})")
        return 0 if result.returncode == 0 else 1
    if args.generated and not Path(args.generated).is_file():
        parser.error(f"no such PTX file: {args.generated}")
    json_path = cli.check_output(args.json, "--json")
    if disasm.sass_tools()[0] is None:
        print(f"error: {disasm.sass_tools()[1]}", file=sys.stderr)
        return 2
    record = build(Path(args.ptx).resolve(), args.generated)
    record["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record["command"] = " ".join(["python ptx/sass_report.py", *(sys.argv[1:] if argv is None else argv)])
    return cli.publish(table(record), [(json_path, cli.json_writer(record, indent=1))])


if __name__ == "__main__":
    cli.run(main)
