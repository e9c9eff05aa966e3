"""The committed records under docs/results/, and the commands that take them again.

Every JSON record names the command that wrote it ("command"), and that command names the
record's own path. A picture is drawn by a record's command (--plot) or carries the command that
drew it (record_info.save_figure writes it into the file). This script reads those commands back:
--list shows them in the order --run takes them (a record that another command reads comes
first), and --run runs them, from the repository root, one at a time. Take timings on a quiet
machine: nothing else running, and nothing else started until the run ends.

--run never overwrites a record unless --overwrite is given, refuses before it starts anything
when a picture needs matplotlib and it is missing, and skips commands that need a GPU on a
machine without one. `python docs/records.py --run --overwrite` takes every record afresh; then
`python docs/render.py` rewrites the chapters' tables.

Examples:
  python docs/records.py --list                      # every record, in run order, with its command
  python docs/records.py --run --dry-run             # what --run would do, without running anything
  python docs/records.py --run cpu_1024 --dry-run    # one record (name with or without .json)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

OUTPUT_FLAGS = ("--json", "--plot", "--out", "--trace")  # the flags under which the scripts write a file
PICTURES = (".png", ".svg")
BLOCK = re.compile(r"<!-- records: \S+ -->\n.*?<!-- end records -->", re.S)  # the generated list itself
# A GPU record's file name carries its card (cuda_gpu_h100.json); "{card}" in a chapter's marker or
# link stands for any card (cuda_gpu_{card}.json): records of one kind, one per card.
CARD = "{card}"
MODEL = re.compile(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b")  # H100, H200, A100, V100 in a device's name
CARD_TAG = r"[a-z]{1,2}\d{2,4}[a-z]?"  # the same, as a file name carries it
CITED = re.compile(r"results/([\w.{}-]+\.(?:json|png|svg))")


def card_tag(device: str) -> str | None:
    """h100, h200, a100...: the model in a GPU's name, as records' file names carry it; None if none."""
    found = MODEL.search(device)
    return found.group(1).lower() if found else None


def kind(name: str, record: dict | None) -> str:
    """The record's kind: its file name with its card, the one its own device names, as "{card}"
    (cuda_gpu_h200.json -> cuda_gpu_{card}.json); any other record is a kind of its own."""
    device = device_of(record) if isinstance(record, dict) else None
    tag = card_tag(device) if device and not device.startswith("cpu") else None
    if tag is None:
        return name
    return re.sub(rf"(?<=_){tag}(?=[_.])", CARD, name, count=1)


def of_kind(pattern: str, folder: Path = RESULTS) -> list[tuple[str, dict]]:
    """The records in ``folder`` of kind ``pattern`` (a name with "{card}"), newest first: by the
    date each records, then by name."""
    head, _, tail = pattern.partition(CARD)
    match = re.compile(re.escape(head) + f"({CARD_TAG})" + re.escape(tail) + "$")
    found = []
    for path in folder.glob(head + "*" + tail):
        if match.match(path.name):
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                raise cli.UserError(f"{path} is not a JSON record: {e}") from None
            if isinstance(data, dict) and kind(path.name, data) == pattern:
                found.append((path.name, data))
    return sorted(found, key=lambda nd: (str(nd[1].get("date", "")), nd[0]), reverse=True)


@dataclass
class Record:
    """One record (a JSON file, with the pictures its command draws), or a picture of its own."""

    name: str  # the file name in its folder (docs/results/)
    folder: Path
    command: str | None
    device: str | None = None
    date: str | None = None
    outputs: list[str] = field(default_factory=list)  # the docs/results files the command writes
    inputs: list[str] = field(default_factory=list)  # the docs/results files it reads

    @property
    def script(self) -> str:
        """The script the command runs, as a path (a module run with -m as its file)."""
        args = shlex.split(self.command or "")[1:]
        if args[:1] == ["-m"] and len(args) > 1:
            return args[1].replace(".", "/") + ".py"
        return args[0] if args else ""

    @property
    def needs_gpu(self) -> bool:
        args = shlex.split(self.command or "")
        pairs = set(zip(args, args[1:]))
        gpu_scripts = ("cuda/bench_gpu.py", "tiles/bench_gpu.py")  # GPU-only whatever their flags
        return ("--device", "cuda") in pairs or ("-m", "cuda") in pairs or ("-m", "ptx") in pairs or \
            self.script in gpu_scripts

    @property
    def needs_cuda_torch(self) -> bool:
        """A command that builds the GPU stages (.ci/gpu.py --time-build): a CUDA build of torch
        and nvcc, no GPU."""
        return self.script == ".ci/gpu.py" and "--time-build" in shlex.split(self.command or "")

    @property
    def needs_matplotlib(self) -> bool:
        return any(Path(p).suffix in PICTURES for p in self.outputs)


def _files_in(command: str, folder: Path) -> tuple[list[str], list[str]]:
    """(outputs, inputs): the files under ``folder`` that a command names after an output flag,
    and the ones it names otherwise (records it reads), as names relative to ``folder``."""
    args = shlex.split(command)
    outputs, inputs = [], []
    for k, arg in enumerate(args):
        path = Path(ROOT, arg).resolve()
        if path.parent != folder.resolve():
            continue
        (outputs if k > 0 and args[k - 1] in OUTPUT_FLAGS else inputs).append(path.name)
    return outputs, inputs


def device_of(record: dict) -> str | None:
    device = record.get("device")
    if isinstance(device, dict):  # a static report names the GPU it was compiled for
        device = device.get("name")
    return str(device) if device else None


def picture_command(path: Path) -> str | None:
    """The command a picture carries: a PNG's text chunk "Command", an SVG's description."""
    data = path.read_bytes()
    if path.suffix == ".svg":
        found = re.search(rb"<dc:description>(.*?)</dc:description>", data, re.S)
        return found.group(1).decode() if found else None
    at = 8  # a PNG: the signature, then chunks of (length, type, data, CRC)
    while at + 8 <= len(data):
        length, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        if kind == b"tEXt":
            key, _, text = data[at + 8:at + 8 + length].partition(b"\0")
            if key == b"Command":
                return text.decode("latin-1")
        if kind == b"IEND":
            break
        at += 12 + length
    return None


def load(folder: Path = RESULTS) -> list[Record]:
    """Every record in ``folder``, each JSON with the pictures its command draws; a picture that no
    record's command draws is a record of its own (its command from the file, or None)."""
    records, drawn = [], set()
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise cli.UserError(f"{path.relative_to(ROOT)} is not a JSON record: {e}") from None
        command = data.get("command") if isinstance(data, dict) else None
        outputs, inputs = _files_in(command, folder) if command else ([], [])
        inputs += [Path(p).name for p in data.get("reads", []) if Path(p).name not in inputs]
        records.append(Record(path.name, folder, command, device_of(data), data.get("date"), outputs, inputs))
        drawn.update(outputs)
    for path in sorted(p for p in folder.iterdir() if p.suffix in PICTURES and p.name not in drawn):
        command = picture_command(path)
        outputs, inputs = _files_in(command, folder) if command else ([], [])
        records.append(Record(path.name, folder, command, None, None, outputs, inputs))
    return records


