"""The emulator's memory counters (cuda/counters.py, cuda/emulate/counters.cpp): planted patterns
with counts known by hand, ldmatrix and the tensor-core versions' swizzle, sampling against the full
grid, the comparison with Nsight Compute's committed record kernel by kernel, the committed records
against what the counters count now, and one line for every bad input."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

import cli
from conftest import ROOT, load_script, run_script

counters = load_script("cuda/counters.py")
pytestmark = pytest.mark.skipif(counters.unavailable_reason() is not None and not counters.built(),
                                reason=f"the counting build {counters.unavailable_reason()}")


def test_planted_patterns_give_the_counts_known_by_hand():
    coalesced = counters.count_planted("coalesced")
    assert coalesced.per_request("ld") == 4  # 32 lanes × 4 bytes, one 128-byte line
    column = counters.count_planted("column-major")
    assert column.per_request("ld") == 32  # a row (128 bytes) apart per lane: a sector each
    assert column.get("requests_pipe_lsu_mem_global_op_ld") == 1
    stride = counters.count_planted("stride-32")
    for kind in ("ld", "st"):  # one bank, 32 different words: 32 wavefronts where 1 is ideal
        assert stride.metrics[f"smsp__inst_executed_op_shared_{kind}.sum"] == 1
        assert stride.metrics[f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{kind}.sum"] == 32
        assert stride.metrics[f"excessive_wavefronts_mem_shared_op_{kind}"] == 31
    broadcast = counters.count_planted("broadcast")
    assert broadcast.get("inst_executed_op_shared_ld") == 1 and broadcast.get("inst_executed_op_shared_st") == 1
    assert broadcast.get("excessive_wavefronts_mem_shared_op_ld") == 0


def test_a_cp_async_is_one_ldgsts_request_not_a_load_and_a_store():
    # 32 lanes copy 16 neighbouring bytes each: one LDGSTS request of 512 bytes, 16 sectors. Its
    # shared side is served as a 16-byte access is, in four phases of 8 lanes; each phase's 128
    # bytes fill the 32 banks once: 4 wavefronts, the ideal.
    copy = counters.count_planted("cp.async")
    assert copy.get("requests_pipe_lsu_mem_global_op_ldgsts") == 1
    assert copy.get("sectors_pipe_lsu_mem_global_op_ldgsts") == 16
    assert copy.get("data_pipe_lsu_wavefronts_mem_shared_op_ldgsts") == 4
    assert copy.get("excessive_wavefronts_mem_shared_op_ldgsts") == 0
    # ... and neither a global load nor a shared store: not at issue, and not where the emulator
    # makes the copy at the wait (its bytes are the hardware's side, uninstrumented)
    assert copy.get("requests_pipe_lsu_mem_global_op_ld") == 0
    assert copy.get("inst_executed_op_shared_st") == 0 and copy.get("inst_executed_op_shared_ld") == 0
    assert copy.get("requests_pipe_lsu_mem_global_op_st") == 1  # the pattern's own out[i] = v
    # The same sources into rows 128 bytes apart: the 8 lanes of a phase all write banks 0-3,
    # 8 words a bank: 8 wavefronts a phase, 32 in all, 28 beyond the ideal.
    one_bank = counters.count_planted("cp.async-one-bank")
    assert one_bank.get("sectors_pipe_lsu_mem_global_op_ldgsts") == 16
    assert one_bank.get("data_pipe_lsu_wavefronts_mem_shared_op_ldgsts") == 32
    assert one_bank.get("excessive_wavefronts_mem_shared_op_ldgsts") == 28


def test_an_ldmatrix_is_one_ldsm_request_with_a_phase_per_matrix():
    # ldmatrix.x4 whose 32 rows lie 16 bytes apart: each matrix's 8 rows fall on the 8 groups of 4
    # banks, one wavefront a matrix, 4 in all, the ideal.
    spread = counters.count_planted("ldmatrix")
    assert spread.get("inst_executed_op_ldsm") == 1
    assert spread.get("data_pipe_lsu_wavefronts_mem_shared_op_ld") == 4
    assert spread.get("excessive_wavefronts_mem_shared_op_ld") == 0
    # an LDSM is not an LDS: ncu counts its requests apart (its wavefronts are among the loads')
    assert spread.get("inst_executed_op_shared_ld") == 0 and spread.get("inst_executed_op_shared_st") == 0
    # Rows 128 bytes apart all fall on banks 0-3: 8 wavefronts a matrix, 7 beyond the ideal.
    one_group = counters.count_planted("ldmatrix-one-bank-group")
    assert one_group.get("inst_executed_op_ldsm") == 1
    assert one_group.get("data_pipe_lsu_wavefronts_mem_shared_op_ld") == 4 * 8
    assert one_group.get("excessive_wavefronts_mem_shared_op_ld") == 4 * 7
    # .x1 reads the rows of lanes 0-7 only, whatever the other lanes give
    x1 = counters.count_planted("ldmatrix.x1")
    assert x1.get("inst_executed_op_ldsm") == 1
    assert x1.get("data_pipe_lsu_wavefronts_mem_shared_op_ld") == 8
    assert x1.get("excessive_wavefronts_mem_shared_op_ld") == 7


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_the_swizzle_takes_ldmatrixs_excessive_wavefronts_to_zero(layout):
    # One 64x64 block, one k-step of 64: 4 warps, each 4 steps of 16 with 2 ldmatrix.x4 for A and 2
    # for B. v22's rows are 128 bytes: an ldmatrix's 8 rows (along x in nt, along k in tn's A, read
    # by .trans) start 128 bytes apart, on one group of banks: 8 wavefronts a matrix. v23 moves
    # chunk c of row r to c ^ (r % 8): 1 a matrix. The 16-byte stores that stage the tiles put a
    # phase's 8 lanes on one row's 8 chunks, in both: 4 wavefronts each, none excessive.
    v22, v23 = (counters.count_gemm(v, layout, 64, 64, 64, "bfloat16", sample=False)[0] for v in (22, 23))
    ldsm = 4 * 4 * (2 + 2)
    stores = 4 * 2 * 4  # 4 warps, 2 tiles, 4 chunks of 16 bytes a thread
    for c in (v22, v23):
        assert c.kernel.endswith(f"_{layout}_bf16")
        assert c.get("inst_executed_op_ldsm") == ldsm
        assert c.get("inst_executed_op_shared_ld") == 0  # every shared load is an ldmatrix
        assert c.get("inst_executed_op_shared_st") == stores
        assert c.get("data_pipe_lsu_wavefronts_mem_shared_op_st") == 4 * stores
        assert c.get("excessive_wavefronts_mem_shared_op_st") == 0
    assert v22.get("data_pipe_lsu_wavefronts_mem_shared_op_ld") == 4 * 8 * ldsm
    assert v22.get("excessive_wavefronts_mem_shared_op_ld") == 4 * 7 * ldsm > 0
    assert v23.get("data_pipe_lsu_wavefronts_mem_shared_op_ld") == 4 * ldsm
    assert v23.get("excessive_wavefronts_mem_shared_op_ld") == 0


def test_the_tensor_core_versions_are_counted_in_their_own_types():
    # v24: A and B by cp.async (LDGSTS) into its swizzled ring, read by ldmatrix: no excessive
    # wavefronts on either side; float16 runs the same code as bfloat16.
    v24 = counters.count_gemm(24, "nt", 128, 128, 64, "float16", sample=False)[0]
    assert v24.kernel == "dense_gemm_v24_nt_f16"
    assert v24.get("requests_pipe_lsu_mem_global_op_ldgsts") > 0 and v24.get("inst_executed_op_ldsm") > 0
    assert v24.get("excessive_wavefronts_mem_shared_op_ldgsts") == 0
    assert v24.get("excessive_wavefronts_mem_shared_op_ld") == 0
    # v21 reads its fragments from global memory, 2 bytes a lane: a warp's load of A takes rows g
    # = 0..7 (lane / 4) at columns 2t (t = lane % 4), 8 bytes of each row: 8 sectors a request;
    # nothing in shared memory
    v21 = counters.count_gemm(21, "nt", 32, 16, 64, "bfloat16", sample=False)[0]
    assert v21.get("inst_executed_op_ldsm") == 0 and v21.get("inst_executed_op_shared_ld") == 0
    steps, warps = 64 // 16, 4
    loads = warps * steps * (8 + 4)  # 8 two-byte loads of A and 4 of B a lane and k-step
    bias = warps * 4  # the epilogue's bias[n], one load for each of a lane's 4 outputs
    assert v21.get("requests_pipe_lsu_mem_global_op_ld") == loads + bias
    assert v21.get("sectors_pipe_lsu_mem_global_op_ld") == 8 * loads + bias
    # v25 and v26 (float32 through TF32): padded rows keep their 32-bit fragment loads on 32 banks
    for v in (25, 26):
        tf32 = counters.count_gemm(v, "nt", 128, 128, 32, "float32", sample=False)[0]
        assert tf32.get("inst_executed_op_shared_ld") > 0 and tf32.get("inst_executed_op_ldsm") == 0
        assert tf32.get("excessive_wavefronts_mem_shared_op_ld") == 0


def test_the_type_codes_are_the_kernels():
    emulated = load_script("cuda/emulated.py", "dense_cuda_emulated_codes")
    for name, code in counters.DTYPE_CODES.items():
        dtype = getattr(__import__("torch"), name)
        assert emulated.dtype_code(dtype) == code and emulated.DTYPE_NAMES[dtype] == counters.suffix(name)
        assert torch_bytes(dtype) == counters.DTYPES[name]
    # Hopper's versions are left out, in every type they are built for
    assert [v for v in counters.hopper_versions()] == [31, 32, 33, 34, 35]
    assert counters.versions("bfloat16") == [11, 12, 21, 22, 23, 24]
    assert counters.versions("float32") == [*range(1, 13), 25, 26]
    assert counters.default_kernels("float16") == [(v, "nt") for v in (21, 22, 23, 24)]


def torch_bytes(dtype) -> int:
    return __import__("torch").empty(0, dtype=dtype).element_size()


def test_the_tile_loaders_cp_async_is_counted_as_sm80_executes_it():
    # v8's nn product: B's tile needs no transposing and comes by cp.async (LDGSTS), one 16-byte
    # copy a thread and k-step, a warp a row of 128 floats (512 bytes: 16 sectors, 4 wavefronts);
    # A's tile still comes through registers: one LDG.128 a thread and k-step, then 4 transposing
    # stores, each one wavefront over the ideal (v10's padding removes it).
    v8 = counters.count_gemm(8, "nn", 128, 128, 64, sample=False)[0]
    copies = 8 * (64 // 8)  # 8 warps × k-steps
    assert v8.get("requests_pipe_lsu_mem_global_op_ldgsts") == copies
    assert v8.per_request("ldgsts") == 16
    assert v8.get("data_pipe_lsu_wavefronts_mem_shared_op_ldgsts") == 4 * copies
    assert v8.get("excessive_wavefronts_mem_shared_op_ldgsts") == 0
    assert v8.get("requests_pipe_lsu_mem_global_op_ld") == copies  # A's tile only
    assert v8.get("inst_executed_op_shared_st") == 4 * copies  # A's tile only
    assert v8.get("excessive_wavefronts_mem_shared_op_st") == 4 * copies
    tn = counters.count_gemm(8, "tn", 128, 128, 64, sample=False)[0]  # both tiles by cp.async
    assert tn.get("requests_pipe_lsu_mem_global_op_ldgsts") == 2 * copies
    assert tn.get("requests_pipe_lsu_mem_global_op_ld") == 0 and tn.get("inst_executed_op_shared_st") == 0


def test_wide_shared_accesses_are_split_into_the_hardwares_phases():
    # v5 reads Bs[kk][8·tx .. 8·tx+3] with 128-bit loads: in each quarter-warp, lanes tx and tx+4
    # hit the same four banks: 2 wavefronts per phase, 4 beyond the ideal per request. Its As reads
    # are broadcasts. And v8 stores its transposed tile with lanes 2i and 2i+1 in one bank: one
    # wavefront over the ideal per store.
    v5 = counters.count_gemm(5, "nt", 128, 128, 64, sample=False)[0]
    assert v5.get("excessive_wavefronts_mem_shared_op_ld") == 4 * 16 * 8 * (64 // 8)  # 16 LDS.128 of Bs
    v8 = counters.count_gemm(8, "nt", 128, 128, 64, sample=False)[0]
    stores = v8.get("inst_executed_op_shared_st")
    assert stores == 8 * 8 * (64 // 8)  # 8 warps × (4 stores of A + 4 of B) × k-steps
    assert v8.get("excessive_wavefronts_mem_shared_op_st") == stores
    assert v8.get("excessive_wavefronts_mem_shared_op_ld") == 0
    assert v8.get("requests_pipe_lsu_mem_global_op_ldgsts") == 0  # nt: both tiles are transposed


def test_a_count_names_one_metric():
    assert counters.metric("requests_pipe_lsu_mem_global_op_ld") == "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
    assert counters.metric("excessive_wavefronts_mem_shared_op_ld") == "excessive_wavefronts_mem_shared_op_ld"
    with pytest.raises(KeyError):
        counters.metric("wavefronts_mem_shared_op_ld")  # ncu's wavefronts, or the excessive ones?
    # the model's own quantities carry no ncu-style name ("unit__..."): ncu has no metric of them
    assert [m for m in counters.METRICS if "excessive" in m and "__" in m] == []


def test_scalar_shared_loads_are_merged_as_nvcc_merges_them():
    # v3's inner loop reads As[ty][kk] for 32 consecutive kk: nvcc makes 8 LDS.128 of them (the
    # static report's census), and 32 scalar loads of Bs[kk][tx]. Per warp and k-step: 40.
    v3 = counters.count_gemm(3, "nt", 32, 32, 64, sample=False)[0]
    assert v3.get("inst_executed_op_shared_ld") == 32 * 40 * (64 // 32)


def test_padding_the_transposed_tiles_removes_the_store_conflicts():
    # v10 is v8 with rows of BM + 4 words: lanes 2i and 2i+1 move 16 banks apart.
    v8, v10 = (counters.count_gemm(v, "nt", 256, 256, 64)[0] for v in (8, 10))
    assert v8.get("excessive_wavefronts_mem_shared_op_st") == v8.get("inst_executed_op_shared_st") > 0
    assert v10.get("excessive_wavefronts_mem_shared_op_st") == 0
    tune, = counters.count_gemm(counters.parse_kernel("tune0:nt", range(1, 13))[0], "nt", 256, 256, 64)[:1]
    assert tune.kernel == "dense_gemm_tune0_nt_f32" and tune.get("inst_executed_op_shared_ld") > 0


def test_the_backward_kernels_padded_column_reads_have_no_conflicts():
    # v2 reads a column of its 32×33 array of lane sums: 33 words a row put 32 lanes in 32 banks.
    grad, = counters.count_sigmoid_grad(2, 256, 64, sample=False)[:1]
    assert grad.get("inst_executed_op_shared_ld") > 0
    assert grad.get("excessive_wavefronts_mem_shared_op_ld") == 0
    assert grad.per_request("ld") == 4  # g and y, 32 neighbouring columns


@pytest.mark.parametrize("kernel, shape", [
    ("3:nt", (640, 768, 32)), ("8:nt", (640, 768, 32)), ("2:nn", (640, 768, 32)), ("8:tn", (640, 768, 32)),
    ("12:nt", (64, 1024, 1024)),  # 8 slices of K, all alike
    ("9:nt", (32, 1024, 1000)),  # 7 slices of K, the last shorter
    # the backward's v3: 32 bands of 32 rows over 5 blocks along y, 7, 7, 6, 6 and 6 of them
    ("grad:3", (1024, 1024, 1)),
])
def test_a_sample_of_blocks_scaled_equals_the_whole_grid(kernel, shape):
    v, layout = counters.parse_kernel(kernel, range(1, 100))
    if layout == "grad":
        sampled, full = (counters.count_sigmoid_grad(v, *shape[:2], sample=s)[0] for s in (True, False))
    else:
        sampled, full = (counters.count_gemm(v, layout, *shape, sample=s)[0] for s in (True, False))
    assert sampled.metrics["blocks_run"] < full.metrics["blocks_run"]
    for name in counters.METRICS[:-2]:
        assert sampled.metrics[name] == pytest.approx(full.metrics[name], rel=1e-9), name


@pytest.mark.slow
def test_the_counts_agree_with_nsight_compute_kernel_by_kernel(tmp_path):
    # All eleven kernels of the ncu record at its shape, 2048³ float32, as the chapter shows them.
    ncu = json.loads(counters.ncu_record().read_text())
    kernels = [k["kernel"] for k in ncu["kernels"]]
    args = sorted({f"{int(k.split('_v')[1].split('_')[0])}:{k.split('_')[3]}" for k in kernels})
    out = tmp_path / "counts.json"
    result = run_script("cuda/counters.py", "--kernels", *args, "--json", str(out), timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {r["kernel"]: r for r in counters.rows(counters.at(json.loads(out.read_text()), ncu["shape"]))}
    assert set(kernels) <= set(rows)
    for kernel in kernels:
        _assert_agrees(rows[kernel])


def _assert_agrees(row: dict) -> None:
    """Sectors agree; shared wavefronts agree where ncu measured them; the excessive wavefronts and
    ncu's bank-conflict counter agree except on the rows known to differ."""
    verdict = counters.agreement(row)
    assert verdict["sectors"], row
    for kind in ("ld", "st"):
        assert verdict[f"{kind}_wavefronts"] in (True, None), (row["kernel"], kind, row)
        if (row["kernel"], kind) in counters.KNOWN_DIFFERENCES:
            assert verdict[f"{kind}_counter"] is False, f"{row['kernel']} {kind} agrees now: not a known difference"
        else:
            assert verdict[f"{kind}_counter"], (row["kernel"], kind, row)


