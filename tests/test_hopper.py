"""The emulator's Hopper instructions (cuda/emulate/hopper.h) held against definitions written
separately from it, and the pipeline bugs it must catch.

Separate encodings, each in its own form:
- wgmma's accumulator table (PTX ISA, "Register Fragments" for m64nNk16, matrix D) as a
  thread/value layout over m + 64·n (CuTe's notation for the same table);
- the matrix descriptor's fields (PTX ISA, "Matrix Descriptor Format") as a table of bit ranges;
- the swizzles as the PTX ISA draws them (Table "swizzle atom layout"): 8 rows of S bytes, the
  16-byte chunk c of row r stored at c ^ (r mod S/16 groups), where the emulator XORs address bits;
- the canonical operand layouts, by walking their atoms (K-major: 8 rows a atom, atoms SBO apart;
  MN-major: S bytes of m or n a row, atoms LBO apart along it and SBO apart along k; no swizzle:
  8×16-byte core matrices, SBO apart along m or n and LBO apart along k);
- wgmma's arithmetic, on integer-valued operands placed in shared memory by those layouts, D read
  back through the thread/value layout;
- a TMA box: every element at (c0 + x, c1 + y) or zero outside the tensor, row-major in the box,
  swizzled by the rows-and-chunks rule.
Then the bugs: a consumer reading a stage before its barrier's phase completes, a wrong expect_tx
byte count, a producer refilling a stage still being read; and tables planted wrong
(-DCUDA_EMU_PLANT_FRAGMENT=3, 4) must fail the checks above.
"""

from __future__ import annotations

import ctypes
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from ptx_isa import SPAN, SWIZZLE, d_table, encode, swizzle_rows

from conftest import ROOT, load_script

emu = load_script("cuda/emulated.py")
if emu.unavailable_reason():
    pytest.skip(f"the emulation {emu.unavailable_reason()}", allow_module_level=True)

P, U32, U64, I32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int


def typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.emu_wgmma_fragment.argtypes = [I32, I32, ctypes.POINTER(I32), ctypes.POINTER(I32)]
    lib.emu_swizzle.argtypes, lib.emu_swizzle.restype = [U32, I32], U32
    lib.emu_descriptor_decode.argtypes = [U64, ctypes.POINTER(U32)]
    lib.emu_operand_address.argtypes, lib.emu_operand_address.restype = [U64, I32, I32, I32, I32], U32
    lib.emu_run_wgmma.argtypes = [I32, I32, I32, I32, U64, U64, P, I32, P, P]
    lib.emu_run_wgmma.restype = I32
    lib.emu_run_tma.argtypes = [I32, P, U64, U64, U64, U32, U32, I32, I32, I32, P, I32]
    lib.emu_run_tma.restype = I32
    lib.emu_fence_probe.argtypes, lib.emu_fence_probe.restype = [I32], I32
    return lib


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return typed(emu.library())


