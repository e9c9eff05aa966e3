"""Test vectors for the tensor cores' accumulation: inputs whose exact, rounded sum and the H100's
truncated block sum differ, with both models' expected float32 bits, for the emulator and a GPU.

One vector is one block D = C + Σ a_k·b_k of a tensor-core instruction (K = 16 bfloat16 or
float16 products, 8 tf32 ones; float32 C and D). Two models give its expected bits, both encoded
here from the published description alone, in exact rational arithmetic (fractions), apart from
the emulator's C++ (cuda/emulate/tc_accumulate.h), which tests/test_tc_accumulation.py holds
against them:
- exact: the exact sum, rounded once to float32, to nearest (ties to even);
- h100: the block FMA of Khattak and Mikaitis's H100 model (arXiv 2512.07004; the authors'
  models/H100TC.m): every product aligned by the sum of its operands' exponents (a subnormal
  operand's exponent is its format's smallest), C by its own; M the largest of these; each term's
  magnitude cut to units of 2^(M-25) (float32's 23 fraction bits and 2 extra), the cut terms added
  exactly, the sum cut to float32 (toward zero).
The vectors are of the papers' kind (Fasi, Higham, Mikaitis, Pranesh 2021; Khattak and Mikaitis
2025): products below the kept bits beside a large one, an accumulator that dominates,
cancellation, signs, carries, a product whose significand product is 2 or more, a float16
subnormal operand; and random ones. The papers' own input vectors were not reachable from here,
so none of theirs is among them.

--emulate runs every vector through the emulator's probes (mma.sync m16n8k16 bf16/f16, m16n8k8
tf32, wgmma m64n32k16 bf16/f16, m64n128k8 tf32: cuda/tensor_cores/accumulation_probe.cuh) under
each model and checks each gives its model's bits. --gpu builds accumulation_probe.cu with nvcc,
runs the same probes on the GPU, and says which model each instruction's results match, vector by
vector (it needs a GPU with sm_90a: an H100 or H200).

Examples:
  python cuda/tensor_cores/accumulation_vectors.py                      # the vectors, as a table
  python cuda/tensor_cores/accumulation_vectors.py --json /tmp/vectors.json
  python cuda/tensor_cores/accumulation_vectors.py --emulate            # seconds (builds the emulator once)
  python cuda/tensor_cores/accumulation_vectors.py --gpu --record /tmp/tc_accumulation_gpu.json
The committed vectors:
  python cuda/tensor_cores/accumulation_vectors.py --json cuda/tensor_cores/accumulation_vectors.json
"""

from __future__ import annotations

import ctypes
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

VECTORS = HERE / "accumulation_vectors.json"
COMMAND = "python cuda/tensor_cores/accumulation_vectors.py --json cuda/tensor_cores/accumulation_vectors.json"
MODELS = ("exact", "h100")  # emu::Accumulation's order
FORMATS = ("bf16", "f16", "tf32")  # emu::TcFormat's order
K = {"bf16": 16, "f16": 16, "tf32": 8}
# Each format's fields: exponent bits, fraction bits, and where its pattern sits in the word given
# to the instructions (tf32: a float32 pattern whose low 13 bits are zero).
FIELDS = {"bf16": (8, 7, 0), "f16": (5, 10, 0), "tf32": (8, 10, 13)}
# The probes (dense_kernels::ProbeKind): kind -> (instruction, format)
PROBES = {0: ("mma.sync m16n8k16", "bf16"), 1: ("mma.sync m16n8k16", "f16"), 2: ("mma.sync m16n8k8", "tf32"),
          3: ("wgmma m64n32k16", "bf16"), 4: ("wgmma m64n32k16", "f16"), 5: ("wgmma m64n128k8", "tf32")}
PROBE_OUTPUTS = {0: 128, 1: 128, 2: 128, 3: 128 * 16, 4: 128 * 16, 5: 128 * 64}  # floats a vector
SEED = 2026
RANDOM_PER_FORMAT = 8


