"""`tpu_core`: the array with its memories, DMA engines, controller and control registers."""
from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import Out

from .axi import axi_lite_signature, axi_read_signature, axi_write_signature, flat_ports
from .controller import ENGINES, FETCH_ID, Controller
from .csr import ADDR_WIDTH, ControlRegisters
from .execute import ExecuteEngine, accumulator_row, probability_row, scratchpad_row
from .load import LoadEngine
from .store import StoreEngine

__all__ = ["TpuCore"]


def _connect_flat(m, prefix, top, inner):
    """Connect a top-level ``<prefix>_<name>`` port group to an inner interface ``inner``."""
    for name, member in inner.signature.members.items():
        port = getattr(top, f"{prefix}_{name}")
        if member.flow == Out:
            m.d.comb += port.eq(getattr(inner, name))
        else:
            m.d.comb += getattr(inner, name).eq(port)


class TpuCore(wiring.Component):
    """The whole core. Ports: ``clk``, ``rst``, AXI4 master ``m_axi_*``, AXI4-Lite slave
    ``s_axil_*`` and ``irq``, named so cocotbext-axi's ``from_prefix`` binds to them."""

    def __init__(self, config):
        self.config = config
        width = config.axi_data_width
        super().__init__({
            **flat_ports("m_axi", axi_read_signature(width)),
            **flat_ports("m_axi", axi_write_signature(width)),
            **flat_ports("s_axil", axi_lite_signature(ADDR_WIDTH)),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        m.submodules.csr = csr = ControlRegisters(cfg)
        _connect_flat(m, "s_axil", self, csr.bus)
        m.d.comb += self.irq.eq(csr.irq)

        # Everything but the control registers goes back to its reset state on a soft reset.
        datapath = Module()
        m.submodules.datapath = ResetInserter(csr.soft_reset)(datapath)
        controller = Controller(cfg)
        load, execute, store = LoadEngine(cfg), ExecuteEngine(cfg), StoreEngine(cfg)
        datapath.submodules.controller = controller
        datapath.submodules.load = load
        datapath.submodules.execute = execute
        datapath.submodules.store = store
        engines = dict(zip(ENGINES, (load, execute, store)))

        datapath.submodules.scratchpad = scratchpad = memory.Memory(
            shape=scratchpad_row(cfg), depth=cfg.scratchpad_rows, init=[])
        datapath.submodules.accumulator = accumulator = memory.Memory(
            shape=accumulator_row(cfg), depth=cfg.accumulator_rows, init=[])
        wiring.connect(datapath, load.sp_write, scratchpad.write_port())
        wiring.connect(datapath, execute.weight_read, scratchpad.read_port())
        wiring.connect(datapath, execute.act_read, scratchpad.read_port())
        acc_write = accumulator.write_port()
        wiring.connect(datapath, execute.acc_write, acc_write)
        wiring.connect(datapath, execute.acc_read, accumulator.read_port(transparent_for=(acc_write,)))
        wiring.connect(datapath, store.acc_read, accumulator.read_port())
        datapath.submodules.probabilities = probabilities = memory.Memory(
            shape=probability_row(cfg), depth=cfg.probability_rows, init=[])
        wiring.connect(datapath, execute.prob_write, probabilities.write_port())
        wiring.connect(datapath, execute.prob_read, probabilities.read_port())

        m.d.comb += [
            controller.start.eq(csr.start),
            controller.program_base.eq(csr.program_base),
            controller.program_length.eq(csr.program_length),
            controller.windows.eq(csr.windows),
            controller.watchdog_limit.eq(csr.watchdog_limit),
            load.windows.eq(csr.windows),
            store.windows.eq(csr.windows),
            csr.busy.eq(controller.busy),
            csr.done_event.eq(controller.done_event),
            csr.error_event.eq(controller.error_event),
            csr.error_code.eq(controller.error_code),
            csr.error_index.eq(controller.error_index),
        ]
        for name, engine in engines.items():
            port = getattr(controller, name)
            m.d.comb += [
                engine.instr.payload.eq(port.instr.payload),
                engine.instr.valid.eq(port.instr.valid),
                port.instr.ready.eq(engine.instr.ready),
                port.done.eq(engine.done),
                port.busy.eq(engine.busy),
                port.error.eq(engine.error),
                port.progress.eq(engine.progress),
            ]

        self._read_arbiter(datapath, controller.axi, load.axi)
        _connect_flat(m, "m_axi", self, store.axi)
        self._counters(datapath, csr, controller, engines)
        return m

    def _read_arbiter(self, m, fetch, load):
        """Share AR between instruction fetch and the load engine; route R by ID.

        A grant holds while its ARVALID waits, so the address never changes under ARVALID."""
        grant_load = Signal()
        held = Signal()
        choose_load = Signal()
        m.d.comb += choose_load.eq(Mux(held, grant_load, load.arvalid))
        for name, member in axi_read_signature(self.config.axi_data_width).members.items():
            port = getattr(self, f"m_axi_{name}")
            if name.startswith("ar") and member.flow == Out:
                m.d.comb += port.eq(Mux(choose_load, getattr(load, name), getattr(fetch, name)))
            elif name == "arready":
                m.d.comb += [load.arready.eq(port & choose_load),
                             fetch.arready.eq(port & ~choose_load)]
            elif name == "rvalid":
                m.d.comb += [load.rvalid.eq(port & (self.m_axi_rid != FETCH_ID)),
                             fetch.rvalid.eq(port & (self.m_axi_rid == FETCH_ID))]
            elif name == "rready":
                # Gated by RVALID: RID may be undefined (X in a 4-state simulator) between beats.
                m.d.comb += port.eq(self.m_axi_rvalid &
                                    Mux(self.m_axi_rid == FETCH_ID, fetch.rready, load.rready))
            else:  # rid, rdata, rresp, rlast go to both
                m.d.comb += [getattr(load, name).eq(port), getattr(fetch, name).eq(port)]
        m.d.sync += [held.eq(self.m_axi_arvalid & ~self.m_axi_arready),
                     grant_load.eq(choose_load)]

    def _counters(self, m, csr, controller, engines):
        cfg = self.config
        beat_bytes = cfg.axi_data_width // 8
        events = {
            "cycles": (controller.busy, 1),
            "macs": (engines["execute"].vector, cfg.macs),
            "bytes_read": (self.m_axi_rvalid & self.m_axi_rready, beat_bytes),
            "bytes_written": (self.m_axi_wvalid & self.m_axi_wready,
                              sum(self.m_axi_wstrb[i] for i in range(beat_bytes))),
        }
        for name, engine in engines.items():
            events[f"{name}_busy_cycles"] = (engine.busy, 1)
            events[f"{name}_stall_cycles"] = (getattr(controller, name).stall, 1)
        for name, (event, amount) in events.items():
            counter = Signal(64, name=f"counter_{name}")
            with m.If(controller.start):
                m.d.sync += counter.eq(0)
            with m.Elif(event):
                m.d.sync += counter.eq(counter + amount)
            m.d.comb += getattr(csr, name).eq(counter)
