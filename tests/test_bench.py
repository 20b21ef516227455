"""The bench's analysis: compulsory bytes, the memory roofline, the limit named from the counters,
the target table built from measured results, and every workload's output checked against the
golden model (no simulation here: synthetic counters, a device answering from the models)."""
import json
import re

import numpy as np
import pytest

from tpugen.bench import (CONFIGS, LARGE_ATTENTIONS, LARGE_CONVS, README_BEGIN, README_END,
                          READ_LATENCY, BenchCheckError, attention_speculation, bench_markdown,
                          bench_workloads, compulsory_bytes, ideal_attention_utilization,
                          limiting_factor, measure_workloads, plot_bench, readme_with_targets,
                          roofline_utilization, run_bench, runs_on, target_rows)
from tpugen.cli import main
from tpugen.config import PRESETS, CoreConfig
from tpugen.firmware.device import Device, Stats
from tpugen.firmware.attention import plan_attention
from tpugen.sim.attention_model import attention_int8_model, speculation_hits
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32

LARGE = PRESETS["large"]


def test_compulsory_bytes():
    assert compulsory_bytes("matmul", (512, 512, 512)) == (2 * 512 * 512, 4 * 512 * 512)
    # 56x56 with padding 1 and a 3x3 kernel keeps 56x56 outputs.
    assert compulsory_bytes("conv2d", LARGE_CONVS[0]) == (64 * 56 * 56 + 64 * 64 * 9,
                                                          4 * 64 * 56 * 56)
    assert compulsory_bytes("conv2d", (1, 16, 14, 14, 32, 3, 3, 2, 1)) == (
        16 * 14 * 14 + 32 * 16 * 9, 4 * 32 * 7 * 7)
    # With the epilogue, int8 outputs.
    assert compulsory_bytes("conv2d_epilogue", LARGE_CONVS[0]) == (64 * 56 * 56 + 64 * 64 * 9,
                                                                   64 * 56 * 56)
    assert compulsory_bytes("conv2d_pool", (1, 3, 9, 7, 5, 3, 3, 1, 1)) == (3 * 9 * 7 + 5 * 27,
                                                                        5 * 4 * 3)
    assert compulsory_bytes("attention", LARGE_ATTENTIONS[0]) == ((512 + 2 * 512) * 64,
                                                                 4 * 512 * 64)


def test_ideal_attention_counts_the_tiles_each_query_needs():
    large = CoreConfig(rows=16, cols=16)
    # L = S = d = 16: one key tile and one key chunk per query, causal or not, plus the fill.
    assert ideal_attention_utilization(large, 16, 16, 16) == 2 * 16 ** 3 / (64 * 256)
    # Causal: query i has i + 1 keys, 136 pairs of 2*d MACs, in the same tiles.
    assert ideal_attention_utilization(large, 16, 16, 16, causal=True) == 2 * 16 * 136 / (64 * 256)
    # L < S: query i keeps keys j <= i + S - L; at S = 2 L causal skips tiles past the diagonal.
    assert (ideal_attention_utilization(large, 64, 128, 64, causal=True)
            > 0.9 * ideal_attention_utilization(large, 64, 128, 64))


def test_roofline_compute_bound_and_bus_bound():
    macs = 512 ** 3
    # 16x16, 16 B/beat: 512 KiB of operands is 32k read cycles, far below 524k compute cycles.
    assert roofline_utilization(LARGE, macs, 1.0, 512 * 1024, 1 << 20) == pytest.approx(1.0)
    # Reading 16 MiB takes 1M cycles: the bus bounds utilization at 524,288 / 1,048,576.
    assert roofline_utilization(LARGE, macs, 1.0, 16 << 20, 0) == pytest.approx(0.5)
    # Writes count on their own channel.
    assert roofline_utilization(LARGE, macs, 1.0, 0, 16 << 20) == pytest.approx(0.5)
    # The ideal caps it.
    assert roofline_utilization(LARGE, macs, 0.9, 0, 0) == pytest.approx(0.9)
    narrow = CoreConfig(rows=16, cols=16, axi_data_width=32)
    assert roofline_utilization(narrow, macs, 1.0, 4 << 20, 0) == pytest.approx(0.5)


def _entry(op="matmul", cycles=1000, util=0.5, issued=0.5, execute_busy=1000, read=0, written=0):
    return {"op": op, "cycles": cycles, "mac_utilization": util, "issued_mac_utilization": issued,
            "execute_busy_cycles": execute_busy, "bytes_read": read, "bytes_written": written}


