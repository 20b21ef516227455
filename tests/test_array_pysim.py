"""Fast amaranth.sim unit tests of the processing element and of a small array."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.hdl import ProcessingElement, SystolicArray


def run(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("lut_multiplier", [False, True], ids=["dsp", "lut"])
def test_pe_mac_and_weight_banks(lut_multiplier):
    dut = ProcessingElement(lut_multiplier=lut_multiplier)

    async def testbench(ctx):
        for bank, weight in ((0, -7), (1, 5)):
            ctx.set(dut.shift_in, weight)
            ctx.set(dut.shift_en, 1)
            await ctx.tick()
            ctx.set(dut.shift_en, 0)
            ctx.set(dut.commit, 1)
            ctx.set(dut.commit_bank, bank)
            await ctx.tick()
            ctx.set(dut.commit, 0)
        for sel, act, psum, expected in ((0, 3, 100, 100 - 21), (1, -128, -2**31, 2**31 - 640),
                                         (1, 127, 2**31 - 1, -2**31 + 634)):
            ctx.set(dut.sel_in, sel)
            ctx.set(dut.act_in, act)
            ctx.set(dut.psum_in, psum)
            await ctx.tick()
            assert ctx.get(dut.psum_out) == expected  # int32 wraps
            assert ctx.get(dut.act_out) == act
            assert ctx.get(dut.sel_out) == sel

    run(dut, testbench)


# LUT and DSP multipliers mixed (lut_multipliers > 0) give the same results, aligned with `valid`.
@pytest.mark.parametrize("rows,cols,lut_multipliers",
                         [(1, 1, 0), (2, 3, 0), (3, 2, 0), (1, 1, 1), (2, 3, 3), (3, 2, 4)])
def test_array_matches_numpy(rows, cols, lut_multipliers):
    cfg = CoreConfig(rows=rows, cols=cols, lut_multipliers=lut_multipliers)
    dut = SystolicArray(cfg)
    rng = np.random.default_rng(rows * 10 + cols)
    tiles = [rng.integers(-128, 128, (rows, cols)) for _ in range(3)]
    acts = [rng.integers(-128, 256, (m, rows)) for m in (1, rows + cols, 4)]  # int8 and uint8
    results = []

    async def feed_weights(ctx):
        for tile in tiles:
            for k in range(rows):
                ctx.set(dut.weights.payload, [int(x) for x in tile[k]])
                ctx.set(dut.weights.valid, 1)
                await ctx.tick().until(dut.weights.ready)
        ctx.set(dut.weights.valid, 0)

    async def feed_acts(ctx):
        for block in acts:
            for m, vector in enumerate(block):
                ctx.set(dut.acts.payload, {"data": [int(x) for x in vector],
                                           "last": m == len(block) - 1})
                ctx.set(dut.acts.valid, 1)
                await ctx.tick().until(dut.acts.ready)
        ctx.set(dut.acts.valid, 0)

    async def collect(ctx):
        expected = sum(len(block) for block in acts)
        while len(results) < expected:
            await ctx.tick()
            if ctx.get(dut.results.valid):
                payload = ctx.get(dut.results.payload)
                results.append(([payload.data[c] for c in range(cols)], payload.last))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(feed_weights)
    sim.add_testbench(feed_acts)
    sim.add_testbench(collect)
    sim.run_until(1e-3)

    expected = np.concatenate([block @ tile for block, tile in zip(acts, tiles)])
    lasts = np.concatenate([np.arange(len(block)) == len(block) - 1 for block in acts])
    assert np.array_equal(np.array([r[0] for r in results]), expected)
    assert [bool(r[1]) for r in results] == list(lasts)
