"""amaranth.sim test of the counter memory (`CoreConfig.counters_in_ram`) against the counts."""
import random

import pytest
from amaranth.sim import Simulator

from tpugen.hdl.counters import CounterMemory


@pytest.mark.parametrize("increments,width,idle", [((1, 16, 4, 4, 1, 1, 1), 32, False),
                                                   ((1, 256, 16), 64, False),
                                                   ((1, 16, 4, 4, 1, 1, 1), 32, True)])
def test_a_read_is_the_count_since_the_last_clear(increments, width, idle):
    """Random amounts every cycle (or, ``idle``, in bursts with quiet stretches between),
    clears now and then, reads of random counters. A read gives the sum of the counter's
    amounts since the last clear as of a cycle between its request and its ``done`` (a
    visit's): the counts only grow between clears, so it lies between the sums at the two
    ends, and equals them when no amount came meanwhile. The sums pass 2**16: the words
    carry."""
    dut = CounterMemory(increments, width)
    rng = random.Random(len(increments) + idle)
    count = len(increments)
    seen = {"exact": 0, "carried": 0}

    async def testbench(ctx):
        sums, history = [0] * count, []
        request = None  # (counter, cycle)
        for cycle in range(14_000):
            quiet = idle and (cycle // 300) % 2
            amounts = [0 if quiet or rng.random() < 0.3 else rng.randint(0, most)
                       for most in increments]
            clear = cycle == 12_500 or 0 < cycle < 12_000 and rng.random() < 0.0001
            ctx.set(dut.amounts, amounts)
            ctx.set(dut.clear, clear)
            if request is None and rng.random() < 0.05:
                request = (rng.randrange(count), cycle)
            ctx.set(dut.read, request is not None)
            ctx.set(dut.read_index, request[0] if request else 0)
            if request is not None and ctx.get(dut.done):
                k, asked = request
                window = [history[t][k] for t in range(max(asked - 1, 0), cycle)]
                value = ctx.get(dut.value)
                assert cycle - asked <= 2 * dut.period + 2
                if window and min(window) == max(window):
                    assert value == window[0], (k, cycle)
                    seen["exact"] += 1
                else:
                    assert any(v == value for v in window), (k, cycle, value, window)
                seen["carried"] += value >= 1 << 16
                request = None
            sums = [0] * count if clear else [s + a for s, a in zip(sums, amounts)]
            history.append(sums)
            await ctx.tick()
        assert request is None or cycle - request[1] <= 2 * dut.period + 2

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert seen["exact"] > 10 if idle else seen["carried"] > 0


def test_words_must_divide_the_width_and_hold_a_rounds_amounts(refuses):
    refuses(lambda: CounterMemory((1,), 40), "width=40 is invalid")
    refuses(lambda: CounterMemory((1 << 14, 1), 32), "a round of them must fit")