@pytest.mark.parametrize("entry, expected", [
    (_entry(execute_busy=600, util=0.55, issued=0.55), "execute waits for loads or tokens: 40.0%"),
    (_entry(execute_busy=1000, util=0.5, issued=0.5), "fill/drain and instruction issue: 50.0%"),
    (_entry(op="attention", execute_busy=1000, util=0.6, issued=0.6),
     "softmax passes and per-MATMUL fill: 40.0%"),
    (_entry(execute_busy=950, util=0.5, issued=0.9), "unused array lanes (partial tiles): 40.0%"),
    (_entry(execute_busy=500, util=0.5, issued=0.5, read=16 * 950),
     "memory bus: 95% of cycles move a beat; then execute waits for loads or tokens: 50.0%"),
])
def test_limiting_factor_names_the_largest_loss(entry, expected):
    assert limiting_factor(LARGE, entry).startswith(expected)


def test_limiting_factor_of_attention_names_the_speculation_hit_rate():
    entry = _entry(op="attention", execute_busy=1000, util=0.6, issued=0.6)
    spread = {"fraction": 0.9273, "hits": 7122, "query_blocks": 7680}
    assert limiting_factor(LARGE, {**entry, "speculation_hits": spread}) == (
        "softmax passes and per-MATMUL fill: 40.0% of cycles; speculation hit 92.7% of 7,680 "
        "query blocks")
    one_block = {"fraction": None, "hits": 0, "query_blocks": 0}
    assert limiting_factor(LARGE, {**entry, "speculation_hits": one_block}) == (
        "softmax passes and per-MATMUL fill: 40.0% of cycles; no speculation (one block of keys "
        "per query)")


def _workload(op, shape, util, seconds=1.0):
    cycles = 100_000
    return {"op": op, "shape": list(shape), "config": "16x16", "cycles": cycles,
            "sim_seconds": seconds, "sim_cycles_per_second": round(cycles / seconds),
            "mac_utilization": util, "ideal_utilization": 0.999, "roofline_utilization": 0.99,
            "program_roofline_utilization": 0.97, "limit": "something", "bytes_read": 300_000,
            "bytes_written": 131_072, "score_matrix_bytes": 4 * 512 * 512,
            "issued_mac_utilization": util, "read_latency": READ_LATENCY, "check": "exact"}


