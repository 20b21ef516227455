"""LUT multipliers: bit-exact against a model, and built without DSP blocks."""
import os

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.fpga.synth import synth_cells, synth_component_cells
from tpugen.hdl import ProcessingElement
from tpugen.hdl.array import lut_multiplier_pes
from tpugen.hdl.pe import lut_multiply_add


def wrap(value, width):
    return (value + 2 ** (width - 1)) % 2 ** width - 2 ** (width - 1)


def operand_cases(data_width, act_width, acc_width, seed):
    """(act, weight, psum): every pair when small (or TPUGEN_EXHAUSTIVE=1), else each extreme of
    one operand against every value of the other, plus random pairs. Psums include the extremes,
    so the accumulation wraps both ways."""
    acts = range(-2 ** (act_width - 1), 2 ** (act_width - 1))
    weights = range(-2 ** (data_width - 1), 2 ** (data_width - 1))
    if len(acts) * len(weights) <= 4096 or os.environ.get("TPUGEN_EXHAUSTIVE") == "1":
        pairs = [(a, w) for a in acts for w in weights]
    else:
        rng = np.random.default_rng(seed)
        randoms = zip(rng.choice(acts, 1000), rng.choice(weights, 1000))
        pairs = ([(a, w) for a in (acts[0], -1, 0, 1, acts[-1]) for w in weights]
                 + [(a, w) for w in (weights[0], -1, 0, 1, weights[-1]) for a in acts]
                 + [(int(a), int(w)) for a, w in randoms])
    rng = np.random.default_rng(seed + 1)
    low, high = -2 ** (acc_width - 1), 2 ** (acc_width - 1) - 1
    psums = [low, high, 0, -1, low + 1, high - 1] + [
        int(x) for x in rng.integers(low, high, len(pairs), endpoint=True)]
    return [(a, w, psum) for (a, w), psum in zip(pairs, psums)]


@pytest.mark.parametrize("data_width,act_width,acc_width", [
    (8, 9, 32), (8, 9, 17), (5, 7, 12), (4, 4, 8), (3, 4, 7), (2, 2, 4)])
def test_lut_multiply_add_matches_the_model(data_width, act_width, acc_width):
    m = Module()
    act, weight = Signal(signed(act_width)), Signal(signed(data_width))
    psum, result = Signal(signed(acc_width)), Signal(signed(acc_width))
    m.d.comb += result.eq(lut_multiply_add(m, psum, act, weight))
    cases = operand_cases(data_width, act_width, acc_width, seed=data_width * 100 + act_width)
    mismatches = []

    async def testbench(ctx):
        for a, w, p in cases:
            ctx.set(act, a)
            ctx.set(weight, w)
            ctx.set(psum, p)
            if ctx.get(result) != wrap(p + a * w, acc_width):
                mismatches.append((a, w, p, ctx.get(result)))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert mismatches == []


def test_pe_rejects_a_lut_multiplier_that_is_not_a_bool(refuses):
    refuses(lambda: ProcessingElement(lut_multiplier=1), "lut_multiplier")


@pytest.mark.parametrize("rows,cols,luts,expected", [
    (2, 3, 0, set()),
    (2, 3, 3, {(1, 1), (0, 2), (1, 2)}),
    (16, 16, 100, {(r, c) for r in range(16) for c in range(16)
                   if c >= 10 or (c == 9 and r >= 12)}),
    (1, 4, 4, {(0, c) for c in range(4)}),
])
def test_lut_pes_fill_whole_columns_from_the_right(rows, cols, luts, expected):
    config = CoreConfig(rows=rows, cols=cols, lut_multipliers=luts)
    assert lut_multiplier_pes(config) == expected


# iCE40 with -dsp so that `*` may use SB_MAC16.
SYNTH_OPTIONS = {"ecp5": (), "ice40": ("-dsp",)}
DSP_CELL = {"ecp5": "MULT18X18D", "ice40": "SB_MAC16"}


def luts(cells, family):
    """LUT4s, counting each ECP5 CCU2C (two bits of carry chain) as the two LUT4s it holds."""
    if family == "ecp5":
        return cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
    return cells.get("SB_LUT4", 0)


# LUT4s of one PE as measured (yosys 0.70): ecp5 DSP PE 42, LUT PE 193; ice40 43 and 151.
# The bound catches the partial products summed as one $macc of full adders (436 on ecp5).
LUT_PE_BUDGET = {"ecp5": 215, "ice40": 170}


@pytest.mark.parametrize("family", SYNTH_OPTIONS)
def test_lut_pe_uses_no_dsp_and_few_luts(family):
    cells = {lut_multiplier: synth_component_cells(
                 ProcessingElement(data_width=8, acc_width=32, act_width=9,
                                   lut_multiplier=lut_multiplier),
                 family, name="pe", options=SYNTH_OPTIONS[family])
             for lut_multiplier in (False, True)}
    assert cells[False].get(DSP_CELL[family]) == 1, cells[False]
    assert DSP_CELL[family] not in cells[True], cells[True]
    assert luts(cells[True], family) <= LUT_PE_BUDGET[family], cells[True]


def test_mixed_array_uses_one_dsp_per_dsp_pe():
    config = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, lut_multipliers=5)
    cells = synth_cells(config, "ecp5", "systolic_array")
    assert cells.get("MULT18X18D") == config.macs - config.lut_multipliers, cells
