"""STORE engine: int32 accumulator tiles into external memory over AXI4 writes."""
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, fifo, memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..isa import NUM_WINDOWS, ErrorCode, StoreInstruction, Window
from .axi import AXI_BURST_INCR, AXI_RESP_OKAY, axi_write_signature
from .engine import engine_members
from .load import MAX_OUTSTANDING, check_config
from .walker import BurstPlanner, TileCheck, TileWalker, move_units

__all__ = ["StoreEngine", "W_DEPTH"]

W_DEPTH = 16
"""Write beats buffered ahead of the W channel; a burst is at most half of them."""


class StoreEngine(wiring.Component):
    """Executes STORE instructions: accumulator rows -> external int32 elements.

    Element ``i0`` of a tile row is lane ``i0`` of its accumulator row; out-of-bounds elements
    are skipped (their bytes are not strobed). One walked step per cycle into the beat builder:
    up to a beat of elements for contiguous rows (dim-0 stride 4), else one element. The W beats
    of a burst are sent once its AW has been accepted. On an error nothing more is issued, every
    accepted AW gets its W beats and its B response, then ``error`` is raised and held.
    """

    def __init__(self, config):
        check_config(config)
        self.config = config
        super().__init__({
            **engine_members(StoreInstruction),
            "windows": In(data.ArrayLayout(Window, NUM_WINDOWS)),
            "axi": Out(axi_write_signature(config.axi_data_width)),
            "acc_read": In(memory.ReadPort.Signature(
                addr_width=ceil_log2(config.accumulator_rows),
                shape=data.ArrayLayout(signed(32), config.cols))),
        })

    def elaborate(self, platform):
        m = Module()
        config, axi = self.config, self.axi
        beat_bytes = config.axi_data_width // 8
        words = beat_bytes // 4
        cols, rows = config.cols, config.accumulator_rows

        m.submodules.check = check = TileCheck(cols, rows, elem_log2=2)
        m.submodules.walker = walker = TileWalker(cols, rows, elem_log2=2, beat_bytes=beat_bytes)
        m.submodules.planner = planner = BurstPlanner(
            cols, rows, beat_bytes, max_steps=256 * words, max_beats=W_DEPTH // 2,
            permission="write")
        beat_layout = data.StructLayout({"data": config.axi_data_width, "strb": beat_bytes,
                                         "last": 1})
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=beat_layout.size, depth=W_DEPTH)

        running = Signal()
        stopped = Signal()
        code = Signal(ErrorCode)
        m.d.comb += [
            check.descriptor.payload.eq(self.instr.payload.tensor),
            walker.descriptor.payload.eq(self.instr.payload.tensor),
            planner.windows.eq(self.windows),
            planner.elements.payload.eq(walker.elements.payload),
            planner.elements.valid.eq(walker.elements.valid & running),
            walker.elements.ready.eq(planner.elements.ready & running),
            planner.abort.eq(stopped),
            walker.abort.eq(stopped),
        ]

        # Steps -> accumulator read -> beat builder -> W FIFO.
        step = Signal.like(planner.steps.payload)
        step_valid = Signal()
        beat = Signal(beat_layout)
        merged = Signal(beat_layout)
        moved, mask = move_units(m, self.acc_read.data.as_value(), step.lane,
                                 step.offset[2:], step.count, words, 32)
        for w in range(words):
            hit = step.in_bounds & mask[w]
            m.d.comb += [merged.data.word_select(w, 32).eq(Mux(hit, moved.word_select(w, 32),
                                                               beat.data.word_select(w, 32))),
                         merged.strb.word_select(w, 4).eq(Mux(hit, 0b1111,
                                                              beat.strb.word_select(w, 4)))]
        m.d.comb += merged.last.eq(step.end_of_burst)
        emit = step.in_bounds & step.end_of_beat
        build = step_valid & (~emit | beats.w_rdy)
        fetch = planner.steps.valid & (~step_valid | build)
        m.d.comb += [
            planner.steps.ready.eq(fetch),
            self.acc_read.en.eq(fetch),
            self.acc_read.addr.eq(planner.steps.payload.row),
            beats.w_data.eq(merged),
            beats.w_en.eq(build & emit),
        ]
        with m.If(fetch):
            m.d.sync += [step.eq(planner.steps.payload), step_valid.eq(1)]
        with m.Elif(build):
            m.d.sync += step_valid.eq(0)
        with m.If(build):
            m.d.sync += beat.eq(Mux(emit, 0, merged))

        # AW while fewer than MAX_OUTSTANDING bursts wait for B; W for bursts with an accepted AW.
        outstanding = Signal(range(MAX_OUTSTANDING + 1))
        released = Signal(range(MAX_OUTSTANDING + 1))
        aw_free = outstanding < MAX_OUTSTANDING
        head = beat_layout(beats.r_data)
        m.d.comb += [
            axi.awid.eq(0), axi.awaddr.eq(planner.bursts.payload.addr),
            axi.awlen.eq(planner.bursts.payload.len), axi.awsize.eq(ceil_log2(beat_bytes)),
            axi.awburst.eq(AXI_BURST_INCR),
            axi.awvalid.eq(planner.bursts.valid & aw_free),
            planner.bursts.ready.eq(axi.awready & aw_free),
            axi.wdata.eq(head.data), axi.wstrb.eq(head.strb), axi.wlast.eq(head.last),
            axi.wvalid.eq(beats.r_rdy & (released != 0)),
            beats.r_en.eq(axi.wvalid & axi.wready),
            axi.bready.eq(1),
        ]
        aw_done = axi.awvalid & axi.awready
        w_done = axi.wvalid & axi.wready
        b_done = axi.bvalid & axi.bready
        m.d.sync += [outstanding.eq(outstanding + aw_done - b_done),
                     released.eq(released + aw_done - (w_done & axi.wlast))]
        m.d.comb += self.progress.eq(aw_done | w_done | b_done)
        bus_error = b_done & (axi.bresp != AXI_RESP_OKAY)

        walked = Signal()  # the last step has left the beat builder
        idle_bus = ~planner.bursts.valid & (outstanding == 0)
        m.d.sync += self.done.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.instr.ready.eq(1),
                             check.descriptor.valid.eq(self.instr.valid),
                             walker.descriptor.valid.eq(self.instr.valid)]
                with m.If(self.instr.valid):
                    m.d.sync += walked.eq(0)
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += [self.busy.eq(1), check.result.ready.eq(1)]
                with m.If(check.result.valid):
                    with m.If(check.result.payload == ErrorCode.NONE):
                        m.next = "RUN"
                    with m.Else():
                        m.d.comb += stopped.eq(1)
                        m.d.sync += self.error.eq(check.result.payload)
                        m.next = "ERROR"
            with m.State("RUN"):
                m.d.comb += [self.busy.eq(1), running.eq(1)]
                with m.If(build & step.last):
                    m.d.sync += walked.eq(1)
                with m.If((planner.error != ErrorCode.NONE) | bus_error):
                    m.d.sync += code.eq(Mux(bus_error, ErrorCode.BUS_ERROR, planner.error))
                    m.next = "DRAIN"
                with m.Elif(walked & idle_bus):
                    m.d.sync += self.done.eq(1)
                    m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += [self.busy.eq(1), stopped.eq(1)]
                with m.If(idle_bus):
                    m.d.sync += self.error.eq(code)
                    m.next = "ERROR"
            with m.State("ERROR"):
                m.d.comb += stopped.eq(1)
        return m