# ---------------------------------------------------------------------------------------------
# wgmma's accumulator: ((4, 8, 4), (2, 2, N/8)) : ((128, 1, 16), (64, 8, 512)) over m + 64·n
# ---------------------------------------------------------------------------------------------
def emulator_d_table(lib, n: int) -> dict[tuple[int, int], tuple[int, int]]:
    row, col = I32(), I32()
    out = {}
    for thread in range(128):
        for v in range(n // 2):
            lib.emu_wgmma_fragment(thread, v, ctypes.byref(row), ctypes.byref(col))
            out[thread, v] = (row.value, col.value)
    return out


@pytest.mark.parametrize("n", [32, 128, 256])
def test_wgmma_accumulator_table_is_the_ptx_isas(lib, n):
    want = d_table(n)
    assert len(set(want.values())) == 64 * n
    assert emulator_d_table(lib, n) == want


# ---------------------------------------------------------------------------------------------
# The descriptor: bit ranges of the PTX ISA's table
# ---------------------------------------------------------------------------------------------
def test_descriptor_fields_decode_as_the_ptx_isa_lays_them_out(lib):
    rng = np.random.default_rng(0)
    out = (U32 * 5)()
    for _ in range(200):
        start, lbo, sbo = (int(x) * 16 for x in rng.integers(0, 1 << 14, size=3))
        base, swz = int(rng.integers(0, 8)), int(rng.integers(0, 4))
        lib.emu_descriptor_decode(encode(start=start, lbo=lbo, sbo=sbo, base_offset=base, swizzle=swz), out)
        assert list(out) == [start, lbo, sbo, base, swz]


# ---------------------------------------------------------------------------------------------
# The swizzles: chunk c of row r of an atom of 8 rows of S bytes goes to chunk c ^ f(r)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["128B", "64B", "32B", "none"])
def test_swizzles_are_the_ptx_isas_atoms(lib, mode):
    m = SWIZZLE[mode]
    for addr in range(0, 4096, 2):
        assert lib.emu_swizzle(addr, m) == swizzle_rows(addr, m), (mode, addr)


# ---------------------------------------------------------------------------------------------
# Canonical layouts, by their atoms
# ---------------------------------------------------------------------------------------------
def canonical(start: int, lbo: int, sbo: int, mode: int, mn_major: bool, mn: int, k: int, e: int) -> int:
    s = SPAN[mode]
    if not mn_major and s:  # atoms of 8 rows (mn) × S bytes (k)
        logical = start + (mn // 8) * sbo + (mn % 8) * s + k * e
    elif not mn_major:  # core matrices of 8 rows × 16 bytes
        per = 16 // e
        logical = start + (mn // 8) * sbo + (k // per) * lbo + (mn % 8) * 16 + (k % per) * e
    else:  # atoms of 8 rows (k) × S bytes (mn)
        per = s // e
        logical = start + (mn // per) * lbo + (k // 8) * sbo + (k % 8) * s + (mn % per) * e
    return swizzle_rows(logical, mode)


@pytest.mark.parametrize("mode", ["128B", "64B", "32B", "none"])
@pytest.mark.parametrize("mn_major", [False, True], ids=["K-major", "MN-major"])
@pytest.mark.parametrize("e", [2, 4], ids=["16-bit", "tf32"])
def test_operand_addresses_are_the_canonical_layouts(lib, mode, mn_major, e):
    m = SWIZZLE[mode]
    if mn_major and m == 0:
        assert lib.emu_operand_address(encode(start=0, lbo=256, sbo=512, swizzle=0), 1, 0, 0, e) == 0xFFFFFFFF
        return  # not modelled, and said so
    rng = np.random.default_rng(m * 10 + e)
    for _ in range(20):
        start = int(rng.integers(0, 16)) * 1024
        lbo, sbo = (int(x) * 1024 for x in rng.integers(1, 9, size=2))
        desc = encode(start=start, lbo=lbo, sbo=sbo, swizzle=m)
        for mn in range(0, 128, 7):
            for k in range(16 if e == 2 else 8):
                want = canonical(start, lbo, sbo, m, mn_major, mn, k, e)
                assert lib.emu_operand_address(desc, int(mn_major), mn, k, e) == want, (mode, mn_major, mn, k)


# ---------------------------------------------------------------------------------------------
# wgmma's arithmetic
# ---------------------------------------------------------------------------------------------
def run_wgmma(lib, kind: str, n: int, trans_a: bool, trans_b: bool, seed: int = 0):
    """Integer-valued A (64×K) and B (K×N) placed in a 64 KiB window by the canonical layouts
    (128B swizzle), C per thread; returns (d from the emulator, A·B + C read back by d_table)."""
    rng = np.random.default_rng(seed)
    e, k = (4, 8) if kind == "tf32" else (2, 16)
    a, b = rng.integers(-4, 5, size=(64, k)).astype(np.float32), rng.integers(-4, 5, size=(k, n)).astype(np.float32)
    c = rng.integers(-8, 9, size=(128, n // 2)).astype(np.float32)
    image = np.zeros(65536, np.uint8)
    a_start, b_start = 0, 32768
    a_lbo, b_lbo = 8192, 8192  # (MN-major: the next 64-wide block along m or n)
    for (x, kk), v in np.ndenumerate(a):
        put(image, canonical(a_start, a_lbo, 1024, 1, trans_a, x, kk, e), v, kind)
    for (kk, x), v in np.ndenumerate(b):
        put(image, canonical(b_start, b_lbo, 1024, 1, trans_b, x, kk, e), v, kind)
    desc_a = encode(start=a_start, lbo=a_lbo, sbo=1024, swizzle=1)
    desc_b = encode(start=b_start, lbo=b_lbo, sbo=1024, swizzle=1)
    d = np.zeros((128, n // 2), np.float32)
    code = {"bf16": 0, "f16": 1, "tf32": 2}[kind]
    rc = lib.emu_run_wgmma(code, n, int(trans_a), int(trans_b), desc_a, desc_b, image.ctypes.data, image.nbytes,
                           c.ctypes.data, d.ctypes.data)
    assert rc == 0
    full = a.astype(np.float64) @ b.astype(np.float64)
    table = d_table(n)
    want = np.array([[full[table[t, v]] + c[t, v] for v in range(n // 2)] for t in range(128)], np.float32)
    return d, want


def put(image: np.ndarray, addr: int, value: float, kind: str) -> None:
    if kind == "tf32":
        image[addr:addr + 4] = np.frombuffer(np.float32(value).tobytes(), np.uint8)
    else:
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        bits = torch.tensor([value], dtype=torch.float32).to(dtype).view(torch.int16).numpy().view(np.uint8)
        image[addr:addr + 2] = bits


@pytest.mark.parametrize("kind, n, trans_a, trans_b", [
    ("bf16", 128, False, False), ("bf16", 128, True, True), ("f16", 32, False, True), ("bf16", 32, True, False),
    ("bf16", 256, False, False), ("tf32", 128, False, False)])
def test_wgmma_computes_a_times_b_plus_c_from_the_canonical_layouts(lib, kind, n, trans_a, trans_b):
    d, want = run_wgmma(lib, kind, n, trans_a, trans_b)
    assert np.array_equal(d, want)  # integers: every product and sum exact


# ---------------------------------------------------------------------------------------------
# TMA
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    dict(e=2, dims=(100, 70), box=(64, 32), at=(0, 0)),
    dict(e=2, dims=(100, 70), box=(64, 32), at=(64, 48)),    # past both ends: zeros
    dict(e=2, dims=(200, 10), box=(64, 16), at=(-8, -3)),    # before both starts: zeros
    dict(e=4, dims=(40, 40), box=(32, 32), at=(16, 20)),
])
def test_a_tma_box_lands_as_the_tensor_map_says(lib, case):
    e, (d0, d1), (b0, b1), (c0, c1) = case["e"], case["dims"], case["box"], case["at"]
    stride = ((d0 * e + 15) // 16 + 1) * 16  # rows padded past their width: the stride is the map's
    rng = np.random.default_rng(1)
    tensor = rng.integers(0, 256, size=d1 * stride, dtype=np.uint8)
    out = np.zeros(b0 * b1 * e, np.uint8)
    assert lib.emu_run_tma(e, tensor.ctypes.data, d0, d1, stride, b0, b1, 1, c0, c1, out.ctypes.data, out.nbytes) == 0
    want = np.zeros_like(out)
    for y in range(b1):
        for x in range(b0):
            gx, gy = c0 + x, c1 + y
            if 0 <= gx < d0 and 0 <= gy < d1:
                to = swizzle_rows((y * b0 + x) * e, 1)
                want[to:to + e] = tensor[gy * stride + gx * e: gy * stride + (gx + 1) * e]
    assert np.array_equal(out, want)


def test_tensor_maps_the_driver_would_refuse_are_refused(lib):
    buf = np.zeros(4096, np.uint8)
    out = np.zeros(16, np.uint8)
    assert lib.emu_run_tma(2, buf.ctypes.data + 8, 64, 4, 128, 64, 4, 1, 0, 0, out.ctypes.data, 16) == 1  # base
    assert lib.emu_run_tma(2, buf.ctypes.data, 64, 4, 136, 64, 4, 1, 0, 0, out.ctypes.data, 16) == 1  # stride
    assert lib.emu_run_tma(2, buf.ctypes.data, 128, 4, 256, 128, 4, 1, 0, 0, out.ctypes.data, 16) == 1  # > 128 B


# ---------------------------------------------------------------------------------------------
# Tables planted wrong fail the checks above
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("plant", [3, 4], ids=["accumulator table", "swizzle"])
def test_a_planted_wrong_definition_fails_these_checks(plant):
    wrong = typed(emu.load((f"-DCUDA_EMU_PLANT_FRAGMENT={plant}",)))
    if plant == 3:
        assert emulator_d_table(wrong, 128) != d_table(128)
    else:
        assert any(wrong.emu_swizzle(a, 1) != swizzle_rows(a, 1) for a in range(0, 2048, 16))
    d, want = run_wgmma(wrong, "bf16", 128, False, False)
    assert not np.array_equal(d, want)


# ---------------------------------------------------------------------------------------------
# Pipeline bugs, planted in copies of the kernels
# ---------------------------------------------------------------------------------------------
def planted_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "cuda"
    shutil.copytree(ROOT / "cuda", copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    path = copy / "tensor_cores" / file
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    return copy


def driver(tmp_path: Path, copy: Path, sanitizer: str | None = None) -> Path:
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    exe = tmp_path / f"driver_{sanitizer or 'plain'}"
    flags = [f"-fsanitize={sanitizer}"] if sanitizer else []
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-g", "-pthread", *flags, f"-I{copy}",
                            str(copy / "emulate" / "driver.cpp"), "-o", str(exe)], capture_output=True, text=True,
                           timeout=900)
    if build.returncode != 0 and sanitizer and "cannot find" in build.stderr:
        pytest.skip(f"no {sanitizer} sanitizer runtime")
    assert build.returncode == 0, build.stderr[-3000:]
    return exe


def run(exe: Path, *args: str, env: dict | None = None):
    import os
    import subprocess

    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_a_consumer_that_reads_a_stage_before_its_phase_reads_poison_and_is_reported(tmp_path):
    copy = planted_copy(tmp_path, "v32_tma.cuh", "    ring.consumer_wait(step);  // the stage's bytes",
                        "    // (removed) ring.consumer_wait(step);  // the stage's bytes")
    result = run(driver(tmp_path, copy), "--quick", "32")
    assert re.search(r"wgmma read shared offset \d+, which a TMA copy has not delivered", result.stderr), result.stderr
    assert result.returncode != 0


@pytest.mark.slow
def test_a_wrong_expect_tx_byte_count_is_a_hang_that_names_the_barrier(tmp_path):
    copy = planted_copy(tmp_path, "v32_tma.cuh", "TmaPipeline<kV32Stages, kStage> ring(",
                        "TmaPipeline<kV32Stages, kStage + 16> ring(")
    result = run(driver(tmp_path, copy), "--quick", "32")
    assert re.search(r"128 thread\(s\) wait on the mbarrier at shared offset \d+: phase 0, 0 of 1 arrivals and 16 "
                     r"transaction bytes still pending", result.stderr), result.stderr
    assert "cannot finish" in result.stderr and result.returncode != 0


@pytest.mark.slow
def test_a_producer_that_refills_a_stage_still_being_read_is_caught(tmp_path):
    """Without the wait on the stage's `empty` barrier, thread 0 refills a stage the others still
    read: in the emulation they read the refill's poison (reported), and ThreadSanitizer reports
    the race between the copy and their reads."""
    old = "    mbarrier_wait(&empty[stage(step)], parity(step));  // every consumer has released `step`"
    copy = planted_copy(tmp_path, "tma_pipeline.cuh", old, "    // (removed)")
    plain = run(driver(tmp_path, copy), "--quick", "32")
    assert "which a TMA copy has not delivered" in plain.stderr and plain.returncode != 0, plain.stderr[-2000:]
    racy = run(driver(tmp_path, copy, "thread"), "--quick", "32", env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert "WARNING: ThreadSanitizer: data race" in racy.stderr, racy.stderr[-3000:]


@pytest.mark.slow
def test_accumulators_read_before_their_wgmma_completes_are_poison_and_reported(tmp_path):
    """v33's consumers without their last wgmma.wait_group: the epilogue reads registers still
    in flight (the poison NaN), and the thread ends with a wgmma never completed: reported, and the
    launch fails."""
    copy = planted_copy(tmp_path, "v33_warp_specialized.cuh", "  wgmma_wait<0>();\n  // endregion",
                        "  // endregion")
    result = run(driver(tmp_path, copy), "--quick", "33")
    assert re.search(r"ended with [1-4] wgmma operation\(s\) never completed by wgmma.wait_group", result.stderr), \
        result.stderr[-2000:]
    # the launch reports the protocol error (4) instead of returning the poisoned product
    assert "v33 nt: launch refused (4)" in result.stdout and result.returncode != 0


# ---------------------------------------------------------------------------------------------
# Fences and setmaxnreg's registers: what a GPU punishes and the emulation reports
# ---------------------------------------------------------------------------------------------
def plant(tmp_path: Path, name: str, plants: list[tuple[tuple[str, ...], str, str]]) -> Path:
    """A copy of cuda/ in tmp_path/name with each (files, old, new) applied to the first of the
    tensor-core files that holds `old` (once)."""
    copy = tmp_path / name / "cuda"
    shutil.copytree(ROOT / "cuda", copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    for files, old, new in plants:
        holders = [copy / "tensor_cores" / f for f in files if (copy / "tensor_cores" / f).exists()
                   and (copy / "tensor_cores" / f).read_text().count(old) == 1]
        assert holders, (files, old)
        holders[0].write_text(holders[0].read_text().replace(old, new))
    return copy


def drivers(tmp_path: Path, copies: dict[str, Path]) -> dict[str, Path]:
    """The plain driver of each planted copy, two compiles side by side (one a core)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        built = {name: pool.submit(driver, tmp_path / name, copy) for name, copy in copies.items()}
        return {name: future.result() for name, future in built.items()}


def source_line(report: str) -> str:
    """The kernel's file and line of the code address a report names (addr2line, with -g)."""
    import subprocess

    found = re.search(r"\(addr2line -i -e (\S+) (0x[0-9a-f]+)\)", report)
    assert found, report
    if shutil.which("addr2line") is None:
        pytest.skip("needs addr2line")
    out = subprocess.run(["addr2line", "-i", "-e", found[1], found[2]], capture_output=True, text=True).stdout
    return out.strip().splitlines()[0]


@pytest.mark.slow
def test_a_missing_fence_is_reported_with_the_instruction(tmp_path):
    """Each fence deleted from a kernel that needs it: v31 without fence.proxy.async (the tensor cores
    read tiles its threads stored), v31 without wgmma.fence, v32 without fence.mbarrier_init (the copy
    engine completes on barriers the generic proxy initialised). A GPU may read stale bytes or
    barriers there; the emulation reports each, and the launch fails."""
    copies = {
        "proxy": plant(tmp_path, "proxy", [(("v31_wgmma.cuh",), "    fence_proxy_async();", "")]),
        "wgmma": plant(tmp_path, "wgmma", [(("v31_wgmma.cuh",), "    wgmma_fence();\n", "")]),
        "init": plant(tmp_path, "init", [(("v32_tma.cuh", "tma_pipeline.cuh"), "fence_barrier_init();", "")]),
    }
    exes = drivers(tmp_path, copies)
    proxy = run(exes["proxy"], "--quick", "31")
    found = re.search(r"wgmma read shared offset \d+ \(operand [AB], row \d+, k \d+\) written by thread \d+ through "
                      r"the generic proxy with no fence.proxy.async since: wgmma.mma_async of warpgroup 0 at .*",
                      proxy.stderr)
    assert found and "launch refused (4)" in proxy.stdout and proxy.returncode != 0, proxy.stderr[-2000:]
    assert "v31_wgmma.cuh:" in source_line(found[0])  # the kernel's wgmma, by its line
    wgmma = run(exes["wgmma"], "--quick", "31")
    assert re.search(r"thread \d+ issued wgmma.mma_async at \S+ \(addr2line [^)]*\) with no wgmma.fence before it",
                     wgmma.stderr), wgmma.stderr[-2000:]
    assert "launch refused (4)" in wgmma.stdout and wgmma.returncode != 0
    init = run(exes["init"], "--quick", "32")
    assert re.search(r"cp.async.bulk.tensor by thread 0 at \S+ \(addr2line [^)]*\) completes on the mbarrier at shared "
                     r"offset \d+, which thread 0 initialised \(mbarrier.init, a generic write\) with no "
                     r"fence.mbarrier_init or fence.proxy.async since", init.stderr), init.stderr[-2000:]
    assert "launch refused (4)" in init.stdout and init.returncode != 0


@pytest.mark.slow
def test_a_register_increase_the_block_cannot_meet_and_an_accumulator_read_in_flight_are_reported(tmp_path):
    """v33's consumers asking for 240 registers a thread: 128 × 40 + 256 × 240 = 66,560, more than
    the 168 × 384 = 64,512 the block launched with; the second consumer waits at setmaxnreg.inc
    forever (a hang on a GPU), reported with every warpgroup's count. And v31 reading an accumulator
    between its wgmma and the wait: the arithmetic on it traps, reported at the line that reads."""
    peek = "    { volatile float peek = acc[0] * 2.0f; (void)peek; }  // (planted) a read in flight\n"
    commit = "    wgmma_commit();\n"
    copies = {
        "regs": plant(tmp_path, "regs", [(("v33_warp_specialized.cuh",), "setmaxnreg_inc<232>",
                                          "setmaxnreg_inc<240>")]),
        "read": plant(tmp_path, "read", [(("v31_wgmma.cuh",), commit, commit + peek)]),
    }
    exes = drivers(tmp_path, copies)
    regs = run(exes["regs"], "--quick", "33")
    assert re.search(r"128 thread\(s\) of warpgroup 2 wait at setmaxnreg.inc to 240 registers a thread: it needs "
                     r"9216 more, and the block's pool has 7168 free of the 168 x 384 = 64512 it launched with "
                     r"\(warpgroup 0 at 40, warpgroup 1 at 240, warpgroup 2 at 168 registers a thread\)",
                     regs.stderr), regs.stderr[-3000:]
    assert "cannot finish" in regs.stderr and "launch refused (2)" in regs.stdout and regs.returncode != 0
    if not re.match(r"x86_64|AMD64", __import__("platform").machine()):
        pytest.skip("the accumulators' floating-point trap is x86-64's (MXCSR)")
    read = run(exes["read"], "--quick", "31")
    found = re.search(r"thread \d+ read wgmma accumulator registers while the wgmma was in flight .* took their poison "
                      r"NaN at .*", read.stderr)
    assert found and "launch refused (4)" in read.stdout and read.returncode != 0, read.stderr[-2000:]
    planted_line = (copies["read"] / "tensor_cores" / "v31_wgmma.cuh").read_text().splitlines().index(peek.rstrip("\n"))
    assert source_line(found[0]).endswith(f"v31_wgmma.cuh:{planted_line + 1}")


# emu_fence_probe's plants (cuda/emulate/emulate.cpp): the launch's status and what it reports.
PROBES = {
    "correct": (0, 0, None),
    "no fence.proxy.async": (1, 4, r"wgmma read shared offset \d+ \(operand A, row 0, k 0\) written by thread "
                             r"1\d\d through the generic proxy with no fence.proxy.async since: wgmma.mma_async of "
                             r"warpgroup 0"),
    "fence after the arrival": (2, 4, r"written by thread 1\d\d through the generic proxy and fenced "
                                r"\(fence.proxy.async\), but no __syncthreads or mbarrier after that fence ordered it"),
    "fence before the arrival": (3, 0, None),
    "no wgmma.fence": (4, 4, r"thread \d+ issued wgmma.mma_async at .* with no wgmma.fence before it"),
    "accumulator written, no wgmma.fence": (5, 4, r"issued wgmma.mma_async at .* on accumulator registers that "
                                            r"other instructions wrote since the wgmma before it on them, with no "
                                            r"wgmma.fence"),
    "no fence.mbarrier_init": (6, 4, r"cp.async.bulk.tensor by thread 0 at .* completes on the mbarrier at shared "
                               r"offset 16392, which thread 0 initialised \(mbarrier.init, a generic write\) with no "
                               r"fence.mbarrier_init"),
    "accumulator read in flight": (7, 4, r"thread \d+ read wgmma accumulator registers while the wgmma was in flight"),
    "setmaxnreg beyond the pool": (8, 2, r"128 thread\(s\) of warpgroup 0 wait at setmaxnreg.inc to 104 registers a "
                                   r"thread: it needs 5120 more, and the block's pool has 4096 free of the 64 x 256 "
                                   r"= 16384 it launched with \(warpgroup 0 at 64, warpgroup 1 at 32 registers a "
                                   r"thread\)"),
}


@pytest.mark.parametrize("case", PROBES)
def test_each_fence_and_register_rule_is_checked(lib, capfd, case):
    """One small kernel, each rule broken on its own (and the mbarrier-ordered fence that is right)."""
    plant, status, report = PROBES[case]
    if plant == 7 and not re.match(r"x86_64|AMD64", __import__("platform").machine()):
        pytest.skip("the accumulators' floating-point trap is x86-64's (MXCSR)")
    got = lib.emu_fence_probe(plant)
    err = capfd.readouterr().err
    assert got == status, err
    if report is None:
        assert "cuda_emu" not in err, err
    else:
        assert re.search(report, err), err


def test_the_launch_register_counts_are_ptxas_counts():
    """A kernel that moves registers with setmaxnreg declares ptxas's registers a thread at launch
    (the block's pool, in the emulation); each constant must be the count in the static record, and
    the emulation's launch must know it."""
    import json

    record = json.loads((ROOT / "docs" / "results" / "cuda_static_sm90.json").read_text())
    emulate = (ROOT / "cuda" / "emulate" / "emulate.cpp").read_text()
    users = [p for p in sorted((ROOT / "cuda" / "tensor_cores").glob("*.cuh")) if "setmaxnreg_" in p.read_text()]
    assert users
    for path in users:
        text = path.read_text()
        name, registers = re.search(r"constexpr int (k\w+LaunchRegisters) = (\d+);", text).groups()
        version = int(re.search(r"__device__ void gemm_v(\d+)", text)[1])
        assert re.search(rf"\{{{version}, unsigned\({name}\)\}}", emulate), (name, version)
        counts = {k["registers"] for k in record["kernels"] if k["version"] == version}
        assert counts == {int(registers)}, (path.name, counts, registers)
