"""Drives a `SimSystem` under cocotb: the memory is inside the model, so no Python runs per
clock cycle while the core works."""
from cocotb.clock import Clock
from cocotb.handle import Immediate
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from .core_driver import CoreDriver

__all__ = ["SystemDriver", "VpiMemory"]


class VpiMemory:
    """`SimSystem`'s memory, a word at a time through VPI: no simulated time passes, and a read
    sees the writes before it (they are immediate, not scheduled)."""

    def __init__(self, dut, data_width):
        self._words = dut.memory.storage
        self._word_bytes = data_width // 8

    def write(self, address, data):
        """``data`` (bytes) at byte ``address``; the other bytes of partly written words are
        kept."""
        size, data = self._word_bytes, bytes(data)
        start = address - address % size
        end = -(-(address + len(data)) // size) * size
        words = bytearray(end - start)
        if address % size:
            words[:size] = self.read(start, size)
        if (address + len(data)) % size:
            words[-size:] = self.read(end - size, size)
        words[address - start:address - start + len(data)] = data
        for i in range(0, len(words), size):
            self._words[(start + i) // size].value = Immediate(
                int.from_bytes(words[i:i + size], "little"))

    def read(self, address, size):
        """``size`` bytes from byte ``address``."""
        word = self._word_bytes
        start = address - address % word
        data = b"".join(self._words[i].value.to_unsigned().to_bytes(word, "little")
                        for i in range(start // word, -(-(address + size) // word)))
        return data[address - start:address - start + size]


class SystemDriver(CoreDriver):
    """`CoreDriver` for a `SimSystem`: registers through AxiLiteMaster, memory through VPI
    (`VpiMemory`), the clock driven by the simulator (cocotb's GPI clock)."""

    def __init__(self, dut, config):
        self.dut = dut
        self.config = config
        self.ram = VpiMemory(dut, config.axi_data_width)
        self.lite = None
        self.windows = []
        self.checker = None

    async def reset(self):
        Clock(self.dut.clk, self.period_ns, unit="ns", impl="gpi").start()
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)
        self.lite = AxiLiteMaster(AxiLiteBus.from_prefix(self.dut, "s_axil"), self.dut.clk,
                                  self.dut.rst)
        for log in (self.lite.write_if.log, self.lite.read_if.log):
            log.setLevel("WARNING")
