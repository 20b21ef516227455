"""amaranth.sim test of the controller's watchdog: it stops the core exactly ``watchdog_limit``
cycles after the last cycle with progress, never earlier, whatever the pattern of progress."""
import random

import pytest
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.hdl.controller import ENGINES, FETCH_ID, Controller
from tpugen.isa import INSTRUCTION_BYTES, ErrorCode, Opcode, encode
from tpugen.sim.pysim_axi import AxiMemory
from tpugen.sim.testbench import ForFamily

SETTLE = 200
"""Cycles for the fetcher to fill the load queue and stall (its last progress)."""


def _schedule(rng, limit):
    """The load engine's progress in each cycle: pulses separated by up to ``limit - 1`` idle
    cycles (mostly the longest ones, where an off-by-one would fire), then ``limit + 4`` idle."""
    schedule = [1]
    for _ in range(12):
        gap = rng.choice([0, limit - 1, max(limit - 2, 0), rng.randrange(limit)])
        schedule += [0] * gap + [1]
    return schedule + [0] * (limit + 4)


@pytest.mark.parametrize("family", [None, "ice40"])  # counting up; counting down
@pytest.mark.parametrize("limit", [1, 2, 3, 17])
def test_watchdog_fires_exactly_limit_cycles_after_the_last_progress(limit, family):
    schedule = _schedule(random.Random(limit), limit)
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        softmax=False, im2col=False)
    dut = Controller(config)
    program = [encode(Opcode.LOAD)] * 8 + [encode(Opcode.END)]
    memory = AxiMemory(1 << 12, 32, allowed=[(0, 1 << 12)], seed=limit, ident=FETCH_ID)
    memory.mem[:len(program) * INSTRUCTION_BYTES] = b"".join(program)
    codes = []  # error_code at the start of each cycle after the first of `schedule`

    async def host(ctx):
        ctx.set(dut.windows[0], {"base": 0, "end": 1 << 12, "read": 1, "write": 0})
        for i in range(1, config.windows):
            ctx.set(dut.windows[i], {"base": 0, "end": 0, "read": 0, "write": 0})
        ctx.set(dut.program_length, len(program))
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        await ctx.tick().repeat(SETTLE)  # no engine takes anything: the watchdog is off
        assert ctx.get(dut.error_code) == ErrorCode.NONE
        ctx.set(dut.load.progress, 1)  # the idle count restarts before the watchdog is on
        await ctx.tick()
        ctx.set(dut.watchdog_limit, limit)
        for progress in schedule:
            ctx.set(dut.load.progress, progress)
            await ctx.tick()
            codes.append(ErrorCode(ctx.get(dut.error_code)))

    sim = Simulator(ForFamily(dut, family))
    sim.add_clock(1e-6)
    sim.add_testbench(memory.read_process(dut.axi), background=True)
    sim.add_testbench(host)
    sim.run()
    # Progress in cycle `last`, none in the `limit` cycles after it: the watchdog fires in the
    # last of those, and its code is visible from the next cycle on.
    last = max(cycle for cycle, progress in enumerate(schedule) if progress)
    fired = last + limit + 1
    assert codes[:fired] == [ErrorCode.NONE] * fired
    assert set(codes[fired:]) == {ErrorCode.WATCHDOG}