# ---------------------------------------------------------------------------------------------
# Numbers: patterns of each format <-> exact fractions
# ---------------------------------------------------------------------------------------------
def decode(fmt: str, word: int) -> Fraction:
    """The value of an operand word of `fmt` (finite patterns only)."""
    ebits, fbits, shift = FIELDS[fmt]
    pattern = word >> shift
    sign = -1 if pattern >> (ebits + fbits) & 1 else 1
    e, f = pattern >> fbits & ((1 << ebits) - 1), pattern & ((1 << fbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    if e == (1 << ebits) - 1:
        raise ValueError(f"{fmt} pattern {word:#x} is not finite")
    if e == 0:  # subnormal: 0.f · 2^(1-bias)
        return sign * Fraction(f, 1 << fbits) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(f, 1 << fbits)) * Fraction(2) ** (e - bias)


def encode(fmt: str, value: Fraction | int | float) -> int:
    """The word of `fmt` that holds `value` exactly; ValueError if none does."""
    value = Fraction(value)
    ebits, fbits, shift = FIELDS[fmt]
    bias = (1 << (ebits - 1)) - 1
    sign = 1 if value < 0 else 0
    mag = abs(value)
    if mag == 0:
        return sign << (ebits + fbits + shift)
    e = max(exponent(mag), 1 - bias)
    f = mag / Fraction(2) ** e * (1 << fbits)  # the significand in units of its last bit
    if f.denominator != 1 or e - (1 - bias) + (1 if f >= 1 << fbits else 0) >= (1 << ebits) - 1:
        raise ValueError(f"{float(value)!r} is not a {fmt} number")
    biased = e + bias if f >= 1 << fbits else 0
    return (sign << (ebits + fbits) | biased << fbits | (int(f) & ((1 << fbits) - 1))) << shift


def exponent(x: Fraction) -> int:
    """e with 2^e ≤ |x| < 2^(e+1), for x ≠ 0."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e if Fraction(2) ** e <= x else e - 1


def f32_value(bits: int) -> Fraction:
    """The value of a finite float32 pattern."""
    sign = -1 if bits >> 31 else 1
    e, f = bits >> 23 & 0xFF, bits & 0x7FFFFF
    if e == 0xFF:
        raise ValueError(f"float32 pattern {bits:#x} is not finite")
    return sign * (Fraction(f, 1 << 23) * Fraction(2) ** -126 if e == 0 else
                   (1 + Fraction(f, 1 << 23)) * Fraction(2) ** (e - 127))


def f32_bits(sign: int, units: int, unit_exp: int) -> int:
    """The float32 pattern of (-1)^sign · units · 2^unit_exp, which must be a float32 (or past its
    range: infinity)."""
    if units == 0:
        return sign << 31
    e = unit_exp + units.bit_length() - 1
    if e > 127:
        return sign << 31 | 0x7F800000
    if e < -126:  # subnormal: units of 2^-149
        f = units * 2 ** (unit_exp + 149) if unit_exp >= -149 else units >> (-149 - unit_exp)
        return sign << 31 | f
    f = units << (23 - (units.bit_length() - 1)) if units.bit_length() <= 24 else units >> (units.bit_length() - 24)
    return sign << 31 | (e + 127) << 23 | (f & 0x7FFFFF)


def round_f32(x: Fraction, nearest: bool) -> int:
    """x rounded to float32: to nearest (ties to even) or toward zero; past the range: infinity."""
    sign, mag = (1 if x < 0 else 0), abs(x)
    if mag == 0:
        return sign << 31
    q = max(exponent(mag) - 23, -149)  # the exponent of float32's last bit at |x|
    scaled = mag / Fraction(2) ** q
    units = scaled.numerator // scaled.denominator
    if nearest:
        rest = scaled - units
        units += 1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and units % 2) else 0
    return f32_bits(sign, units, q)


def float_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------------------------
# The two models, from their descriptions (see the docstring)
# ---------------------------------------------------------------------------------------------
def exact_model(fmt: str, c: int, a: list[int], b: list[int]) -> int:
    """The exact sum rounded once to float32, to nearest."""
    total = f32_value(c) + sum((decode(fmt, x) * decode(fmt, y) for x, y in zip(a, b)), Fraction(0))
    return round_f32(total, nearest=True)


def h100_model(fmt: str, c: int, a: list[int], b: list[int]) -> int:
    """Khattak and Mikaitis's H100 block FMA, float32 output (the docstring)."""
    ebits = FIELDS[fmt][0]
    emin = 2 - (1 << (ebits - 1))  # the smallest normal exponent: a subnormal operand aligns by it
    cv = f32_value(c)
    terms, alignments = [cv], ([max(exponent(cv), -126)] if cv else [])
    for x, y in zip(a, b):
        av, bv = decode(fmt, x), decode(fmt, y)
        terms.append(av * bv)
        if av and bv:
            alignments.append(max(exponent(av), emin) + max(exponent(bv), emin))
    if not alignments:
        return 0
    unit = max(alignments) - 25
    cut = [(1 if t >= 0 else -1) * int(abs(t) / Fraction(2) ** unit) for t in terms]  # toward zero
    total = sum(cut)
    if total == 0:
        return 0
    return round_f32(Fraction(total) * Fraction(2) ** unit, nearest=False)


def expected(fmt: str, c: int, a: list[int], b: list[int]) -> dict[str, int]:
    return {"exact": exact_model(fmt, c, a, b), "h100": h100_model(fmt, c, a, b)}


def double_sum_is_exact(fmt: str, c: int, a: list[int], b: list[int]) -> bool:
    """Whether C + Σ a·b summed in double, in k order (the emulator's exact model), is exact."""
    s = float(f32_value(c))
    total = f32_value(c)
    for x, y in zip(a, b):
        p = decode(fmt, x) * decode(fmt, y)
        s += float(p)
        total += p
    return Fraction(s) == total


# ---------------------------------------------------------------------------------------------
# The vectors
# ---------------------------------------------------------------------------------------------
def _two(e: int, m: Fraction | int = 1) -> Fraction:
    return Fraction(m) * Fraction(2) ** e


def _vector(name: str, fmt: str, why: str, c: Fraction | int, pairs: list[tuple[Fraction, Fraction]]) -> dict:
    k = K[fmt]
    if len(pairs) > k:
        raise ValueError(f"{name}: {len(pairs)} products, {fmt} takes {k}")
    pairs = pairs + [(Fraction(0), Fraction(0))] * (k - len(pairs))
    a, b = [encode(fmt, x) for x, _ in pairs], [encode(fmt, y) for _, y in pairs]
    cw = round_f32(Fraction(c), nearest=True)
    if f32_value(cw) != c:
        raise ValueError(f"{name}: C is not a float32")
    if not double_sum_is_exact(fmt, cw, a, b):
        raise ValueError(f"{name}: the emulator's double sum would round: outside the exact model's claim")
    return {"name": name, "format": fmt, "why": why, "c": f"{cw:#010x}", "a": [f"{w:#x}" for w in a],
            "b": [f"{w:#x}" for w in b], "expected": {m: f"{v:#010x}" for m, v in expected(fmt, cw, a, b).items()}}


def crafted(fmt: str) -> list[dict]:
    k, one = K[fmt], Fraction(1)
    top = 2 - Fraction(1, 1 << FIELDS[fmt][1])  # the format's largest significand
    v = [
        _vector("small products below the kept bits", fmt,
                "one product 1 and K-1 products of 2^-26, below 2^(0-25): the truncated sum drops them all",
                0, [(one, one)] + [(_two(-13), _two(-13))] * (k - 1)),
        _vector("accumulator above products below its kept bits", fmt,
                "C = 1 aligns the block; K products of 2^-26 are cut to nothing",
                1, [(_two(-13), _two(-13))] * k),
        _vector("final cut toward zero", fmt,
                "1 + 1.5·2^-24: 0.75 of float32's last bit, kept exactly (3 units of 2^-25), cut to 1; "
                "to nearest it is 1 + 2^-23",
                1, [(_two(-12, Fraction(3, 2)), _two(-12))]),
        _vector("final cut toward zero, negative", fmt,
                "the same negated: toward zero is -1, to nearest -(1 + 2^-23)",
                -1, [(_two(-12, Fraction(-3, 2)), _two(-12))]),
        _vector("cancellation to a small remainder", fmt,
                "C = 1 and a product -1 cancel; the remaining 1.5·2^-28 lay below the kept bits: +0",
                1, [(-one, one), (_two(-14, Fraction(3, 2)), _two(-14))]),
        _vector("partial cancellation", fmt,
                "1 - (1 - 2^-8) leaves 2^-8; the product 3·2^-27, cut at alignment, is lost",
                0, [(one, one), (-(1 - _two(-8)), one), (_two(-13, Fraction(3, 2)), _two(-14))]),
        _vector("negative products below the kept bits", fmt,
                "C = 1 and products -2^-26: cut toward zero they vanish (1); exactly 1 - 2^-24",
                1, [(-_two(-13), _two(-13))] * 4),
        _vector("product significand at least 2", fmt,
                "1.5·1.5 = 2.25 aligns by its operands' exponents (0 + 0), not by its own (1): the "
                "1.5·2^-24 products keep 3 units of 2^-25 each; aligned by 1 they would keep 1 unit of "
                "2^-24 (the authors' C model); exact, h100 and that reading give three different results",
                0, [(Fraction(3, 2), Fraction(3, 2))] + [(_two(-12, Fraction(3, 2)), _two(-12))] * (k - 1)),
        _vector("carries: every product at the top", fmt,
                f"K products of the largest significand squared ({float(top)}²): the sum grows past the "
                "products' exponent; both models keep its bits",
                0, [(top, top)] * k),
    ]
    if fmt == "f16":
        v.append(_vector("float16 subnormal operand", fmt,
                         "2^-20 is subnormal: it aligns by float16's smallest exponent, -14, so the block's "
                         "M is -14+10 = -4, and 1.5·2^-32 lies below 2^(M-25) (by its own exponent, -10, "
                         "it would be kept)",
                         0, [(_two(-20), _two(10)), (_two(-14, Fraction(3, 2)), _two(-18))]))
    return v


def random_vectors(fmt: str, count: int, seed: int) -> list[dict]:
    """Random operands over a spread of exponents, signs and C: both models' bits, kept where the
    emulator's double sum is exact (the exact model's claim)."""
    rng = random.Random(f"{seed}-{fmt}")
    fbits, k = FIELDS[fmt][1], K[fmt]
    out = []
    while len(out) < count:
        def number(lo: int, hi: int) -> Fraction:
            sig = 1 + Fraction(rng.randrange(1 << fbits), 1 << fbits)
            return (-1) ** rng.randrange(2) * sig * Fraction(2) ** rng.randint(lo, hi)
        pairs = [(number(-6, 6), number(-6, 6)) for _ in range(k)]
        c = round_f32(number(-4, 8), nearest=True)
        try:
            out.append(_vector(f"random {len(out) + 1}", fmt, f"random (seed {seed})", f32_value(c), pairs))
        except ValueError:
            continue
    return out


def vectors(seed: int = SEED, per_format: int = RANDOM_PER_FORMAT) -> list[dict]:
    return [v for fmt in FORMATS for v in crafted(fmt) + random_vectors(fmt, per_format, seed)]


def record(seed: int = SEED, per_format: int = RANDOM_PER_FORMAT) -> dict:
    return {
        "kind": "tc_accumulation_vectors",
        "command": COMMAND,
        "models": {
            "exact": "C + Σ a_k·b_k exactly, rounded once to float32 to nearest (ties to even): the emulator's default",
            "h100": "Khattak and Mikaitis's H100 block FMA (arXiv 2512.07004; models/H100TC.m): terms aligned to the "
                    "largest of the products' operand-exponent sums and C's exponent, M; each cut toward zero to "
                    "units of 2^(M-25); added exactly; the sum cut to float32 toward zero",
        },
        "block": "one instruction's D = C + Σ_k a_k·b_k: K = 16 (bf16, f16) or 8 (tf32); words: a 16-bit pattern "
                 "(bf16, f16) or a float32 pattern whose low 13 bits are zero (tf32); C and D float32 patterns",
        "seed": seed,
        "vectors": vectors(seed, per_format),
    }


def words(v: dict) -> tuple[int, list[int], list[int]]:
    return int(v["c"], 16), [int(w, 16) for w in v["a"]], [int(w, 16) for w in v["b"]]


def table(rec: dict) -> str:
    rows = ["| format | vector | C | exact | h100 |", "|---|---|---|---|---|"]
    for v in rec["vectors"]:
        c = struct.unpack("<f", struct.pack("<I", int(v["c"], 16)))[0]
        ex, h = (int(v["expected"][m], 16) for m in MODELS)
        show = [f"{struct.unpack('<f', struct.pack('<I', x))[0]!r} ({x:#010x})" for x in (ex, h)]
        rows.append(f"| {v['format']} | {v['name']} | {c!r} | {show[0]} | {show[1]}{'' if ex != h else ' (same)'} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Running them: the emulator (ctypes) and a GPU (accumulation_probe.cu, built with nvcc)
# ---------------------------------------------------------------------------------------------
def _arrays(vs: list[dict], kind: int):
    fmt = PROBES[kind][1]
    mine = [v for v in vs if v["format"] == fmt]
    k = K[fmt]
    a = (ctypes.c_uint32 * (k * len(mine)))(*[w for v in mine for w in words(v)[1]])
    b = (ctypes.c_uint32 * (k * len(mine)))(*[w for v in mine for w in words(v)[2]])
    c = (ctypes.c_uint32 * len(mine))(*[words(v)[0] for v in mine])
    out = (ctypes.c_uint32 * (PROBE_OUTPUTS[kind] * len(mine)))()
    return mine, a, b, c, out


def run_probe(run, kind: int, vs: list[dict]) -> list[tuple[dict, list[int]]]:
    """Each vector of the probe's format with the bits of every output element its block wrote.
    `run` is emu_tc_accumulation_run or tc_accumulation_run (the same arguments)."""
    mine, a, b, c, out = _arrays(vs, kind)
    if not mine:
        return []
    rc = run(kind, len(mine), a, b, ctypes.cast(c, ctypes.c_void_p), ctypes.cast(out, ctypes.c_void_p))
    if rc != 0:
        raise RuntimeError(f"probe {kind} ({' '.join(PROBES[kind])}): error {rc}")
    n = PROBE_OUTPUTS[kind]
    return [(v, list(out[i * n:(i + 1) * n])) for i, v in enumerate(mine)]


def _declare(fn) -> None:
    p = ctypes.c_void_p
    fn.argtypes = [ctypes.c_int, ctypes.c_int, p, p, p, p]
    fn.restype = ctypes.c_int


def emulator_library() -> ctypes.CDLL:
    """The emulation's library (cuda/emulated.py builds it), with this script's entries declared."""
    emu = cli.load_file("cuda/emulated.py")
    reason = emu.unavailable_reason()
    if reason:
        raise cli.UserError(f"cannot emulate: {reason}")
    lib = emu.library()
    _declare(lib.emu_tc_accumulation_run)
    lib.emu_set_accumulation.argtypes, lib.emu_set_accumulation.restype = [ctypes.c_int], ctypes.c_int
    return lib


def compare(results: list[tuple[dict, list[int]]], model: str) -> list[str]:
    """The mismatches, one line each: a vector whose outputs are not all its model's bits."""
    bad = []
    for v, outs in results:
        want = int(v["expected"][model], 16)
        wrong = [o for o in outs if o != want]
        if wrong:
            bad.append(f"{v['format']} {v['name']!r}: {len(wrong)} of {len(outs)} outputs differ from {model}'s "
                       f"{want:#010x} (e.g. {wrong[0]:#010x})")
    return bad


def emulate(rec: dict) -> tuple[str, bool]:
    lib = emulator_library()
    lines, ok = [], True
    previous = lib.emu_set_accumulation(0)
    try:
        for index, model in enumerate(MODELS):
            lib.emu_set_accumulation(index)
            for kind, (instruction, fmt) in PROBES.items():
                bad = compare(run_probe(lib.emu_tc_accumulation_run, kind, rec["vectors"]), model)
                ok = ok and not bad
                lines.append(f"emulator, {model} model, {instruction} {fmt}: "
                             + ("every vector's bits" if not bad else f"{len(bad)} mismatches"))
                lines += [f"  {b}" for b in bad]
    finally:
        lib.emu_set_accumulation(previous)
    return "\n".join(lines), ok


def gpu_library(build_dir: Path) -> ctypes.CDLL:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise cli.UserError("--gpu needs nvcc on the PATH")
    out = build_dir / "libtc_probe.so"
    cmd = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "-arch=sm_90a",
           str(HERE / "accumulation_probe.cu"), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise cli.UserError(f"building the probe failed: {' '.join(cmd)}\n{result.stderr[-3000:]}")
    lib = ctypes.CDLL(str(out))
    _declare(lib.tc_accumulation_run)
    return lib


def on_gpu(rec: dict) -> tuple[str, dict]:
    """Every probe on the GPU: for each vector, the model (or models) whose bits every output has."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = gpu_library(Path(tmp))
        measured, lines = [], []
        for kind, (instruction, fmt) in PROBES.items():
            results = run_probe(lib.tc_accumulation_run, kind, rec["vectors"])
            counts: dict[str, int] = {}
            for v, outs in results:
                same = len(set(outs)) == 1
                matches = [m for m in MODELS if same and outs[0] == int(v["expected"][m], 16)]
                label = "+".join(matches) or "neither"
                counts[label] = counts.get(label, 0) + 1
                measured.append({"instruction": instruction, "format": fmt, "vector": v["name"],
                                 "outputs_agree": same, "bits": f"{outs[0]:#010x}", "matches": matches})
            lines.append(f"{instruction} {fmt}: " + ", ".join(f"{m} {n}" for m, n in counts.items() if n))
    return "\n".join(lines), {"kind": "tc_accumulation_gpu", "vectors": rec.get("command"), "results": measured}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--json", metavar="PATH", help="write the vectors here")
    parser.add_argument("--emulate", action="store_true", help="run the vectors through the emulator's probes")
    parser.add_argument("--gpu", action="store_true", help="run them on this machine's GPU (sm_90a)")
    parser.add_argument("--record", metavar="PATH", help="with --gpu: write what the GPU gave here")
    args = parser.parse_args(argv)
    json_path, record_path = cli.check_output(args.json, "--json"), cli.check_output(args.record, "--record")
    if record_path is not None and not args.gpu:
        raise cli.UserError("--record writes what --gpu measured: give --gpu too")
    rec = record()
    text, writers, ok = table(rec), [(json_path, cli.json_writer(rec))], True
    if args.emulate:
        report, ok = emulate(rec)
        text += "\n\n" + report
    if args.gpu:
        report, measured = on_gpu(rec)
        text += "\n\n" + report
        writers.append((record_path, cli.json_writer(measured)))
    code = cli.publish(text, writers)
    return code or (0 if ok else 1)


if __name__ == "__main__":
    cli.run(main)