def test_target_rows_from_results(tmp_path):
    results = {
        "workloads": [_workload("matmul", (512, 512, 512), 0.96),
                      _workload("attention", LARGE_ATTENTIONS[0], 0.61, seconds=3.0)],
        "boards": [{"board": "icebreaker", "rows": 4, "cols": 4, "target_mhz": 25.0,
                    "report": {"overflow": ["luts"], "fmax_mhz": None,
                               "resources": {"luts": {"percent": 1122.0}}}},
                   {"board": "ulx3s-85f", "rows": 16, "cols": 16, "target_mhz": 100.0,
                    "report": None}],
        "sim_speed": {"cycles_per_second": 61_000.0, "limit": "Verilator"},
        "generate_tpu_core_16x16_seconds": 11.5,
    }
    rows = {row["what"]: row for row in target_rows(results)}
    matmul = rows[f"matmul 512^3 on 16x16, read latency {READ_LATENCY}"]
    assert matmul["met"] is True and matmul["measured"].startswith("96.0%")
    conv = rows["conv2d 3x3 64->64 56x56 pad 1 on 16x16"]
    assert conv["met"] is None and conv["measured"] is None
    attention = rows["fused attention L=S=512 d=64 on 16x16"]
    assert attention["met"] is False and "13.2 L*d" in attention["measured"]
    assert rows["4x4 on icebreaker"]["met"] is False
    assert "does not fit: luts 1122%" in rows["4x4 on icebreaker"]["measured"]
    assert rows["16x16 on ulx3s-85f"]["met"] is None
    assert "tpugen build --board ulx3s-85f --rows 16 --cols 16" in rows["16x16 on ulx3s-85f"]["limit"]
    assert rows["8x8 core under cocotb + Verilator"]["met"] is True
    assert rows["tpugen generate 16x16"]["met"] is False
    sim_16x16 = rows["SimDevice 16x16, one call each (compile, write, run, read back)"]
    assert sim_16x16["met"] is True and sim_16x16["measured"].startswith("50,000 cycles/s")
    assert "(slowest 33,333)" in sim_16x16["measured"]
    assert rows["SimDevice 8x8, one call each (compile, write, run, read back)"]["met"] is None
    json.dumps(rows)
    results["targets"] = target_rows(results)
    markdown = bench_markdown(results)
    assert "| matmul 512^3 on 16x16, read latency 20 | >= 95% | 96.0% (100,000 cycles)" in markdown
    assert markdown.count("\n| 16x16 | ") == 2  # a row per workload

    readme = f"# x\n{README_BEGIN}\n| old |\n{README_END}\nafter\n"
    updated = readme_with_targets(readme, results)
    assert "| old |" not in updated and updated.endswith(f"{README_END}\nafter\n")
    assert "| matmul 512^3 on 16x16, read latency 20 | >= 95% | 96.0%" in updated
    assert readme_with_targets(updated, results) == updated  # the same run: the same README

    plot = tmp_path / "bench.png"
    plot_bench(results, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_readme_without_the_bench_markers_is_refused():
    for readme in ("# no markers\n", f"{README_END}\n{README_BEGIN}\n"):
        with pytest.raises(ValueError, match="bench targets: begin"):
            readme_with_targets(readme, {"targets": []})


SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
TINY_WORKLOADS = [("matmul", (5, 7, 3)), ("conv2d", (1, 2, 5, 5, 3, 3, 3, 1, 1)),
                  ("conv2d_epilogue", (1, 3, 6, 5, 5, 3, 3, 2, 1)),
                  ("conv2d_pool", (1, 3, 7, 9, 5, 3, 3, 1, 1)),
                  ("attention", (5, 7, 4, False)), ("attention", (5, 7, 4, True)),
                  ("attention", (9, 70, 4, True))]


class _GoldenDevice(Device):
    """A device that answers from the golden models instead of a simulation (made-up counters);
    ``wrong`` names the op whose answer is off by one in one element."""

    def __init__(self, config, wrong=None, **options):
        super().__init__(config, 1 << 20)
        self.wrong = wrong
        self.attention_inputs = []  # (q, k, v, frac, causal) of each attention_int8

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def _answer(self, op, result):
        self.stats = Stats(cycles=1000, macs=500, issued_macs=500, array_macs=1,
                           bytes_read=100,
                           bytes_written=100, load_busy_cycles=300, execute_busy_cycles=600,
                           store_busy_cycles=100)
        result = np.array(result)
        if op == self.wrong:
            result.flat[result.size // 2] += 1
        return result

    def matmul(self, a, b):
        return self._answer("matmul", matmul_int32(a, b).astype(np.int32))

    def conv2d(self, x, w, stride=1, padding=0, **epilogue):
        acc = conv2d_int32(x, w, stride, padding)
        if epilogue:
            op = "conv2d_pool" if epilogue.get("pool") else "conv2d_epilogue"
            return self._answer(op, apply_epilogue(acc, 1, (2, 3), **epilogue))
        return self._answer("conv2d", acc.astype(np.int32))

    def attention_int8(self, q, k, v, frac, causal=False):
        # `Device.attention` quantizes, calls this and dequantizes: the runtime's own float path.
        self.attention_inputs.append((q, k, v, frac, causal))
        return self._answer("attention", attention_int8_model(self.config, q, k, v, frac,
                                                              causal=causal))


def test_every_bench_workload_is_checked_against_the_golden_model():
    device = _GoldenDevice(SMALL)
    entries = measure_workloads(device, "4x4", TINY_WORKLOADS, np.random.default_rng(0))
    assert [(e["op"], e["check_passed"]) for e in entries] == [
        ("matmul", True), ("conv2d", True), ("conv2d_epilogue", True), ("conv2d_pool", True),
        ("attention", True), ("attention", True), ("attention", True)]
    assert [e["check"] for e in entries[:4]] == ["exact"] * 4
    for entry in entries[4:]:
        assert re.fullmatch(r"exact, float err \d\.\d\d%", entry["check"]), entry["check"]
    assert entries[5]["useful_macs"] < entries[4]["useful_macs"]  # causal: masked pairs
    # The speculation's hits, counted by the model on the inputs the device ran.
    assert all("speculation_hits" not in e for e in entries[:4])
    for entry, inputs in zip(entries[4:], device.attention_inputs, strict=True):
        hits, blocks = speculation_hits(SMALL, *inputs)
        fraction = round(hits / blocks, 4) if blocks else None
        assert entry["speculation_hits"] == {"fraction": fraction, "hits": hits,
                                             "query_blocks": blocks}
    assert entries[4]["limit"].endswith("; no speculation (one block of keys per query)")
    spread = entries[6]["speculation_hits"]
    assert 0 < spread["hits"] < spread["query_blocks"]
    assert entries[6]["limit"].endswith(f"; speculation hit {spread['fraction']:.1%} of "
                                        f"{spread['query_blocks']:,} query blocks")
    markdown = bench_markdown({"targets": [], "workloads": entries})
    assert markdown.count("; speculation hit ") == 1


def test_attention_speculation_by_hand():
    """Query 0's scores rise with the key, query 1's fall: in each block after the first (4
    blocks of up to 28 keys on the 4x4 core) query 0's max rises (a miss), query 1's stays key
    0's (a hit). Equal scores hit everywhere; one block has nothing to speculate on."""
    assert plan_attention(SMALL, 2, 100, 4).query_blocks(False) == [
        (0, 2, [(0, 7), (28, 7), (56, 7), (84, 4)])]
    q = np.array([[1, 0, 0, 0], [-1, 0, 0, 0]], np.float32)
    k = np.zeros((100, 4), np.float32)
    k[:, 0] = np.arange(100) - 50
    assert attention_speculation(SMALL, (q, k, k, False)) == {
        "fraction": 0.5, "hits": 3, "query_blocks": 6}
    assert attention_speculation(SMALL, (q, 0 * k, k, False)) == {
        "fraction": 1.0, "hits": 6, "query_blocks": 6}
    assert attention_speculation(SMALL, (q, k[:5], k[:5], False)) == {
        "fraction": None, "hits": 0, "query_blocks": 0}


@pytest.mark.parametrize("wrong", list(dict.fromkeys(op for op, _ in TINY_WORKLOADS)))
def test_bench_fails_on_a_wrong_answer(monkeypatch, capsys, wrong):
    """One element off by one (for attention: by one unit of the int8 output, far inside the
    float tolerance) fails that workload's check and the whole bench."""
    import tpugen.bench
    import tpugen.sim.speed

    def went_on(*args, **options):
        raise AssertionError("the bench went on after a wrong answer")

    monkeypatch.setattr(tpugen.sim, "SimDevice",
                        lambda config, **options: _GoldenDevice(config, wrong))
    monkeypatch.setattr(tpugen.bench, "_speed", lambda results: None)
    monkeypatch.setattr(tpugen.sim.speed, "measure_sim_speed", went_on)
    monkeypatch.setattr(tpugen.bench, "bench_workloads", lambda large: TINY_WORKLOADS)
    with pytest.raises(BenchCheckError, match=f"{wrong} .*MISMATCH: 1 of") as info:
        run_bench(configs={"4x4": SMALL})
    checks = [(e["op"], e["check_passed"]) for e in info.value.results["workloads"]]
    assert checks == [(op, op != wrong) for op, _ in TINY_WORKLOADS]
    assert {e["op"] for e in info.value.failures} == {wrong}
    progress = capsys.readouterr().err.splitlines()
    assert len(progress) == len(TINY_WORKLOADS)
    assert progress[0].startswith(f"[1/{len(TINY_WORKLOADS)}] 4x4 matmul ")
    assert progress[-1].endswith("about 0 s left)")


def test_bench_command_fails_and_keeps_the_results_on_a_wrong_answer(monkeypatch, tmp_path,
                                                                     capsys):
    import tpugen.bench

    entry = {**_workload("matmul", (5, 7, 3), 0.5), "check": "MISMATCH: 1 of 15 elements differ",
             "check_passed": False}

    def wrong_bench(**options):
        raise BenchCheckError([entry], {"workloads": [entry]})

    monkeypatch.setattr(tpugen.bench, "run_bench", wrong_bench)
    out = tmp_path / "bench.json"
    assert main(["bench", "-o", str(out)]) == 1
    assert json.loads(out.read_text())["workloads"][0]["check_passed"] is False
    err = capsys.readouterr().err
    assert "FAILED: 1 workload(s) gave a wrong answer: 16x16 matmul 5x7x3" in err


def test_the_micro_core_runs_the_matmuls_only():
    """The bench runs each workload on the cores that can: micro (no softmax unit, no im2col
    walker) the matmuls, the full cores everything."""
    ops = {op for op, _ in bench_workloads(False)}
    assert ops == {"matmul", "conv2d", "attention"}
    assert {op for op in ops if runs_on(CONFIGS["micro"], op)} == {"matmul"}
    assert all(runs_on(CONFIGS["8x8"], op) and runs_on(CONFIGS["16x16"], op) for op in ops)
    assert all(runs_on(CONFIGS["16x16"], op) for op in ("conv2d_epilogue", "conv2d_pool"))
