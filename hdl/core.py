"""`tpu_core`: the array with its memories, DMA engines, controller and control registers."""
from amaranth.hdl import (ClockDomain, ClockSignal, DomainRenamer, Instance, Module, Mux,
                          ResetSignal, Signal)
from amaranth.lib import memory, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

from ..arch import MAX_OUTSTANDING
from ..isa import RowScale
from ..registers import ADDR_WIDTH, counter_names
from .axi import (axi_lite_signature, axi_read_signature, axi_write_signature, connect_by_name,
                  flat_ports)
from .counters import CounterMemory
from .controller import ENGINES, FETCH_ID, Controller
from .csr import ControlRegisters
from .execute import ExecuteEngine, accumulator_row, probability_row, scratchpad_row
from .family import fpga_family
from .dma_front import SharedDmaFront
from .load import LoadEngine, load_front_client
from .store import W_BURST_BEATS, StoreEngine, store_front_client

__all__ = ["TpuCore", "run_wiring"]

SRAM_ATTRS = {"no_rw_check": 1}
"""Attributes of the core's SRAMs. ``no_rw_check``: a read port that is not transparent returns an
undefined value when it reads the row written in the same cycle (yosys maps the port straight
to block RAM instead of emulating the old value with a delayed write and bypass registers; board
builds, which give yosys RTLIL, mark the ports so: `fpga.synth.rtlil_with_no_rw_check`). The
engines never do that: a row is read only after the token of the engine that wrote it, and
written only after the token of the engine that read it (`tests/test_sram_pysim.py`), the
probability buffer is not read while a SOFTMAX runs, and the execute engine reads a row it
accumulates into a cycle after writing it at the earliest (`ExecuteEngine`: no bypass of a row
beside the block RAM)."""


GLOBAL_DCC_BELS = {"LFE5U-85F": "X3/Y46/LDCC0"}
"""Where `registered_global` places its DCCA, by ECP5 device (the 85F's left DCC 0)."""


def registered_global(m, platform, value, name):
    """``value`` a cycle later, from a flip-flop that is 1 at power-up; on an ECP5 on a global
    network: the flip-flop drives a DCCA (nextpnr-ecp5 promotes only clocks by itself), placed
    at `GLOBAL_DCC_BELS` where it knows the device. Unplaced and driven by a LUT, the DCCA went
    to the top edge's TDCC0, and router2 failed to reach its input in 3 of 4 placements of the
    ULX3S 8x8 (stop 42); a placed flip-flop beside a DCC made nextpnr's annealer crash."""
    registered = Signal(name=f"{name}_q", init=1, reset_less=True)
    m.d.sync += registered.eq(value)
    if fpga_family(platform) != "ecp5":
        return registered
    bel = GLOBAL_DCC_BELS.get(getattr(platform, "device", None))
    buffered = Signal(name=name)
    m.submodules[f"{name}_dcca"] = Instance("DCCA", **({"a_BEL": bel} if bel else {}),
                                            i_CLKI=registered, i_CE=1, o_CLKO=buffered)
    return buffered