def _ncu_shape() -> tuple[int, int, int]:
    return tuple(json.loads(counters.ncu_record().read_text())["shape"])


def test_the_committed_record_agrees_with_its_ncu_record():
    # The chapter's counts at ncu's shape (docs/results/counters.json, 2048³) pass the same comparison.
    record = counters.at(json.loads((RESULTS / "counters.json").read_text()), _ncu_shape())
    assert record["shape"] == [2048, 2048, 2048] and "float32" in record["dtypes"]
    compared = [r for r in counters.rows(record) if r["in_ncu"]]
    assert len(compared) == 11
    for row in compared:
        _assert_agrees(row)


def test_ncu_numbers_a_record_lacks_are_said_to_be_not_measured_yet():
    # ncu's record holds the kernel but not its wavefronts: the table says so, and tells a kernel
    # ncu never profiled (v10) by a dash.
    record = json.loads((RESULTS / "counters.json").read_text())
    ncu = json.loads(counters.ncu_record().read_text())
    assert not any("wavefronts" in name for k in ncu["kernels"] for name in k["metrics"])
    table = counters.chapter_table(record, _ncu_shape())
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert "| 3.9e+04, 1.2e+06 |" in lines["dense_gemm_v3_nt_f32"]  # the counter, beside the excessive wavefronts
    assert counters.NOT_MEASURED in lines["dense_gemm_v3_nt_f32"]
    assert counters.NOT_MEASURED not in lines["dense_gemm_v10_nt_f32"]
    # and once a record holds the wavefronts, they are compared
    row = next(r for r in counters.rows(counters.at(record, _ncu_shape())) if r["kernel"] == "dense_gemm_v3_nt_f32")
    measured = {**row, "ncu_shared_ld_wavefronts": row["shared_ld_wavefronts"] * 1.05,
                "ncu_shared_st_wavefronts": row["shared_st_wavefronts"] * 1.5}
    verdict = counters.agreement(measured)
    assert verdict["ld_wavefronts"] is True and verdict["st_wavefronts"] is False


