"""`SimSystem`: the core with its memory inside the simulation model, for fast simulation."""
from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..registers import ADDR_WIDTH
from .axi import (axi_lite_signature, axi_read_signature, axi_write_signature, connect_by_name,
                  flat_ports)
from .axi_memory import AxiMemory
from .core import TpuCore

__all__ = ["AxiReadDelay", "SimSystem"]

_AR = ("arid", "araddr", "arlen", "arsize", "arburst", "arvalid")
_R = ("rvalid", "rid", "rdata", "rresp", "rlast")


class AxiReadDelay(wiring.Component):
    """``latency`` (>= 1) cycles more on the R channel from an AXI4 slave on ``m_axi_*`` to the
    master on ``s_axi_*``; AR passes straight through.

    R beats go through a ``latency``-stage pipeline that stops while its last beat waits for
    RREADY: every beat is delayed exactly ``latency`` cycles, and one a cycle gets through.
    """

    def __init__(self, data_width, latency):
        if not isinstance(latency, int) or latency < 1:
            raise ValueError(f"latency={latency!r} is invalid: allowed an integer >= 1")
        self.latency = latency
        super().__init__({
            **flat_ports("s_axi", axi_read_signature(data_width).flip()),
            **flat_ports("m_axi", axi_read_signature(data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        for name in _AR:
            m.d.comb += getattr(self, f"m_axi_{name}").eq(getattr(self, f"s_axi_{name}"))
        m.d.comb += self.s_axi_arready.eq(self.m_axi_arready)

        beat = data.StructLayout({name: len(getattr(self, f"s_axi_{name}")) for name in _R})
        stages = [Signal(beat, name=f"stage{i}") for i in range(self.latency)]
        advance = ~(stages[-1].rvalid & ~self.s_axi_rready)
        m.d.comb += self.m_axi_rready.eq(advance)
        with m.If(advance):
            m.d.sync += [getattr(stages[0], name).eq(getattr(self, f"m_axi_{name}"))
                         for name in _R]
            m.d.sync += [stage.eq(previous) for previous, stage in zip(stages, stages[1:])]
        m.d.comb += [getattr(self, f"s_axi_{name}").eq(getattr(stages[-1], name)) for name in _R]
        return m


class SimSystem(wiring.Component):
    """`TpuCore` with ``memory_kib`` KiB of dual-port `AxiMemory` at address 0, whose reads
    take ``read_latency`` cycles more (`AxiReadDelay`). Ports: ``clk``, ``rst``, the core's
    ``s_axil_*`` and ``irq``.

    ``rst`` acts a cycle late, through a register, so that no logic depends combinationally on
    ``rst``: Verilator evaluates such logic again whenever an input changes, at each clock edge.
    Testbenches reach the memory's words through VPI (``memory.storage``, see
    `sim.verilator.PUBLIC_VARIABLES`).
    """

    def __init__(self, config, *, memory_kib=1024, read_latency=0):
        if not isinstance(read_latency, int) or read_latency < 0:
            raise ValueError(f"read_latency={read_latency!r} is invalid: allowed an integer >= 0")
        self.config = config
        self.read_latency = read_latency
        self.core = TpuCore(config)
        self.memory = AxiMemory(config.axi_data_width, memory_kib << 10, dual_port=True)
        super().__init__({"clk": In(1), "rst": In(1),
                          **flat_ports("s_axil", axi_lite_signature(ADDR_WIDTH).flip()), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        m.domains.unreset = ClockDomain(reset_less=True)
        rst_registered = Signal()
        m.d.unreset += rst_registered.eq(self.rst)
        m.d.comb += [ClockSignal("sync").eq(self.clk), ClockSignal("unreset").eq(self.clk),
                     ResetSignal("sync").eq(rst_registered)]

        m.submodules.core = core = self.core
        m.submodules.memory = memory = self.memory
        width = self.config.axi_data_width
        reads = axi_read_signature(width)
        if self.read_latency:
            m.submodules.read_delay = delay = AxiReadDelay(width, self.read_latency)
            connect_by_name(m, core, "m_axi_", delay, "s_axi_", reads)
            connect_by_name(m, delay, "m_axi_", memory, "s_axi_", reads)
        else:
            connect_by_name(m, core, "m_axi_", memory, "s_axi_", reads)
        connect_by_name(m, core, "m_axi_", memory, "s_axi_", axi_write_signature(width))
        connect_by_name(m, self, "s_axil_", core, "s_axil_", axi_lite_signature(ADDR_WIDTH))
        m.d.comb += self.irq.eq(core.irq)
        return m
