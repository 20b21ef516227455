"""`BoardSystem`: what goes on an FPGA board: the core, its memory on chip, and the UART bridge
that gives the host the memory and the control registers."""
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import axi_read_signature, axi_write_signature, connect_by_name
from .axi_memory import AxiMemory
from .axi_slice import AxiRegisterSlice
from .core import TpuCore
from .uart_bridge import UartBridge

__all__ = ["BoardSystem", "SIMULATED_BOARD", "simulated_board_system"]

SIMULATED_BOARD = {"clk_freq": 4_000_000, "baud": 1_000_000, "memory_bytes": 64 << 10,
                   "register_slice": True}
"""The board simulated in the tests: 4 clocks per UART bit, so that frames are quick to simulate;
the register slice of the ECP5 boards."""


class BoardSystem(wiring.Component):
    """`TpuCore` with ``memory_bytes`` of on-chip memory (``memory_kind`` "bram" or "spram") as
    its external memory, and a `UartBridge` at ``baud`` for the host (``clk_freq`` in Hz).

    ``register_slice``: an `AxiRegisterSlice` between the core and the memory, so that no path
    runs from the one through the other (on the 85F they sit far apart: the routed 8x8's critical
    path ran from the core's fetch through ARVALID into the memory's burst slot, 17.9 ns).

    ``leds``: heartbeat (0.5 to 1 Hz), interrupt, UART receive and transmit activity.
    """

    uart_rx: In(1, init=1)
    uart_tx: Out(1, init=1)
    leds: Out(4)

    def __init__(self, config, *, clk_freq, baud, memory_bytes, memory_kind="bram",
                 register_slice=False):
        if isinstance(memory_bytes, int) and memory_bytes > 1 << config.address_width:
            raise ValueError(f"CoreConfig.address_width={config.address_width} is invalid for "
                             f"memory_bytes={memory_bytes}: the core would not reach all of it "
                             f"(allowed {(memory_bytes - 1).bit_length()}..32)")
        self.config = config
        self.clk_freq = round(clk_freq)
        self.core = TpuCore(config)
        # Block RAM with a port for reads and one for writes (no turns, a registered write);
        # SPRAM has one.
        self.memory = AxiMemory(config.axi_data_width, memory_bytes, kind=memory_kind,
                                dual_port=memory_kind == "bram")
        self.bridge = UartBridge(self.clk_freq, baud, memory_bytes,
                                 read_latency=self.memory.host_read_latency)
        self.slice = AxiRegisterSlice(config.axi_data_width) if register_slice else None
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.memory = memory = self.memory
        m.submodules.bridge = bridge = self.bridge
        width = self.config.axi_data_width
        links = [(core, memory)]
        if self.slice is not None:
            m.submodules.slice = self.slice
            links = [(core, self.slice), (self.slice, memory)]
        for master, slave in links:
            for signature in (axi_read_signature(width), axi_write_signature(width)):
                connect_by_name(m, master, "m_axi_", slave, "s_axi_", signature)
        connect_by_name(m, bridge.csr, "", core, "s_axil_", bridge.csr.signature)
        wiring.connect(m, bridge.mem, memory.host)
        m.d.comb += [bridge.rx.eq(self.uart_rx), self.uart_tx.eq(bridge.tx)]

        # The heartbeat: the top bit of a free-running counter, a period of 2**n cycles, the
        # clock's frequency rounded up to a power of two (no reload, no compare).
        heartbeat = Signal(max(1, (self.clk_freq - 1).bit_length()))
        m.d.sync += heartbeat.eq(heartbeat + 1)
        m.d.comb += self.leds.eq(Cat(heartbeat[-1], core.irq, ~self.uart_rx, ~self.uart_tx))
        return m


def simulated_board_system(config):
    """The `BoardSystem` of the simulated board (`SIMULATED_BOARD`) for ``config``."""
    return BoardSystem(config, **SIMULATED_BOARD)