# The committed record's rows that are cheap to count again (a few seconds a shape), by type: the
# backward's three elementwise kernels and v12's forward, which between them take every path of the
# model but cp.async's (its planted patterns check that one) and v8's tile loader; and v21, the
# cheapest tensor-core row (2-byte global loads). The ldmatrix rows take a slow test.
CHEAP_ROWS = {"float32": ("grad:1", "grad:2", "grad:3", "12:nt"), "bfloat16": ("21:nt",)}
RESULTS = ROOT / "docs" / "results"


def _assert_recounted(name: str, record: dict, rows: dict[str, tuple[str, ...]]) -> None:
    """Each of `rows` (by type) counted now at the shape of `record` (at()) is one of its rows there."""
    assert record["metrics"] == list(counters.METRICS)
    committed: dict[str, list[dict]] = {}
    for row in record["kernels"]:
        committed.setdefault(row["kernel"], []).append(row["metrics"])
    m, n, k = record["shape"]
    sms, sample = record["sm_count"], record["sample"]
    for dtype in record["dtypes"]:
        for spec in rows.get(dtype, ()):
            v, layout = counters.parse_kernel(spec, range(1, 100))
            counted = counters.count_sigmoid_grad(v, m, n, dtype, sms, sample) if layout == "grad" else \
                counters.count_gemm(v, layout, m, n, k, dtype, sms, sample)
            for c in counted:
                assert c.metrics in committed.get(c.kernel, []), (
                    f"{name}: {c.kernel} counts differently now; take the record again with its command: "
                    f"{record['command']}")


