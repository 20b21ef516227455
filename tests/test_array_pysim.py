"""Fast amaranth.sim unit tests of the processing element and of a small array."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.arch import min_tile_length, tile_cycles
from tpugen.hdl import ProcessingElement, SystolicArray
from tpugen.hdl.array import psum_width
from tpugen.hdl.pe import PRODUCT_STAGES
from tpugen.sim.testbench import ForFamily, stream_get, stream_put


MULTIPLIERS = {"mul": lambda dut: dut, "ice40": lambda dut: ForFamily(dut, "ice40"),
               "ecp5": lambda dut: ForFamily(dut, "ecp5")}
"""How the array's DSP PEs are built: ``*`` and a register of the fabric (the simulators),
SB_MAC16 halves (see tests/test_pe_multipliers.py for the block's own model), or MULT18X18D
blocks registering the product (`dsp.mult18x18d`)."""


def run(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("lut_multiplier", [False, True], ids=["dsp", "lut"])
def test_pe_mac_and_weight_switch(lut_multiplier):
    dut = ProcessingElement(lut_multiplier=lut_multiplier)

    async def load(ctx, weight):
        ctx.set(dut.shift_in, weight)
        ctx.set(dut.shift_en, 1)
        await ctx.tick()
        ctx.set(dut.shift_en, 0)
        ctx.set(dut.commit, 1)
        await ctx.tick()
        ctx.set(dut.commit, 0)

    async def testbench(ctx):
        await load(ctx, -7)
        ctx.set(dut.switch_in, 1)
        await ctx.tick()
        await load(ctx, 5)  # upcoming while -7 stays active
        # (switch, act, psum_in, psum_out): psum_in meets the product of the activation
        # PRODUCT_STAGES cycles before it; the switch takes effect from the next activation.
        cases = ((0, 3, 100, 100 - 21), (1, -128, -2**31, -2**31 + 896),
                 (0, 127, 2**31 - 1, -2**31 + 634), (0, -1, 7, 2))
        for cycle in range(len(cases) + PRODUCT_STAGES):
            if cycle < len(cases):
                switch, act, _, _ = cases[cycle]
                ctx.set(dut.switch_in, switch)
                ctx.set(dut.act_in, act)
            if cycle >= PRODUCT_STAGES:
                ctx.set(dut.psum_in, cases[cycle - PRODUCT_STAGES][2])
            await ctx.tick()
            if cycle < len(cases):
                assert ctx.get(dut.act_out) == act
                assert ctx.get(dut.switch_out) == switch
            if cycle >= PRODUCT_STAGES:
                expected = cases[cycle - PRODUCT_STAGES][3]
                assert ctx.get(dut.psum_out) == expected  # int32 wraps

    run(dut, testbench)


def run_array(cfg, tiles, acts, multiplier="mul"):
    """Results (data, last) of ``acts`` blocks through ``cfg``'s array, one block per tile."""
    rows, cols = cfg.rows, cfg.cols
    dut = SystolicArray(cfg)
    results = []

    async def feed_weights(ctx):
        for tile in tiles:
            for k in range(rows):
                await stream_put(ctx, dut.weights, [int(x) for x in tile[k]])

    async def feed_acts(ctx):
        for block in acts:
            for m, vector in enumerate(block):
                await stream_put(ctx, dut.acts, {"data": [int(x) for x in vector],
                                                 "last": m == len(block) - 1})

    async def collect(ctx):
        for _ in range(sum(len(block) for block in acts)):
            payload = await stream_get(ctx, dut.results)
            results.append(([payload.data[c] for c in range(cols)], payload.last))

    sim = Simulator(MULTIPLIERS[multiplier](dut))
    sim.add_clock(1e-6)
    sim.add_testbench(feed_weights)
    sim.add_testbench(feed_acts)
    sim.add_testbench(collect)
    sim.run_until(1e-3)
    return results


# LUT and DSP multipliers mixed (lut_multipliers > 0) give the same results, aligned with `valid`;
# on iCE40 the DSP PEs pair up on SB_MAC16s (an odd one alone on its block).
# Without `weight_prefetch` (two weight registers a PE) the same, tiles of one vector too.
# With `broadcast_activations` (int8 activations, without the softmax unit) the iCE40 pairs lie
# along the rows and keep their weights in the SB_MAC16's B register where both are in one row
# (`ice40_weights_in_block`; 2x3 and 3x3: a pair across two rows keeps them in the fabric).
# With `adder_tree_columns` ("tree") the columns sum their products in one cycle: every kind of
# PE, odd and even row counts, with broadcast activations or skewed columns. Without
# `weight_chain` ("direct") the rows load straight into the active weights (SB_MAC16 B
# registers, or the fabric's for a pair across two rows or a LUT PE).
@pytest.mark.parametrize("multiplier", MULTIPLIERS)
@pytest.mark.parametrize("rows,cols,lut_multipliers,weight_prefetch,broadcast,tree,direct",
                         [(1, 1, 0, True, False, False, False),
                          (2, 3, 0, True, False, False, False),
                          (3, 2, 0, True, False, False, False),
                          (1, 1, 1, True, False, False, False),
                          (2, 3, 3, True, False, False, False),
                          (3, 2, 4, True, False, False, False),
                          (1, 1, 0, False, False, False, False),
                          (4, 4, 0, False, False, False, False),
                          (3, 2, 4, False, False, False, False),
                          (4, 4, 0, False, True, False, False), (2, 3, 0, True, True, False, False),
                          (3, 3, 2, False, True, False, False), (4, 4, 0, False, True, True, False),
                          (3, 2, 4, True, True, True, False), (5, 3, 0, False, False, True, False),
                          (1, 2, 1, True, True, True, False), (4, 4, 0, False, True, True, True),
                          (3, 3, 2, False, True, True, True), (1, 2, 1, False, True, True, True)])
def test_array_matches_numpy(rows, cols, lut_multipliers, weight_prefetch, broadcast, tree,
                             direct, multiplier):
    cfg = CoreConfig(rows=rows, cols=cols, lut_multipliers=lut_multipliers,
                     weight_prefetch=weight_prefetch, broadcast_activations=broadcast,
                     adder_tree_columns=tree, softmax=not broadcast, weight_chain=not direct)
    rng = np.random.default_rng(rows * 10 + cols)
    tiles = [rng.integers(-128, 128, (rows, cols)) for _ in range(3)]
    top = 256 if cfg.softmax else 128  # int8 and uint8, or int8 only
    acts = [rng.integers(-128, top, (m, rows)) for m in (1, rows + cols, 4)]
    results = run_array(cfg, tiles, acts, multiplier)

    expected = np.concatenate([block @ tile for block, tile in zip(acts, tiles)])
    lasts = np.concatenate([np.arange(len(block)) == len(block) - 1 for block in acts])
    assert np.array_equal(np.array([r[0] for r in results]), expected)
    assert [bool(r[1]) for r in results] == list(lasts)


@pytest.mark.parametrize("changes", [{}, {"weight_prefetch": False},
                                     {"weight_prefetch": False, "broadcast_activations": True,
                                      "adder_tree_columns": True},
                                     {"weight_prefetch": False, "broadcast_activations": True,
                                      "adder_tree_columns": True, "weight_chain": False}])
def test_tiles_take_the_cycles_of_the_cost_model(changes):
    # `arch.tile_cycles`, which the compilers' estimates use: with weights and vectors always
    # on offer, a tile's first vector is taken that many cycles (of the tile before's count)
    # after the first vector of the tile before: short tiles, long ones, one of one vector.
    cfg = CoreConfig(rows=4, cols=3, softmax=False, **changes)
    counts = [1, 2, min_tile_length(cfg), 9, 1, 3]
    dut = SystolicArray(cfg)
    taken = []

    async def feed_weights(ctx):
        for _ in counts:
            for _ in range(cfg.rows):
                await stream_put(ctx, dut.weights, [1] * cfg.cols)

    async def feed_acts(ctx):
        for count in counts:
            for m in range(count):
                await stream_put(ctx, dut.acts, {"data": [1] * cfg.rows, "last": m == count - 1})

    async def watch(ctx):
        cycle = 0
        async for _, _, valid, ready in ctx.tick().sample(dut.acts.valid, dut.acts.ready):
            if valid and ready:
                taken.append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(feed_weights)
    sim.add_testbench(watch, background=True)
    sim.add_testbench(feed_acts)
    sim.run()
    firsts = [taken[sum(counts[:i])] for i in range(len(counts))]
    assert len(taken) == sum(counts)
    assert [b - a for a, b in zip(firsts, firsts[1:])] == [tile_cycles(cfg, count)
                                                            for count in counts[:-1]]


def test_partial_sums_are_narrow():
    assert [psum_width(CoreConfig(rows=rows)) for rows in (1, 2, 3, 4, 8, 16, 64)] == [
        17, 18, 19, 19, 20, 21, 23]
    # Without the softmax unit activations are int8: a bit less.
    assert [psum_width(CoreConfig(rows=rows, softmax=False))
            for rows in (1, 2, 3, 4, 8, 16, 64)] == [16, 17, 18, 18, 19, 20, 22]


# Every PE at the extreme product: a column sums rows of them, so a partial sum one bit narrower
# than psum_width wraps. -256 x -128 = 32,768 is beyond 16 bits (int9, which no execute sends);
# -128 x -128 and 255 x -128 are the extremes of int8 and uint8 activations.
@pytest.mark.parametrize("multiplier", MULTIPLIERS)
@pytest.mark.parametrize("rows,lut_multipliers", [(1, 0), (2, 1), (3, 0), (4, 2), (8, 0), (16, 0)])
def test_worst_case_sums_do_not_wrap(rows, lut_multipliers, multiplier):
    cfg = CoreConfig(rows=rows, cols=2, lut_multipliers=lut_multipliers)
    tiles = [np.full((rows, 2), -128), np.array([[-128, 127]] * rows)]
    extremes = [-256, -128, 255, -129, 128, 127]
    acts = [np.array([[a] * rows for a in extremes]), np.array([[a] * rows for a in extremes])]
    results = run_array(cfg, tiles, acts, multiplier)
    expected = np.concatenate([block @ tile for block, tile in zip(acts, tiles)])
    assert np.array_equal(np.array([r[0] for r in results]), expected)
    assert expected.max() == rows * 32768 and expected.min() == -rows * 32640


# The same for a core without the softmax unit, whose activations are int8 (`act_width` 8) and
# whose partial sums are a bit narrower: -128 x -128 and 127 x -128 at every PE. With adder
# tree columns and broadcast activations ("tree", micro's array) an iCE40 block adds the
# products of the row above (`ice40_column_cascades`): two of -128 x -128 wrap its 16 bits.
@pytest.mark.parametrize("multiplier", MULTIPLIERS)
@pytest.mark.parametrize("rows,cols,lut_multipliers,tree", [
    (1, 1, 0, False), (3, 2, 1, False), (4, 4, 0, False), (4, 3, 5, False), (8, 2, 0, False),
    (4, 4, 0, True), (3, 4, 0, True), (5, 3, 2, True), (2, 1, 0, True)])
def test_an_int8_array_computes_exactly_to_its_extremes(rows, cols, lut_multipliers, tree,
                                                        multiplier):
    cfg = CoreConfig(rows=rows, cols=cols, lut_multipliers=lut_multipliers, softmax=False,
                     broadcast_activations=tree, adder_tree_columns=tree)
    rng = np.random.default_rng(rows * 10 + cols + 7)
    tiles = [np.full((rows, cols), -128), rng.integers(-128, 128, (rows, cols))]
    extremes = np.array([[a] * rows for a in (-128, 127, -127, 0, 1, -1)])
    acts = [extremes, np.concatenate([extremes, rng.integers(-128, 128, (9, rows))])]
    results = run_array(cfg, tiles, acts, multiplier)
    expected = np.concatenate([block @ tile for block, tile in zip(acts, tiles)])
    assert np.array_equal(np.array([r[0] for r in results]), expected)
    assert expected.max() == rows * 16384 and expected.min() == -rows * 16256


def test_one_bit_narrower_partial_sums_wrap(monkeypatch):
    # The worst case above catches a psum_width too narrow for rows.
    from tpugen.hdl import array

    rows = 4
    monkeypatch.setattr(array, "psum_width", lambda config: psum_width(config) - 1)
    tile, acts = np.full((rows, 1), -128), np.full((1, rows), -256)
    [(data, _)] = run_array(CoreConfig(rows=rows, cols=1), [tile], [acts])
    assert data != [rows * 32768]
