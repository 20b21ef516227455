"""Drives a `tpu_core` under cocotb: AxiRam memory, AXI4-Lite register access, programs."""
import json
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from ..firmware.matmul import compile_matmul
from ..registers import COUNTERS, register, window_writes
from ..isa import INSTRUCTION_BYTES, ErrorCode
from .axi_checker import AxiChecker
from .golden import matmul_int32
from .hostile_ram import random_pauses

__all__ = ["CoreDriver", "RunResult", "exact_matmul"]


class RunResult:
    def __init__(self, status, error, error_index, counters):
        self.done = bool(register("STATUS").fields_of(status).done)
        self.error = ErrorCode(error)
        self.error_index = error_index
        self.counters = counters

    def __repr__(self):
        return f"RunResult(done={self.done}, error={self.error}, index={self.error_index})"


class CoreDriver:
    """The host's view of one core: memory, registers, and running programs.

    ``backpressure`` pauses every AXI channel of the memory at random (fixed seed); ``checker``
    checks the AXI4 master on every cycle (`AxiChecker`) at some cost in simulation speed;
    ``ram_class``: the memory model (AxiRam's constructor; `HostileAxiRam` has its own pauses).
    """

    period_ns = 10
    """Clock period."""

    def __init__(self, dut, config, *, memory_size=1 << 20, backpressure=False, seed=0,
                 checker=True, ram_class=AxiRam):
        self.dut = dut
        self.config = config
        self.ram = ram_class(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=memory_size)
        self.lite = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.windows = []
        self.checker = AxiChecker(dut) if checker else None
        for log in (self.ram.write_if.log, self.ram.read_if.log, self.lite.write_if.log,
                    self.lite.read_if.log):
            log.setLevel("WARNING")
        if backpressure:
            rng = random.Random(seed)
            for channel in (self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                            self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                            self.ram.read_if.r_channel):
                channel.set_pause_generator(random_pauses(rng, 0.3))

    async def reset(self):
        cocotb.start_soon(Clock(self.dut.clk, self.period_ns, unit="ns").start())
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def write(self, name, value):
        """Write register ``name``; returns the response (an AxiResp: OKAY, or SLVERR for a
        refused write)."""
        return (await self.lite.write(register(name).offset, value.to_bytes(4, "little"))).resp

    async def read(self, name):
        return await self.lite.read_dword(register(name).offset)

    async def set_windows(self, windows):
        """``windows``: up to NUM_WINDOWS (base, size, readable, writable); the rest disabled.
        The checker takes them as the program's at the next `launch`."""
        writes = window_writes(windows)
        self.windows[:] = windows
        for name, value in writes:
            await self.write(name, value)

    async def counters(self):
        values = {}
        for name in COUNTERS:
            low = await self.read(f"{name.upper()}_LO")
            values[name] = low | (await self.read(f"{name.upper()}_HI")) << 32
        return values

    async def start(self, program, base):
        """Write ``program`` (instruction bytes) at ``base`` and start it."""
        self.ram.write(base, program)
        await self.write("PROGRAM_BASE", base)
        await self.write("PROGRAM_LENGTH", len(program) // INSTRUCTION_BYTES)
        await self.launch()

    async def launch(self):
        """Start the program the registers describe; the checker latches the windows set by
        `set_windows`, as the core does."""
        if self.checker is not None:
            self.checker.latch(self.windows)
        await self.write("CONTROL", register("CONTROL").value(start=1))

    def write_stats(self, stats):
        """Write ``stats`` to stats.json for the test, with the checker's (``axi``)."""
        if self.checker is not None:
            stats = {**stats, "axi": self.checker.stats()}
        with open("stats.json", "w") as f:
            json.dump(stats, f)

    async def wait_interrupt(self, timeout_cycles):
        """True once ``irq`` is high; False if it stays low for ``timeout_cycles``."""
        if not self.dut.irq.value:
            try:
                await with_timeout(RisingEdge(self.dut.irq), timeout_cycles * self.period_ns, "ns")
            except SimTimeoutError:
                return False
        return True

    async def run(self, program, base, *, timeout_cycles=1_000_000):
        """Start ``program`` (instruction bytes) at ``base`` with the interrupt enabled, wait for
        the interrupt, return the outcome."""
        await self.write("IRQ_ENABLE", 1)
        await self.start(program, base)
        return await self.outcome(timeout_cycles)

    async def outcome(self, timeout_cycles):
        """Wait for the interrupt of the program started (IRQ_ENABLE set), acknowledge it and
        return the outcome."""
        if not await self.wait_interrupt(timeout_cycles):
            raise AssertionError(f"no interrupt within {timeout_cycles} cycles")
        status = await self.read("STATUS")
        result = RunResult(status, await self.read("ERROR_CODE"), await self.read("ERROR_INDEX"),
                           await self.counters())
        await self.write("IRQ_STATUS", register("IRQ_STATUS").mask)
        return result

    async def soft_reset(self):
        await self.write("CONTROL", register("CONTROL").value(soft_reset=1))


async def exact_matmul(core, rng, windows, *, program, a_addr, b_addr, c_addr):
    """(outcome, exact): a random 6x5x3 matmul run by ``core`` in ``windows``, as a check that
    the core works (reads and writes memory) after whatever ran before."""
    await core.set_windows(windows)
    m, k, n = 6, 5, 3
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    core.ram.write(a_addr, a.tobytes())
    core.ram.write(b_addr, b.tobytes())
    code = compile_matmul(core.config, m, k, n, a_addr=a_addr, b_addr=b_addr, c_addr=c_addr)
    result = await core.run(code.to_bytes(), program, timeout_cycles=100_000)
    got = np.frombuffer(core.ram.read(c_addr, 4 * m * n), dtype="<i4").reshape(m, n)
    return result, np.array_equal(got, matmul_int32(a, b))