# The committed record's shapes: ncu's (the ncu comparison) and the timed one (the chapters' tables).
SHAPES = [(2048, 2048, 2048), counters.TIMED_SHAPE]


@pytest.mark.parametrize("shape", [SHAPES[0], pytest.param(SHAPES[1], marks=pytest.mark.slow)],  # 4096³: seconds
                         ids=["x".join(map(str, s)) for s in SHAPES])
def test_the_committed_records_rows_are_what_the_counters_count_now(shape):
    # A change of the model or of the kernels without the record taken again fails here.
    record = counters.at(json.loads((RESULTS / "counters.json").read_text()), shape)
    assert set(record["dtypes"]) <= set(CHEAP_ROWS)
    _assert_recounted("counters.json", record, CHEAP_ROWS)


@pytest.mark.slow
def test_the_committed_ldmatrix_rows_are_what_the_counters_count_now():
    # v22's, v23's and v24's rows at ncu's shape, 2048³ (the record's rows at 4096³ come from the
    # same model: the other test recounts them there for the cheaper kernels)
    record = counters.at(json.loads((RESULTS / "counters.json").read_text()), SHAPES[0])
    _assert_recounted("counters.json", record, {"bfloat16": ("22:nt", "23:nt", "24:nt")})


def test_the_record_holds_every_forward_and_the_backwards_kernels_at_ncus_shape_and_the_timed_one():
    record = json.loads((RESULTS / "counters.json").read_text())
    timed = json.loads((RESULTS / "cuda_gpu_h100.json").read_text())
    assert tuple(timed["gemm"]["shape"]) == counters.TIMED_SHAPE and timed["dtype"] == "float32"
    assert SHAPES[0] == _ncu_shape()
    assert [tuple(s["shape"]) for s in record["shapes"]] == SHAPES
    assert {tuple(r["shape"]) for r in record["kernels"]} == set(SHAPES)  # every row says its shape
    assert record["dtypes"] == ["float32", "bfloat16"]
    assert record["sm_count"] == timed["gpu"]["sm_count"]
    versions = cli.load_file("cuda/catalog.py").cuda_core_versions()
    for shape in SHAPES:
        at_shape = counters.at(record, shape)
        kernels = {r["kernel"] for r in at_shape["kernels"]}
        assert {f"dense_gemm_v{v}_nt_f32" for v in versions} <= kernels
        assert {f"dense_sigmoid_grad_v{v}_f32" for v in counters.GRAD_VERSIONS} <= kernels
        # and the tensor-core versions' forward in bfloat16, the tensor-core chapter's table
        assert [r["kernel"] for r in counters.tensor_core_rows(at_shape)] == \
            [f"dense_gemm_v{v}_nt_bf16" for v in (21, 22, 23, 24)]