def run_order(records: list[Record]) -> list[Record]:
    """Records whose files others read first; otherwise grouped by script (one script's runs
    together), then by name. Refuses a cycle."""
    by_output = {out: r for r in records for out in r.outputs}
    pending = sorted(records, key=lambda r: (r.script, r.name))
    order: list[Record] = []
    done: set[str] = set()
    while pending:
        ready = next((r for r in pending if all(by_output.get(i) is None or by_output[i].name in done or
                                                by_output[i] is r for i in r.inputs)), None)
        if ready is None:
            raise cli.UserError("the records read each other in a cycle: " + ", ".join(r.name for r in pending))
        order.append(ready)
        done.add(ready.name)
        pending.remove(ready)
    return order


def citations(root: Path = ROOT) -> dict[str, list[str]]:
    """File name under docs/results/ (or a kind: a name with "{card}") -> the Markdown files that
    name it (a render marker, a link or a picture), outside the generated list of records."""
    cited: dict[str, list[str]] = {}
    for md in sorted(root.glob("**/*.md")):
        parts = md.relative_to(root).parts
        if "build" in parts or any(p.startswith(".") and p != ".ci" for p in parts):  # .ci/README.md cites
            continue
        text = BLOCK.sub("", md.read_text())
        for name in sorted(set(CITED.findall(text))):
            cited.setdefault(name, []).append(md.relative_to(root).as_posix())
    return cited


def shown_in(name: str, cited: dict[str, list[str]], folder: Path = RESULTS) -> list[str]:
    """The Markdown files that show the record or picture ``name`` of ``folder``: those that name
    it, and those that name its kind, by "{card}" or by another card's record of that kind (a
    second card's record of a kind a chapter shows is one of that chapter's records)."""
    found = set(cited.get(name, []))
    if name.endswith(".json") and (folder / name).is_file():
        mine = kind(name, _read(folder / name))
        for other, pages in cited.items():
            theirs = other if CARD in other or not (folder / other).is_file() else kind(other, _read(folder / other))
            if other != name and theirs == mine:
                found.update(pages)
    return sorted(found)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def table(folder: Path) -> str:
    """The Markdown list of records (docs/render.py, marker kind `records`)."""
    from collections import Counter

    cited = citations()
    found = run_order(load(folder))
    common = Counter(r.device for r in found if r.device).most_common(1)
    common = common[0][0] if common else None
    rows = ["| record | command | taken | shown in |", "|---|---|---|---|"]
    for r in found:
        taken = ", ".join(x for x in ((r.date or "")[:10], r.device if r.device != common else "") if x) or "–"
        shown = ", ".join(sorted({md for n in [r.name, *r.outputs] for md in shown_in(n, cited, folder)})) or "nowhere"
        command = f"`{r.command}`" if r.command else "no command recorded"
        rows.append(f"| `{r.name}` | {command} | {taken} | {shown} |")
    if common:
        rows.append(f"\nTaken on {common} unless the row names another device.")
    return "\n".join(rows)


