"""cocotb testbench of the systolic array: random tiles, bit-exact against numpy, cycle counts.

Parameters come from the TPUGEN_TB environment variable (JSON): ``config`` (CoreConfig JSON),
``seed`` and ``tile_lengths`` (activation vectors per weight tile). The measured cycles are
written to ``stats.json`` in the test directory.
"""
import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

from tpugen import CoreConfig
from tpugen.hdl.array import act_width

from .golden import matmul_int32


def pack(values, width):
    """Little-endian packing of signed lanes into one integer (lane 0 in the low bits)."""
    mask = (1 << width) - 1
    return sum((int(v) & mask) << (i * width) for i, v in enumerate(values))


def unpack(value, lanes, width):
    value = int(value)
    out = []
    for i in range(lanes):
        lane = (value >> (i * width)) & ((1 << width) - 1)
        out.append(lane - (1 << width) if lane >> (width - 1) else lane)
    return out


@cocotb.test()
async def random_tiles(dut):
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    rows, cols = cfg.rows, cfg.cols
    rng = np.random.default_rng(params["seed"])
    lengths = params["tile_lengths"]
    weights = [rng.integers(-128, 128, (rows, cols), dtype=np.int64) for _ in lengths]
    acts = [rng.integers(-128, 128, (m, rows), dtype=np.int64) for m in lengths]
    expected = np.concatenate([matmul_int32(a, w) for a, w in zip(acts, weights)])
    total = len(expected)

    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.weights__valid.value = 0
    dut.acts__valid.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await FallingEdge(dut.clk)
    dut.rst.value = 0

    weight_rows = [row for tile in weights for row in tile]
    act_vectors = [(vector, i == len(block) - 1) for block in acts for i, vector in enumerate(block)]
    accepted, results, lasts = [], [], []
    cycle = 0
    limit = 20 * (total + len(weight_rows) + rows + cols) + 100
    while len(results) < total:
        await FallingEdge(dut.clk)
        cycle += 1
        assert cycle < limit, f"hang: {len(results)}/{total} results after {cycle} cycles"
        if dut.results__valid.value:
            payload = int(dut.results__payload.value)
            results.append(unpack(payload, cols, cfg.acc_width))
            lasts.append(payload >> (cols * cfg.acc_width) & 1)
        if weight_rows and dut.weights__ready.value:
            dut.weights__payload.value = pack(weight_rows.pop(0), cfg.data_width)
            dut.weights__valid.value = 1
        else:
            dut.weights__valid.value = 0
        if act_vectors and dut.acts__ready.value:
            vector, last = act_vectors.pop(0)
            dut.acts__payload.value = pack(vector, act_width(cfg)) | int(last) << (rows * act_width(cfg))
            dut.acts__valid.value = 1
            accepted.append(cycle)
        else:
            dut.acts__valid.value = 0
    result_cycles = cycle

    got = np.array(results, dtype=np.int64)
    mismatches = np.argwhere(got != expected)
    assert not len(mismatches), f"{len(mismatches)} mismatches, first at {mismatches[0]}"
    assert lasts == [int(i == m - 1) for m in lengths for i in range(m)]
    stats = {"rows": rows, "cols": cols, "tile_lengths": lengths, "cycles": result_cycles,
             "first_act_cycle": accepted[0], "last_act_cycle": accepted[-1],
             "act_cycles": accepted[-1] - accepted[0] + 1, "vectors": total,
             "macs": total * rows * cols}
    with open("stats.json", "w") as f:
        json.dump(stats, f)
