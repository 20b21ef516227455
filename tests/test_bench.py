"""The bench's analysis: compulsory bytes, the memory roofline, the limit named from the counters,
and the target table built from measured results (no simulation here: synthetic counters)."""
import json

import pytest

from tpugen.bench import (LARGE_ATTENTIONS, LARGE_CONVS, READ_LATENCY, compulsory_bytes,
                          limiting_factor, plot_bench, roofline_utilization, target_rows)
from tpugen.config import PRESETS, CoreConfig

LARGE = PRESETS["large"]


def test_compulsory_bytes():
    assert compulsory_bytes("matmul", (512, 512, 512)) == (2 * 512 * 512, 4 * 512 * 512)
    # 56x56 with padding 1 and a 3x3 kernel keeps 56x56 outputs.
    assert compulsory_bytes("conv2d", LARGE_CONVS[0]) == (64 * 56 * 56 + 64 * 64 * 9,
                                                          4 * 64 * 56 * 56)
    assert compulsory_bytes("conv2d", (1, 16, 14, 14, 32, 3, 3, 2, 1)) == (
        16 * 14 * 14 + 32 * 16 * 9, 4 * 32 * 7 * 7)
    assert compulsory_bytes("attention", LARGE_ATTENTIONS[0]) == ((512 + 2 * 512) * 64,
                                                                 4 * 512 * 64)


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


def _workload(op, shape, util):
    cycles = 100_000
    return {"op": op, "shape": list(shape), "config": "16x16", "cycles": cycles,
            "mac_utilization": util, "ideal_utilization": 0.999, "roofline_utilization": 0.99,
            "program_roofline_utilization": 0.97, "limit": "something", "bytes_read": 300_000,
            "bytes_written": 131_072, "score_matrix_bytes": 4 * 512 * 512,
            "issued_mac_utilization": util, "read_latency": READ_LATENCY}


def test_target_rows_from_results(tmp_path):
    results = {
        "workloads": [_workload("matmul", (512, 512, 512), 0.96),
                      _workload("attention", LARGE_ATTENTIONS[0], 0.61)],
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
    json.dumps(rows)

    plot = tmp_path / "bench.png"
    plot_bench(results, plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