def test_the_tensor_core_table_shows_the_swizzle_taking_the_excessive_wavefronts_to_zero():
    # What the tensor-core chapter says of its table (docs/results/counters.json at 4096³): v22's
    # ldmatrix takes 8 wavefronts a matrix, 32 a request, 28 of them excessive; v23's swizzle, 4
    # and none; v24's swizzled ring none, on its cp.async copies either; the 16-byte stores that
    # stage v22's and v23's tiles none; every shared load of theirs is an ldmatrix.
    record = json.loads((RESULTS / "counters.json").read_text())
    tc = {r["kernel"].split("_")[2]: counters.Counts(r["kernel"], r["metrics"], 0)
          for r in counters.tensor_core_rows(counters.at(record, counters.TIMED_SHAPE))}

    def per_ldsm(c: counters.Counts, what: str) -> float:
        return c.get(what) / c.get("inst_executed_op_ldsm")

    assert per_ldsm(tc["v22"], "data_pipe_lsu_wavefronts_mem_shared_op_ld") == 32
    assert per_ldsm(tc["v22"], "excessive_wavefronts_mem_shared_op_ld") == 28
    assert per_ldsm(tc["v23"], "data_pipe_lsu_wavefronts_mem_shared_op_ld") == 4
    for v in ("v22", "v23", "v24"):
        assert tc[v].get("inst_executed_op_shared_ld") == 0
        assert tc[v].get("excessive_wavefronts_mem_shared_op_st") == 0
    for v in ("v23", "v24"):
        assert tc[v].get("excessive_wavefronts_mem_shared_op_ld") == 0
    assert tc["v24"].get("excessive_wavefronts_mem_shared_op_ldgsts") == 0
    assert tc["v21"].get("inst_executed_op_ldsm") == 0 and tc["v21"].per_request("ld") > 7
    lines = counters.tensor_core_table(record).splitlines()
    row = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| dense_")}
    assert list(row) == [f"dense_gemm_v{v}_nt_bf16" for v in (21, 22, 23, 24)]
    assert row["dense_gemm_v22_nt_bf16"].endswith("| 32 |") and row["dense_gemm_v23_nt_bf16"].endswith("| 4 |")
    assert "M=4096 N=4096 K=4096, bfloat16," in lines[-1] and "float32" not in lines[-1].split("`")[0]
    # chapter 3's table of the same record leaves them to that table
    chapter3 = counters.chapter_table(record)
    assert "_bf16" not in chapter3 and "dense_gemm_v12_nt_f32" in chapter3
    assert "M=4096 N=4096 K=4096, float32," in chapter3.splitlines()[-1]


