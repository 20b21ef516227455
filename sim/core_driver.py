"""Drives a `tpu_core` under cocotb: AxiRam memory, AXI4-Lite register access, programs."""
import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from ..arch import write_bursts
from ..isa import INSTRUCTION_BYTES
from ..registers import register, window_writes
from ..run_protocol import drive_async, finish_program, prepare_program, run_program, start
from .axi_bursts import random_pauses

__all__ = ["CoreDriver"]


class CoreDriver:
    """The host's view of one core: memory, registers, and running programs.

    ``backpressure`` pauses every AXI channel of the memory at random (fixed seed); ``checker``,
    a class taking ``dut`` and the core's window ``count`` (`AxiChecker`, which the testbenches
    pass), checks the AXI4 master on every cycle at some cost in simulation speed, None checks
    nothing;
    ``ram_class``: the memory model (AxiRam's constructor; `HostileAxiRam` has its own pauses).
    """

    period_ns = 10
    """Clock period."""

    def __init__(self, dut, config, *, memory_size=1 << 20, backpressure=False, seed=0,
                 checker=None, ram_class=AxiRam):
        self.dut = dut
        self.config = config
        self.ram = ram_class(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=memory_size)
        self.lite = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
        self.windows = []
        self.checker = (checker(dut, count=config.windows, max_writes=write_bursts(config))
                        if checker else None)
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

    async def write_register(self, offset, value):
        await self.lite.write_dword(offset, value)

    async def read_registers(self, offset, count):
        return [await self.lite.read_dword(offset + 4 * i) for i in range(count)]

    async def set_windows(self, windows):
        """``windows``: up to NUM_WINDOWS (base, size, readable, writable); the rest disabled
        (a core with fewer ignores the others). The checker takes them as the program's at the
        next `launch`."""
        writes = window_writes(windows)
        self.windows[:] = windows
        for name, value in writes:
            await self.write(name, value)

    async def start(self, program, base):
        """Write ``program`` (instruction bytes) at ``base`` and start it (IRQ_ENABLE as it is)."""
        self.ram.write(base, program)
        await self.prepare(base, len(program) // INSTRUCTION_BYTES)
        await self.launch()

    async def prepare(self, program_base, program_length, *, interrupt=None):
        """`run_protocol.prepare_program`: the program registers, IRQ_ENABLE (None: as it is),
        stale interrupt causes cleared."""
        await drive_async(self, prepare_program(program_base, program_length,
                                                interrupt=interrupt))

    async def launch(self):
        """Start the prepared program; the checker latches the windows set by `set_windows`,
        as the core does."""
        if self.checker is not None:
            self.checker.latch(self.windows)
        await drive_async(self, start())

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
        """Run ``program`` (instruction bytes) at ``base`` with the interrupt enabled
        (`run_protocol.run_program`); its `RunOutcome`. The bytes go to ``base`` modulo the
        memory's size (a PROGRAM_BASE with bits above a narrow core's addresses)."""
        self.ram.write(base % self.ram.size, program)
        if self.checker is not None:
            self.checker.latch(self.windows)
        return self._finished(await drive_async(self, run_program(
            None, base, len(program) // INSTRUCTION_BYTES, timeout_cycles)), timeout_cycles)

    async def outcome(self, timeout_cycles):
        """Wait for the interrupt of the program started (IRQ_ENABLE set), acknowledge it and
        return the `RunOutcome`."""
        return self._finished(await drive_async(self, finish_program(timeout_cycles)),
                              timeout_cycles)

    @staticmethod
    def _finished(outcome, timeout_cycles):
        if not outcome.finished:
            raise AssertionError(f"no interrupt within {timeout_cycles} cycles")
        return outcome

    async def soft_reset(self):
        await self.write("CONTROL", register("CONTROL").value(soft_reset=1))