def run_wiring(csr, controller, *, start, busy, events=1):
    """The statements from the control registers to the controller (``start`` and the program's
    configuration) and back (``busy`` as STATUS.busy, the done and error events, which only
    count while ``events``)."""
    return [
        controller.start.eq(start),
        controller.program_base.eq(csr.program_base),
        controller.program_length.eq(csr.program_length),
        controller.windows.eq(csr.windows),
        controller.watchdog_limit.eq(csr.watchdog_limit),
        csr.busy.eq(busy),
        csr.done_event.eq(controller.done_event & events),
        csr.error_event.eq(controller.error_event & events),
        csr.error_code.eq(controller.error_code),
        csr.error_index.eq(controller.error_index),
    ]


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
        # A soft reset resets the datapath from the next cycle (`registered_global`); from the
        # same one, `resetting` holds the bus until the bursts it left there are finished
        # (`_quiesce`) and drops the events of the datapath's last cycle; a start in that time
        # waits for it.
        resetting = Signal()
        start_waiting = Signal()
        start = Signal()
        m.d.comb += start.eq((csr.start | start_waiting) & ~resetting)
        m.d.sync += start_waiting.eq((csr.start | start_waiting) & resetting)
        connect_by_name(m, csr.bus, "", self, "s_axil_", csr.bus.signature)
        m.d.comb += self.irq.eq(csr.irq)

        # Everything but the control registers goes back to its reset state on a soft reset:
        # the "datapath" domain, on the core's clock, reset by either reset, registered. That
        # reset reaches most of the core's flip-flops (12,531 of the 8x8's, 7,956 of them in
        # the execute engine), so on an ECP5 it takes a global network instead of the fabric.
        m.domains.datapath = ClockDomain(local=True)
        m.d.comb += ClockSignal("datapath").eq(ClockSignal())
        reset = ResetSignal(allow_reset_less=True) | csr.soft_reset
        m.d.comb += ResetSignal("datapath").eq(
            registered_global(m, platform, reset, "datapath_reset"))
        datapath = Module()
        m.submodules.datapath = DomainRenamer("datapath")(datapath)
        controller = Controller(cfg)
        load, execute, store = LoadEngine(cfg), ExecuteEngine(cfg), StoreEngine(cfg)
        datapath.submodules.controller = controller
        datapath.submodules.load = load
        datapath.submodules.execute = execute
        datapath.submodules.store = store
        engines = dict(zip(ENGINES, (load, execute, store)))
        if cfg.shared_dma:
            datapath.submodules.dma_front = front = SharedDmaFront(
                load_front_client(cfg), store_front_client(cfg), cfg.axi_data_width // 8,
                cfg.windows, cfg.descriptor_dims, cfg.address_width)
            wiring.connect(datapath, front.load, load.front)
            wiring.connect(datapath, front.store, store.front)
            m.d.comb += front.windows.eq(csr.windows)

        datapath.submodules.scratchpad = scratchpad = memory.Memory(
            shape=scratchpad_row(cfg), depth=cfg.scratchpad_rows, init=[], attrs=SRAM_ATTRS)
        datapath.submodules.accumulator = accumulator = memory.Memory(
            shape=accumulator_row(cfg), depth=cfg.accumulator_rows, init=[], attrs=SRAM_ATTRS)
        wiring.connect(datapath, load.sp_write, scratchpad.write_port(granularity=1))
        wiring.connect(datapath, execute.weight_read, scratchpad.read_port())
        wiring.connect(datapath, execute.act_read, scratchpad.read_port())
        acc_write = accumulator.write_port()
        wiring.connect(datapath, execute.acc_write, acc_write)
        wiring.connect(datapath, execute.acc_read, accumulator.read_port())
        wiring.connect(datapath, store.acc_read, accumulator.read_port())
        if cfg.softmax:
            datapath.submodules.probabilities = probabilities = memory.Memory(
                shape=probability_row(cfg), depth=cfg.probability_rows, init=[], attrs=SRAM_ATTRS)
            wiring.connect(datapath, execute.prob_write, probabilities.write_port())
            wiring.connect(datapath, execute.prob_read, probabilities.read_port())
            datapath.submodules.scales = scales = memory.Memory(
                shape=RowScale, depth=cfg.probability_rows, init=[], attrs=SRAM_ATTRS)
            wiring.connect(datapath, execute.scale_write, scales.write_port())
            wiring.connect(datapath, store.scale_read, scales.read_port())

        m.d.comb += [
            *run_wiring(csr, controller, start=start,
                        busy=controller.busy | resetting | start_waiting, events=~resetting),
            load.windows.eq(csr.windows),
            store.windows.eq(csr.windows),
        ]
        for name, engine in engines.items():
            port = getattr(controller, name)
            m.d.comb += [
                engine.instr.payload.eq(port.instr.payload),
                engine.instr.valid.eq(port.instr.valid),
                port.instr.ready.eq(engine.instr.ready),
                port.done.eq(engine.done),
                port.busy.eq(engine.busy),
                port.holding.eq(engine.holding),
                port.error.eq(engine.error),
                port.progress.eq(engine.progress),
            ]

        width = cfg.axi_data_width
        bus = wiring.Signature({**flat_ports("m_axi", axi_read_signature(width)),
                                **flat_ports("m_axi", axi_write_signature(width))}).create()
        self._read_arbiter(datapath, bus, controller.axi, load.axi)
        connect_by_name(datapath, store.axi, "", bus, "m_axi_", store.axi.signature)
        self._quiesce(m, bus, csr.soft_reset, resetting)
        self._counters(datapath, csr, controller, engines)
        return m

    def _read_arbiter(self, m, bus, fetch, load):
        """Share AR of ``bus`` between instruction fetch and the load engine; route R by ID.

        A grant holds while its ARVALID waits, so the address never changes under ARVALID."""
        grant_load = Signal()
        held = Signal()
        choose_load = Signal()
        m.d.comb += choose_load.eq(Mux(held, grant_load, load.arvalid))
        for name, member in axi_read_signature(self.config.axi_data_width).members.items():
            port = getattr(bus, f"m_axi_{name}")
            if name.startswith("ar") and member.flow == Out:
                m.d.comb += port.eq(Mux(choose_load, getattr(load, name), getattr(fetch, name)))
            elif name == "arready":
                m.d.comb += [load.arready.eq(port & choose_load),
                             fetch.arready.eq(port & ~choose_load)]
            elif name == "rvalid":
                m.d.comb += [load.rvalid.eq(port & (bus.m_axi_rid != FETCH_ID)),
                             fetch.rvalid.eq(port & (bus.m_axi_rid == FETCH_ID))]
            elif name == "rready":
                # Gated by RVALID: RID may be undefined (X in a 4-state simulator) between beats.
                m.d.comb += port.eq(bus.m_axi_rvalid &
                                    Mux(bus.m_axi_rid == FETCH_ID, fetch.rready, load.rready))
            else:  # rid, rdata, rresp, rlast go to both
                m.d.comb += [getattr(load, name).eq(port), getattr(fetch, name).eq(port)]
        m.d.sync += [held.eq(bus.m_axi_arvalid & ~bus.m_axi_arready),
                     grant_load.eq(choose_load)]

    def _quiesce(self, m, bus, soft_reset, resetting):
        """Connect the datapath's AXI master ``bus`` to the ports. After ``soft_reset`` (the
        datapath is reset the cycle after, and cut off from the bus from then) and while
        ``resetting``, finish for it what it left on the bus: hold a request that was waiting,
        take the read beats and write responses still owed, and send the W beats still owed (of
        every burst whose AW was presented): a beat that was waiting for WREADY as it was, the
        rest with WSTRB 0 (they write nothing)."""
        def port(name):
            return getattr(self, f"m_axi_{name}")

        # The store engine's bursts are at most W_BURST_BEATS long: AWLEN's bits above are 0;
        # and the address bits above the core's (`CoreConfig.address_width`) are 0.
        aw_len_bits = ceil_log2(W_BURST_BEATS)
        narrow = {"awlen": aw_len_bits, "araddr": self.config.address_width,
                  "awaddr": self.config.address_width}
        held = {}  # a transfer waiting for READY at the soft reset: kept as it was (AXI4)
        for channel, fields in (("ar", ("id", "addr", "len", "size", "burst")),
                                ("aw", ("id", "addr", "len", "size", "burst")),
                                ("w", ("data", "strb"))):
            held[channel] = (Signal(name=f"held_{channel}valid"),
                             {f: Signal(narrow.get(channel + f, len(port(channel + f))),
                                        name=f"held_{channel}{f}")
                              for f in fields})
            valid, saved = held[channel]
            with m.If(soft_reset & port(f"{channel}valid") & ~port(f"{channel}ready")):
                m.d.sync += [valid.eq(1), *(saved[f].eq(port(channel + f)) for f in fields)]
            with m.Elif(port(f"{channel}ready")):
                m.d.sync += valid.eq(0)

        ar_done = port("arvalid") & port("arready")
        r_last = port("rvalid") & port("rready") & port("rlast")
        aw_done = port("awvalid") & port("awready")
        w_done = port("wvalid") & port("wready")
        b_done = port("bvalid") & port("bready")
        # Bursts in flight at the ports: the load engine's MAX_OUTSTANDING and a fetch (writes:
        # the store engine's); a soft reset adds none, as the datapath issues none until quiet.
        reads = Signal(range(MAX_OUTSTANDING + 2))  # accepted, last beat not yet taken
        writes = Signal(range(MAX_OUTSTANDING + 1))  # accepted, response not yet taken
        m.d.sync += [reads.eq(reads + ar_done - r_last), writes.eq(writes + aw_done - b_done)]
        # W beats may go before their AW is accepted, but not before it is presented: a burst
        # owes its W beats from the first cycle its AW is on the bus.
        aw_waiting = Signal()
        aw_presented = port("awvalid") & ~aw_waiting
        m.d.sync += aw_waiting.eq(port("awvalid") & ~port("awready"))
        # AWLEN of the bursts with W beats owed: each has its AW presented and no B yet, so the
        # store engine's MAX_OUTSTANDING at most (none are added while ``resetting``).
        m.submodules.w_owed = w_owed = SyncFIFO(width=aw_len_bits, depth=MAX_OUTSTANDING)
        w_beat = Signal(aw_len_bits)
        # A one-beat burst whose W beat goes in the cycle its AW appears owes nothing: with no
        # older burst queued, that beat is its own (a FIFO would ignore the pop when empty).
        finished_at_once = w_done & port("wlast") & ~w_owed.r_rdy
        m.d.comb += [w_owed.w_en.eq(aw_presented & ~finished_at_once),
                     w_owed.w_data.eq(port("awlen")),
                     w_owed.r_en.eq(w_done & port("wlast"))]
        with m.If(w_done):
            m.d.sync += w_beat.eq(Mux(port("wlast"), 0, w_beat + 1))

        quiet = ~held["ar"][0] & ~held["aw"][0] & (reads == 0) & (writes == 0) & ~w_owed.r_rdy
        with m.If(soft_reset):
            m.d.sync += resetting.eq(1)
        with m.Elif(quiet):
            m.d.sync += resetting.eq(0)

        w_held, w_saved = held["w"]
        scrub = {"rready": 1, "bready": 1, "wvalid": w_owed.r_rdy,
                 "wlast": w_beat == w_owed.r_data,
                 "wdata": Mux(w_held, w_saved["data"], 0), "wstrb": Mux(w_held, w_saved["strb"], 0)}
        for channel in ("ar", "aw"):
            valid, saved = held[channel]
            scrub[f"{channel}valid"] = valid
            scrub.update({channel + f: value for f, value in saved.items()})
        width = self.config.axi_data_width
        for signature in (axi_read_signature(width), axi_write_signature(width)):
            for name, member in signature.members.items():
                inner = getattr(bus, f"m_axi_{name}")
                if member.flow == Out:
                    m.d.comb += port(name).eq(Mux(resetting, scrub[name], inner))
                elif name in ("arready", "rvalid", "awready", "wready", "bvalid"):
                    m.d.comb += inner.eq(port(name) & ~resetting)
                else:
                    m.d.comb += inner.eq(port(name))

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
        if cfg.counters_in_ram:
            names = counter_names(cfg)
            largest = {"macs": cfg.macs, "bytes_read": beat_bytes, "bytes_written": beat_bytes}
            m.submodules.counters = counters = CounterMemory(
                [largest.get(name, 1) for name in names], cfg.counter_width)
            m.d.comb += [
                counters.clear.eq(controller.start),
                counters.read_index.eq(csr.counter_index),
                counters.read.eq(csr.counter_read),
                csr.counter_done.eq(counters.done),
                csr.counter_value.eq(counters.value),
                *(counters.amounts[k].eq(Mux(events[name][0], events[name][1], 0))
                  for k, name in enumerate(names)),
            ]
            return
        for name in counter_names(cfg):
            event, amount = events[name]
            counter = Signal(cfg.counter_width, name=f"counter_{name}")
            with m.If(controller.start):
                m.d.sync += counter.eq(0)
            with m.Elif(event):
                m.d.sync += counter.eq(counter + amount)
            m.d.comb += getattr(csr, name).eq(counter)
