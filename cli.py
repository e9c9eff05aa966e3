"""What every script does around its work, written once: check first, never a traceback.

A user's mistake gets one line and an exit status, never a traceback:

- ``UserError(message)``, raised anywhere: ``script: message`` on stderr, exit 2 (or ``code``);
- Ctrl-C: ``script: interrupted``, exit 130, as a shell reports SIGINT;
- a reader that closed the pipe (``| head``): nothing more is written, exit 141 (SIGPIPE's);
- memory that cannot be allocated: one line saying so, exit 1.

Outputs and optional dependencies are checked before the work starts (``check_output``,
``need_matplotlib``, ``check_plot``, ``check_memory``), and a record read from a file gets one
line for whatever is wrong with it (``read_record``). Output paths are never invented: a
missing folder is an error, not created, so a typo does not scatter folders. Results are written with
``write_outputs``, which never loses what was computed: a file that fails to write is
reported after the results were printed. A script's parser comes from its docstring
(``parser``; ``command`` for a subcommand, whose --help shows the examples that run it), and
messages name the script as it was typed (``python -m parallel.collectives.costmodel`` for a module).

    def main(argv=None) -> int: ...
    if __name__ == "__main__":
        cli.run(main)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent

# torch is imported only where it is needed: the scripts import this module before torch, so
# that a Ctrl-C during their imports (importing torch takes seconds) is one line too.
_excepthook = sys.excepthook


@contextlib.contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """Held while ``out`` is built: a second process about to build the same file waits for the
    first, then finds the file there (the caller checks again inside), so that a library is
    compiled once however many processes ask for it at the same time (tests/conftest.py builds
    ahead, in the background, while tests run)."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield


def source_digest(files: Iterable[Path], *settings: str) -> str:
    """Twelve hex digits that change when any of ``files`` (name and bytes) or ``settings`` (the
    compiler, its flags, the tools) does: the name of a build kept per source state, so that a
    build is made once and an edit makes a new one."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update("\0".join(settings).encode())
    return digest.hexdigest()[:12]


def module_name(path: str) -> str:
    """The one name a file is loaded under: its path without ``.py``, ``/`` as ``_``
    (``cuda/static_report.py`` is ``cuda_static_report``; ``cuda/bench_gpu.py`` and
    ``tiles/bench_gpu.py`` stay apart)."""
    return re.sub(r"\W", "_", path.removesuffix(".py"))


def load_file(path: str, name: str | None = None) -> ModuleType:
    """The module in file `path` (relative to the repository's root), loaded once under
    module_name(path) (or `name`). The stage folders are not packages (``py/`` cannot be one:
    pytest ships a module ``py``; ``cuda`` is NVIDIA's Python package), so their scripts load each
    other by file, through this one function."""
    name = name or module_name(path)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _interrupted_hook(kind, value, tb) -> None:
    if issubclass(kind, KeyboardInterrupt):
        # Python then ends the process by SIGINT itself (status 130 in a shell).
        print(f"\n{_prog()}: interrupted", file=sys.stderr)
    else:
        _excepthook(kind, value, tb)


sys.excepthook = _interrupted_hook


class UserError(Exception):
    """A mistake in the command line or its inputs: reported in one line, no traceback."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _prog() -> str:
    """The script's name as the user typed it: ``benchmark.py``, or ``python -m parallel.collectives.costmodel``
    for a module run with -m (which cannot run by its file name: its imports need the root)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and not spec.name.endswith("__main__"):
        return f"python -m {spec.name}"
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


def _examples(doc: str) -> str:
    return doc[doc.index("Examples:"):]


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser, from its docstring: the first paragraph above the options, the
    paragraph from "Examples:" on below them, as written."""
    return argparse.ArgumentParser(prog=_prog(), description=doc.split("\n\n")[0], epilog=_examples(doc),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def command(sub: argparse._SubParsersAction, name: str, doc: str, help: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with the docstring's examples that run it (every one
    must have at least one: tests/test_cli_errors.py checks)."""
    def runs(line: str) -> bool:  # "python -m pkg.mod NAME ..." or "python dir/script.py NAME ..."
        words = line.split("#")[0].split()
        return words[:1] == ["python"] and words[3 if words[1:2] == ["-m"] else 2:][:1] == [name]

    lines = [line for line in _examples(doc).splitlines() if runs(line)]
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                          epilog="Examples:\n" + "\n".join(lines) + "\n",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _out_of_memory(e: BaseException) -> bool:
    torch = sys.modules.get("torch")  # not imported: not torch's error (and importing it may be what failed)
    return isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError)) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


def run(main: Callable[[], int | None]) -> None:
    """Run a script's main(), turning user errors into one line and an exit status."""
    prog = _prog()
    try:
        code = main() or 0
        sys.stdout.flush()  # inside the try: a closed pipe shows up here at the latest
    except UserError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = e.code
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # The reader is gone. Point stdout at /dev/null so that the interpreter's own flush
        # at exit does not raise again, and leave as a process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    except Exception as e:
        if not _out_of_memory(e):
            raise
        print(f"{prog}: out of memory: {str(e).splitlines()[0][:300]}; choose smaller sizes", file=sys.stderr)
        code = 1
    sys.exit(code)


def positive(kind: type = float, allow_zero: bool = False) -> Callable[[str], float | int]:
    """An argparse type: a finite number above zero (or at least zero)."""

    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a {'number' if kind is float else 'whole number'}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            if kind is int:
                raise argparse.ArgumentTypeError(f"must be at least {0 if allow_zero else 1}, got {text!r}")
            raise argparse.ArgumentTypeError(f"must be a finite number {'>= 0' if allow_zero else '> 0'}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def check_output(path: str | None, flag: str) -> Path | None:
    """Before any work: ``path`` can be written as a file. Returns it as a Path (or None).

    Refuses a directory, a folder that does not exist (it is not created) and a folder this
    process cannot create a file in (tested with a probe file, created and removed at once);
    an existing file is opened for appending and left unchanged.
    """
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{flag} {path} is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise UserError(f"{flag} {path}: the folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is not a folder")
    try:
        if p.exists():
            with open(p, "ab"):
                pass
        else:  # a probe of our own name: processes checking the same path at once do not collide
            fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".probe")
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return p


def need_matplotlib(flag: str = "--plot") -> None:
    """Before any work: matplotlib (an optional extra) imports, with a backend that needs no display."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        raise UserError(f"{flag} needs matplotlib, which is not installed: pip install matplotlib") from None


def check_plot(path: str | None, flag: str = "--plot") -> Path | None:
    """Before any work: a figure can be written at ``path`` (check_output), matplotlib is
    installed, and the name ends in a format matplotlib writes (with no suffix it would add
    one of its own, writing another file than the one asked for)."""
    p = check_output(path, flag)
    if p is None:
        return None
    need_matplotlib(flag)
    from matplotlib.figure import Figure

    suffix = p.suffix.lstrip(".").lower()
    if suffix not in Figure().canvas.get_supported_filetypes():
        what = f".{suffix} files" if suffix else "a name without a suffix"
        raise UserError(f"{flag} {path}: matplotlib cannot write {what}; end the name in .png, .pdf or .svg")
    return p


def read_record(path: str, flag: str, kind: str | None = None, writer: str = "", keys: tuple[str, ...] = ()) -> dict:
    """A JSON record a script reads, or one line saying what is wrong with it: missing,
    unreadable, not JSON, not an object, another kind of record (its "benchmark" field is not
    ``kind``; ``writer`` says what writes the right kind), or without the fields ``keys``."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file") from None
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{flag} {path}: not a JSON record ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(record, dict):
        raise UserError(f"{flag} {path}: not a JSON record (expected an object, got {type(record).__name__})")
    if kind is not None and record.get("benchmark") != kind:
        found = record.get("benchmark")
        found = f"a record of kind {found!r}" if isinstance(found, str) else "not a benchmark record"
        by = f", written by {writer}" if writer else ""
        raise UserError(f"{flag} {path}: {found}; this needs a record of kind {kind!r}{by}")
    missing = [k for k in keys if k not in record]
    if missing:
        raise UserError(f"{flag} {path}: the record lacks {', '.join(missing)} "
                        "(damaged, or written by another version)")
    return record


def available_memory(device: str = "cpu") -> int | None:
    """Bytes that can be allocated now on the device, or None if unknown."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(nbytes: int, device: str = "cpu", what: str = "these sizes",
                 advice: str = "choose smaller sizes") -> None:
    """Before allocating: refuse what cannot fit, estimated from the sizes."""
    free = available_memory(device)
    if free is not None and nbytes > 0.9 * free:
        raise UserError(f"{what} need about {nbytes / 2**30:,.1f} GiB of memory on {device}, and "
                        f"{free / 2**30:,.1f} GiB is available: {advice}")


def write_outputs(writers: list[tuple[Path | None, Callable[[Path], None]]]) -> list[str]:
    """Write every output that was asked for; return one message per failure (never raises
    for an OSError), so that the caller can still print its results, then the errors."""
    errors = []
    for path, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except OSError as e:
            errors.append(f"could not write {path}: {e.strerror or e}; the results are printed above")
    return errors


def json_writer(record: dict, indent: int = 2) -> Callable[[Path], None]:
    """The writer of one JSON record, for write_outputs."""
    return lambda path: Path(path).write_text(json.dumps(record, indent=indent) + "\n")


def publish(text: str, writers: list[tuple[Path | None, Callable[[Path], None]]]) -> int:
    """The end of a script: files first (a reader that closes stdout early must not cost them),
    then ``text`` on stdout, then one line per file that failed to write. Returns the exit
    status: 1 if a file failed, else 0. Nothing computed is lost either way."""
    errors = write_outputs(writers)
    print(text, flush=True)
    for e in errors:
        print(f"{_prog()}: {e}", file=sys.stderr)
    return 1 if errors else 0


CUDA_TOOLS_PIP = "python -m pip install -r requirements-cuda.txt"  # the toolkit's programs, from the package index


def cuda_tool(name: str) -> str | None:
    """A CUDA program (nvcc, ptxas, cuobjdump, nvdisasm): on PATH, in $CUDA_HOME/bin, in the
    bin folder of NVIDIA's pip wheels (requirements-cuda.txt: nvidia/cu13/bin in site-packages),
    or in /usr/local/cuda/bin, in that order; None where none is. The wheels come before the
    conventional folder, so that with PATH free of a system toolkit the package-index route is
    the one taken (CI checks it that way)."""
    import shutil

    found = shutil.which(name)
    if found:
        return found
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / name] if os.environ.get("CUDA_HOME") else []
    spec = importlib.util.find_spec("nvidia")  # the namespace package of NVIDIA's wheels
    for base in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(Path(base).glob(f"*/bin/{name}"))
    candidates.append(Path("/usr/local/cuda/bin") / name)
    return next((str(p) for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


def stop_process_group(proc, grace_s: float, kill_wait_s: float | None = None) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session=True``): SIGINT
    first, as Ctrl-C would, so that what it runs can unlock its builds and clean up; SIGKILL after
    ``grace_s``. ``kill_wait_s`` bounds the wait after SIGKILL (a process stuck in a GPU driver may
    not die even then); None waits until it does."""
    import signal
    import subprocess

    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_or_stop(proc, limit_s: float, grace_s: float, kill_wait_s: float | None = None) -> int | None:
    """``proc``'s exit status if it ends within ``limit_s``; else its process group stopped
    (stop_process_group) and None."""
    import subprocess

    try:
        return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        stop_process_group(proc, grace_s, kill_wait_s)
        return None
