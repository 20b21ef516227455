"""`tpu_core`: the array with its memories, DMA engines, controller and control registers."""
from amaranth.hdl import (Cat, ClockDomain, ClockSignal, DomainRenamer, Instance, Module, Mux,
                          ResetSignal, Signal)
from amaranth.lib import memory, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

from ..arch import MAX_OUTSTANDING, write_bursts
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
from .pipeline import SRAM_ATTRS
from .store import W_BURST_BEATS, StoreEngine, store_front_client

__all__ = ["TpuCore", "run_wiring"]

# The core's SRAMs have `SRAM_ATTRS`: the engines never read a row as it is written. A row is
# read only after the token of the engine that wrote it, and written only after the token of
# the engine that read it (`tests/test_sram_pysim.py`), the probability buffer is not read while
# a SOFTMAX runs, and the execute engine reads a row it accumulates into a cycle after writing
# it at the earliest (`ExecuteEngine`: no bypass of a row beside the block RAM).


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
            **flat_ports("s_axil", axi_lite_signature(ADDR_WIDTH).flip()),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        m.submodules.csr = csr = ControlRegisters(cfg)
        # A soft reset resets the datapath once the transfers it left waiting at the ports are
        # accepted (`_quiesce`'s ``release``, registered: `registered_global`); from the cycle
        # after the soft reset, `resetting` holds the bus until the bursts the datapath left
        # there are finished and drops the datapath's events; a start in that time waits.
        resetting = Signal()
        release = Signal()
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
        reset = ResetSignal(allow_reset_less=True) | release
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
            if "shift" in engine.signature.members:
                m.d.comb += port.shift.eq(engine.shift)

        width = cfg.axi_data_width
        bus = wiring.Signature({**flat_ports("m_axi", axi_read_signature(width)),
                                **flat_ports("m_axi", axi_write_signature(width))}).create()
        self._read_arbiter(datapath, bus, controller.axi, load.axi)
        connect_by_name(datapath, store.axi, "", bus, "m_axi_", store.axi.signature)
        self._quiesce(m, bus, csr.soft_reset, resetting, release)
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

    def _quiesce(self, m, bus, soft_reset, resetting, release):
        """Connect the datapath's AXI master ``bus`` to the ports, and after ``soft_reset`` (and
        while ``resetting``) leave the bus as AXI4 wants it. First it drains: an AR or AW the
        datapath left waiting for READY stays its own (not reset yet, it holds the request as
        it was) until accepted, and its W beats of bursts whose AW was presented, its R beats
        and B responses go on; no new request goes out. In the first cycle with no request and
        no W beat waiting, ``release`` (the datapath is reset the cycle after), and the
        quiescer finishes what the datapath left: it takes the read beats and write responses
        still owed and sends the W beats still owed (of every burst whose AW was presented) with
        WSTRB 0 (they write nothing). No payload is copied."""
        def port(name):
            return getattr(self, f"m_axi_{name}")

        def inner(name):
            return getattr(bus, f"m_axi_{name}")

        # The store engine's bursts are at most W_BURST_BEATS long: AWLEN's bits above are 0.
        aw_len_bits = ceil_log2(W_BURST_BEATS)
        waiting = {channel: port(f"{channel}valid") & ~port(f"{channel}ready")
                   for channel in ("ar", "aw", "w")}
        draining = Signal()  # the datapath not reset yet: its waiting transfers finish
        scrubbing = Signal()  # the datapath reset: the quiescer finishes its bursts
        held = {channel: Signal(name=f"held_{channel}valid") for channel in ("ar", "aw")}
        # A soft reset while resetting changes nothing here: the datapath is reset at the
        # release, or was and is idle (no START until the quiescer lets go).
        resets = soft_reset & ~resetting
        # Waiting for READY after this cycle: a request left waiting, or a W beat.
        still = [*(Mux(resets, waiting[channel], held[channel] & ~port(f"{channel}ready"))
                   for channel in held), waiting["w"]]
        m.d.comb += [resetting.eq(draining | scrubbing),
                     release.eq((resets | draining) & ~Cat(still).any())]
        for channel, signal in held.items():
            with m.If(resets):
                m.d.sync += signal.eq(waiting[channel])
            with m.Elif(port(f"{channel}ready")):
                m.d.sync += signal.eq(0)
        with m.If(release):
            m.d.sync += draining.eq(0)
        with m.Elif(resets):
            m.d.sync += draining.eq(1)

        ar_done = port("arvalid") & port("arready")
        r_last = port("rvalid") & port("rready") & port("rlast")
        aw_done = port("awvalid") & port("awready")
        w_done = port("wvalid") & port("wready")
        b_done = port("bvalid") & port("bready")
        # Bursts in flight at the ports: the load engine's MAX_OUTSTANDING and a fetch (writes:
        # the store engine's `write_bursts`); none are added once the datapath is released.
        bursts = write_bursts(self.config)
        reads = Signal(range(MAX_OUTSTANDING + 2))  # accepted, last beat not yet taken
        writes = Signal(range(bursts + 1))  # accepted, response not yet taken
        m.d.sync += [reads.eq(reads + ar_done - r_last), writes.eq(writes + aw_done - b_done)]
        # W beats may go before their AW is accepted, but not before it is presented: a burst
        # owes its W beats from the first cycle its AW is on the bus.
        aw_waiting = Signal()
        aw_presented = port("awvalid") & ~aw_waiting
        m.d.sync += aw_waiting.eq(waiting["aw"])
        # AWLEN of the bursts with W beats owed: each has its AW presented and no B yet, so the
        # store engine's `write_bursts` at most.
        m.submodules.w_owed = w_owed = SyncFIFO(width=aw_len_bits, depth=bursts)
        w_beat = Signal(aw_len_bits)
        # A one-beat burst whose W beat goes in the cycle its AW appears owes nothing: with no
        # older burst queued, that beat is its own (a FIFO would ignore the pop when empty).
        finished_at_once = w_done & port("wlast") & ~w_owed.r_rdy
        m.d.comb += [w_owed.w_en.eq(aw_presented & ~finished_at_once),
                     w_owed.w_data.eq(port("awlen")),
                     w_owed.r_en.eq(w_done & port("wlast"))]
        with m.If(w_done):
            m.d.sync += w_beat.eq(Mux(port("wlast"), 0, w_beat + 1))

        quiet = (reads == 0) & (writes == 0) & ~w_owed.r_rdy
        with m.If(release):
            m.d.sync += scrubbing.eq(1)
        with m.Elif(quiet):
            m.d.sync += scrubbing.eq(0)

        # What passes: the datapath's transfers while not resetting; while draining the
        # requests it left waiting (until accepted), its R beats and B responses, and its W
        # beats while a burst whose AW was presented owes them (its next beat is that burst's:
        # its W beats go in order, and its later AWs were not presented). Once scrubbing the
        # quiescer takes R and B and sends the W beats owed.
        passes = {"ar": ~resetting | held["ar"], "aw": ~resetting | held["aw"],
                  "w": ~resetting | (draining & w_owed.r_rdy)}
        scrub = {"rready": 1, "bready": 1, "wvalid": w_owed.r_rdy,
                 "wlast": w_beat == w_owed.r_data, "wdata": 0, "wstrb": 0}
        width = self.config.axi_data_width
        for signature in (axi_read_signature(width), axi_write_signature(width)):
            for name, member in signature.members.items():
                channel = next((c for c in passes if name.startswith(c)), None)
                if member.flow == Out:
                    value = inner(name)
                    if name.endswith("valid"):
                        value = value & passes[channel]
                    if name in scrub:
                        value = Mux(scrubbing, scrub[name], value)
                    m.d.comb += port(name).eq(value)
                elif name.endswith("ready"):
                    m.d.comb += inner(name).eq(port(name) & passes[channel])
                elif name in ("rvalid", "bvalid"):
                    m.d.comb += inner(name).eq(port(name) & ~scrubbing)
                else:
                    m.d.comb += inner(name).eq(port(name))

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