def select(records: list[Record], names: list[str]) -> list[Record]:
    wanted = {n if Path(n).suffix else n + ".json" for n in names}
    known = {r.name for r in records} | {o for r in records for o in r.outputs}
    unknown = sorted(wanted - known)
    if unknown:
        raise cli.UserError(f"no record named {', '.join(unknown)} under docs/results/ (see --list)")
    return [r for r in records if not wanted or r.name in wanted or wanted & set(r.outputs)]


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print every record in run order, with its command")
    what.add_argument("--run", nargs="*", metavar="NAME", help="run the commands of these records (default: all)")
    parser.add_argument("--overwrite", action="store_true", help="--run: replace records that exist")
    parser.add_argument("--dry-run", action="store_true", help="--run: print the commands, run nothing")
    args = parser.parse_args(argv)
    if (args.overwrite or args.dry_run) and args.run is None:
        parser.error("--overwrite and --dry-run go with --run")
    records = run_order(load())
    if args.list:
        for k, r in enumerate(records, 1):
            reads = f"  (reads {', '.join(r.inputs)})" if r.inputs else ""
            gpu = "  [needs a GPU]" if r.needs_gpu else ""
            print(f"{k:2d}. {r.name}{gpu}{reads}\n    {r.command or 'no command recorded'}")
        return 0
    chosen = select(records, args.run)
    return run(chosen, overwrite=args.overwrite, dry_run=args.dry_run)


def run(chosen: list[Record], overwrite: bool, dry_run: bool) -> int:
    # Everything that would stop the run is checked before the first command starts.
    missing = [r.name for r in chosen if not r.command]
    if missing and not dry_run:
        raise cli.UserError(f"no command recorded for {', '.join(missing)}: nothing says how to take it again")
    for name in missing:
        print(f"cannot take {name} again: no command recorded", file=sys.stderr)
    chosen = [r for r in chosen if r.command]
    exist = [o for r in chosen for o in r.outputs if (r.folder / o).exists()]
    if exist and not overwrite and not dry_run:
        raise cli.UserError(f"{len(exist)} of the files these commands write exist ({', '.join(exist[:4])}"
                            f"{', ...' if len(exist) > 4 else ''}); add --overwrite to replace them")
    if any(r.needs_matplotlib for r in chosen) and not dry_run:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise cli.UserError("these commands draw pictures and need matplotlib (pip install matplotlib): "
                                + ", ".join(r.name for r in chosen if r.needs_matplotlib)) from None
    import torch

    gpu = torch.cuda.is_available()
    why = {r.name: "needs a GPU (this machine has none)" for r in chosen if r.needs_gpu and not gpu}
    why.update({r.name: f"needs a CUDA build of torch and nvcc (this torch is {torch.__version__})"
                for r in chosen if r.needs_cuda_torch and torch.version.cuda is None})
    skipped = [r for r in chosen if r.name in why]
    todo = [r for r in chosen if r not in skipped]
    for r in skipped:
        print(f"skip  {r.name}: {why[r.name]}", file=sys.stderr)
    if not dry_run and hasattr(os, "getloadavg"):
        load1 = os.getloadavg()[0]
        print(f"load average {load1:.2f} over the last minute: timings need a quiet machine", file=sys.stderr)
    failed: set[str] = set()
    lost: set[str] = set()  # the files of the records that failed
    started = time.monotonic()
    for k, r in enumerate(todo, 1):
        blocked = [i for i in r.inputs if i in lost]
        if blocked:
            print(f"[{k}/{len(todo)}] {r.name}: skipped, it reads {', '.join(blocked)}, which failed", flush=True)
            failed.add(r.name)
            lost.update(r.outputs)
            continue
        print(f"[{k}/{len(todo)}] {r.name}: {r.command}", flush=True)
        if dry_run:
            continue
        argv = shlex.split(r.command)
        if argv[0] == "python":
            argv[0] = sys.executable
        t0 = time.monotonic()
        status = subprocess.run(argv, cwd=ROOT).returncode
        took = time.monotonic() - t0
        if status != 0:
            failed.add(r.name)
            lost.update(r.outputs)
            print(f"[{k}/{len(todo)}] {r.name}: FAILED (exit status {status}) after {took:.0f} s", flush=True)
        else:
            print(f"[{k}/{len(todo)}] {r.name}: done in {took:.0f} s", flush=True)
    if not dry_run:
        print(f"{len(todo) - len(failed)} of {len(todo)} taken in {(time.monotonic() - started) / 60:.1f} min"
              + (f"; failed: {', '.join(sorted(failed))}" if failed else "")
              + (f"; skipped (no GPU or no CUDA torch): {len(skipped)}" if skipped else "")
              + ". Then: python docs/render.py", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    cli.run(main)