def test_counts_taken_from_another_thread_are_the_same():
    # Each OS thread has its own copy of the emulated shared memory (thread-local storage): the
    # counters must find the range of the thread that counts, not of the first one that asked.
    here = counters.count_gemm(8, "nt", 128, 128, 64, sample=False)[0]
    assert here.get("inst_executed_op_shared_ld") > 0
    there: list = []
    worker = threading.Thread(target=lambda: there.append(counters.count_gemm(8, "nt", 128, 128, 64, sample=False)[0]))
    worker.start()
    worker.join(timeout=120)
    assert there and there[0].metrics == here.metrics
    # and threads that count at the same time each get their own kernel's counts
    kernels = [(8, "nt"), (5, "nt"), (8, "tn"), (3, "nt")] * 2
    alone = {v_l: counters.count_gemm(*v_l, 128, 128, 64)[0].metrics for v_l in set(kernels)}
    together: list = [None] * len(kernels)

    def count(i: int) -> None:
        together[i] = counters.count_gemm(*kernels[i], 128, 128, 64)[0].metrics

    workers = [threading.Thread(target=count, args=(i,)) for i in range(len(kernels))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert together == [alone[v_l] for v_l in kernels]


def test_the_memory_asked_for_is_each_kernels_own_workspace_included():
    lib = counters.library()
    # Nothing split: operands, output and bias only (the old estimate reserved C once per SM).
    assert counters.memory_bytes([(8, "nt")], 256, 256, 64, "float32", 132, lib) == \
        4 * (2 * 256 * 64 + 256 * 256 + 256)
    # v12 at 32×128×2048 on 4 SMs: one 32×128 tile, 16 slices of K, each a partial 32×128 product:
    # more than C once per SM.
    slices = lib.emu_gemm_workspace(12, 0, 32, 128, 2048, 4) // (32 * 128)
    assert slices == 16
    assert counters.memory_bytes([(12, "nt")], 32, 128, 2048, "float32", 4, lib) == \
        4 * (32 * 2048 + 128 * 2048 + 32 * 128 + 128 + 16 * 32 * 128)
    # the backward's v3 keeps one row of column sums per block of rows
    assert counters.memory_bytes([(3, "grad")], 4096, 64, 1, "float32", 132, lib) == \
        4 * (3 * 4096 * 64 + 64 + lib.emu_sigmoid_grad_workspace(3, 4096, 64, 132))
    # the most of any one kernel (they run one after another)
    assert counters.memory_bytes([(8, "nt"), (12, "nt")], 32, 128, 2048, "float32", 4, lib) == \
        counters.memory_bytes([(12, "nt")], 32, 128, 2048, "float32", 4, lib)
    # bfloat16: 2 bytes an element, but split-K's partial products are float32 accumulators
    assert counters.memory_bytes([(12, "nt")], 32, 128, 2048, "bfloat16", 4, lib) == \
        2 * (32 * 2048 + 128 * 2048 + 32 * 128 + 128) + 4 * 16 * 32 * 128


def test_shape_given_again_counts_every_kernel_in_every_type_at_each_shape(tmp_path, capsys):
    out = tmp_path / "counts.json"
    argv = ["--shape", "64", "64", "64", "--shape", "128", "128", "64", "--shape", "64", "64", "64",
            "--kernels", "12:nt", "--dtype", "float32", "bfloat16", "--compare", "none", "--json", str(out)]
    assert counters.main(argv) == 0
    record = json.loads(out.read_text())
    shapes = [(64, 64, 64), (128, 128, 64)]  # each once, in the order given
    assert [tuple(s["shape"]) for s in record["shapes"]] == shapes and "shape" not in record
    assert [(r["kernel"], tuple(r["shape"])) for r in record["kernels"]] == \
        [(f"dense_gemm_v12_nt_{t}", shape) for shape in shapes for t in ("f32", "bf16")]
    for shape in shapes:  # each row is what that kernel counts at its own shape, sampled there
        at_shape = counters.at(record, shape)
        assert at_shape["shape"] == list(shape) and len(at_shape["kernels"]) == 2
        for row, dtype in zip(at_shape["kernels"], ("float32", "bfloat16")):
            assert row["metrics"] == counters.count_gemm(12, "nt", *shape, dtype)[0].metrics
    assert counters.at(record, (128, 128, 64))["kernels"][0]["metrics"]["blocks_run"] == 3
    # a table for each shape, its line under it naming that shape
    printed = capsys.readouterr().out
    assert printed.count("| dense_gemm_v12_nt_f32 |") == 2
    assert printed.index("M=64 N=64 K=64, float32, bfloat16") < printed.index("M=128 N=128 K=64, float32, bfloat16")
    # a shape the record does not hold is one line (docs/render.py reports a KeyError as such)
    with pytest.raises(KeyError, match="no counts at M=4096 N=4096 K=4096 .it holds M=64 N=64 K=64; M=128"):
        counters.chapter_table(record)


@pytest.mark.parametrize("argv, free, refused", [
    # fits in 1 MiB; the estimate of C once per SM (and one more) asked for 35 MiB
    (["--shape", "256", "256", "64", "--kernels", "8:nt"], 2**20, False),
    # 1.6 MB with v12's 16 partial products; C once per SM (4) and one more asked for 1.4 MB
    (["--shape", "32", "128", "2048", "--kernels", "12:nt", "--sm-count", "4"], 1_650_000, True),
    # the same, a shape that fits after it: each shape is checked
    (["--shape", "32", "128", "2048", "--shape", "256", "256", "64", "--kernels", "12:nt", "--sm-count", "4"],
     1_650_000, True),
])
def test_the_memory_check_refuses_what_does_not_fit_and_only_that(argv, free, refused, monkeypatch, capsys):
    monkeypatch.setattr(cli, "available_memory", lambda device="cpu": free)
    if refused:
        with pytest.raises(cli.UserError, match="M=32 N=128 K=2048 need about .* GiB of memory"):
            counters.main(argv)
    else:
        assert counters.main(argv) == 0
        assert "dense_gemm_v8_nt_f32" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--kernels", "99:nt"], "no version 99"),
    (["--kernels", "8:xy"], "VERSION:LAYOUT"),
    (["--kernels", "grad:9"], "no sigmoid-grad version 9"),
    (["--kernels", "tune99:nt"], "no autotuning candidate 99"),
    (["--kernels", "tune0:nt", "--dtype", "float64"], "float32 only"),
    (["--kernels", "22:nt"], "version 22 is not built for float32"),
    (["--kernels", "25:nt", "--dtype", "bfloat16"], "version 25 is not built for bfloat16"),
    (["--kernels", "3:nt", "--dtype", "float32", "float16"], "version 3 is not built for float16"),
    (["--kernels", "31:nt", "--dtype", "bfloat16"], "version 31 is one of Hopper's"),
    (["--kernels", "34:nt"], "version 34 is one of Hopper's"),
    (["--shape", "200000", "200000", "200000"], "GiB of memory"),
    (["--json", "/nonexistent/folder/x.json"], "--json"),
    (["--compare", "/nonexistent.json"], "no such file"),
])
def test_bad_input_is_one_line_before_any_work(args, message):
    result = run_script("cuda/counters.py", *args, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "building" not in result.stderr


def test_an_empty_shape_is_a_usage_error():
    # M, N or K of 0: an empty product has no requests to count; argparse's usage and one error line
    result = run_script("cuda/counters.py", "--shape", "0", "4", "4", timeout=60)
    assert result.returncode == 2 and "--shape: must be at least 1, got '0'" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr and "building" not in result.stderr


def test_a_compiler_without_kernel_address_callbacks_is_refused_with_the_way_out(tmp_path, monkeypatch):
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\necho 'clang version 18.0.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert "set CXX=g++" in counters.unavailable_reason()
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert "not on the PATH" in counters.unavailable_reason()
    # (the build's name holds the compiler's: with CXX changed there is no build to fall back on)
    result = run_script("cuda/counters.py", "--kernels", "1:nt", env={"CXX": str(fake)}, timeout=60)
    assert result.returncode == 2 and "set CXX=g++" in result.stderr and "Traceback" not in result.stderr


def test_the_plain_emulation_is_not_instrumented():
    # grad_check.py cuda --emulate loads the plain build: no callback is compiled into it.
    emulated = load_script("cuda/emulated.py", "dense_cuda_emulated_plain")
    symbols = subprocess.run(["nm", "-D", str(emulated.build())], capture_output=True, text=True).stdout
    assert "emu_gemm" in symbols and "__asan" not in symbols and "cnt_" not in symbols
