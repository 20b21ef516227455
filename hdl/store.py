"""STORE engine: accumulator tiles through the fused epilogue into external memory over AXI4."""
from amaranth.hdl import C, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arch import write_bursts
from ..isa import (PARAMS_PER_INSTRUCTION, Epilogue, EpilogueParams, ErrorCode, Header, Opcode,
                   ParamsInstruction, RowScale, StoreInstruction, TensorDescriptor)
from .axi import AXI_BURST_INCR, AXI_RESP_OKAY, axi_write_signature
from .dma_front import FrontClient, engine_front, front_geometry, shared_front_signature
from .engine import check_state, dma_engine_members
from .epilogue import EpilogueDatapath, LaneParams
from .pipeline import SRAM_ATTRS, pipeline_register, ring_next
from ..config import check_config
from .walker import TileCheck, move_units, select_units, step_layout

__all__ = ["BeatBuffer", "StoreEngine", "STORE_INSTRUCTION", "W_BURST_BEATS", "W_DEPTH",
           "params_shift", "store_front_client"]

STORE_INSTRUCTION = data.UnionLayout({
    "header": Header,
    "store": StoreInstruction,
    "params": ParamsInstruction,
})
"""An instruction as the store engine takes it: a ``StoreInstruction``, or a
``ParamsInstruction`` when ``header.opcode`` is PARAMS (the header they begin with is
``header``)."""

W_DEPTH = 16
"""Write beats buffered ahead of the W channel."""
W_BURST_BEATS = W_DEPTH // 2
"""Beats of the engine's longest burst (AWLEN + 1): half of the W buffer."""

def params_shift(config):
    """``(offset, stride, count)`` of the PARAMS entries the store engine's queue moves down
    an entry a cycle as `LaneParams` writes them (`InstructionQueue`'s ``shift``), or None:
    on a core of one-instruction queues (flip-flops), where reading each entry from the first
    one takes no entry multiplexer (micro: 38 bits of 4 entries, ~90 iCE40 logic cells)."""
    if config.queue_depth != 1:
        return None
    return (ParamsInstruction["entries"].offset, EpilogueParams.size,
            min(config.cols, PARAMS_PER_INSTRUCTION))


def store_front_client(config):
    """What the store engine needs of its DMA front (`FrontClient`)."""
    words = config.axi_data_width // 32
    return FrontClient(lanes=config.cols, rows=config.accumulator_rows, elem_log2=(0, 2),
                       pool=config.epilogue_pool, permission="write", max_steps=256 * words,
                       max_beats=W_BURST_BEATS)


class BeatBuffer(wiring.Component):
    """The W FIFO of ``depth`` beats of ``data_bytes`` bytes, which builds each beat in place.

    A step writes the bytes ``hit`` marks of ``data`` into the beat at the write pointer
    (``write``): the block RAM's bit enables, so there is no beat register and no merge
    multiplexer (micro: 36 iCE40 logic cells less than a register ahead of a FIFO). A beat's
    first step writes all its bytes, with the strobe from ``hit``; a later one writes and adds
    ``hit``'s bytes.
    ``commit`` (with the beat's last ``write``) ends the beat with ``last`` and queues it. The
    read side is `amaranth.lib.fifo.SyncFIFOBuffered`'s: the beat in the read port's register,
    ``r_data`` valid while ``r_rdy``. The writer keeps a slot free for the beat it builds: at
    most ``depth`` beats committed or being built (the store engine's ``reserved``). ``full``:
    ``depth`` beats are committed."""

    def __init__(self, data_bytes, depth):
        self.data_bytes, self.depth = data_bytes, depth
        self.layout = data.StructLayout({"data": 8 * data_bytes, "strb": data_bytes, "last": 1})
        super().__init__({
            "write": In(1), "hit": In(data_bytes), "data": In(8 * data_bytes),
            "commit": In(1), "last": In(1),
            "r_rdy": Out(1), "r_en": In(1), "r_data": Out(self.layout), "full": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        inner_depth = self.depth - 1  # and the read port's register
        # (It reads only committed beats, never the one it writes: `SRAM_ATTRS`.)
        m.submodules.storage = storage = memory.Memory(shape=self.layout.size, depth=inner_depth,
                                                       init=[], attrs=SRAM_ATTRS)
        write_port = storage.write_port(granularity=1)
        read_port = storage.read_port()
        produce, consume = Signal(range(inner_depth)), Signal(range(inner_depth))
        level = Signal(range(inner_depth + 1))
        first = Signal(init=1)  # the next write is its beat's first
        hit = self.hit
        # A beat's first step writes all of it (the bytes it does not hit with strobe 0), so
        # no byte of a beat is left from an earlier one or undefined.
        bytes_written = (hit | first.replicate(len(hit))) & self.write.replicate(len(hit))
        written = self.layout(write_port.en)
        m.d.comb += [
            write_port.addr.eq(produce),
            write_port.data.eq(Cat(self.data, hit, self.last)),
            written.data.eq(Cat(b.replicate(8) for b in bytes_written)),
            written.strb.eq(bytes_written),
            written.last.eq(self.commit),
        ]
        with m.If(self.write):
            m.d.sync += first.eq(self.commit)
        with m.If(self.commit):
            m.d.sync += produce.eq(ring_next(produce, inner_depth))

        take = (level != 0) & (~self.r_rdy | self.r_en)  # into the read port's register
        m.d.comb += [read_port.addr.eq(consume), read_port.en.eq(take),
                     self.r_data.eq(read_port.data)]
        with m.If(take):
            m.d.sync += [consume.eq(ring_next(consume, inner_depth)), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        m.d.sync += level.eq(level + self.commit - take)
        m.d.comb += self.full.eq((level == inner_depth) & self.r_rdy)
        return m


class StoreEngine(wiring.Component):
    """Executes STORE and PARAMS instructions: accumulator rows -> epilogue -> external memory.

    PARAMS writes the per-lane epilogue parameters (`LaneParams`), an entry a cycle. A STORE
    writes tile element ``(i0, i1, i2, i3)`` from lane ``i0`` of its accumulator row through the
    epilogue (see ``Epilogue``): int32 elements (requantized or not), or int8 with
    ``requant``; with ``per_row`` every lane of a step takes the entry of its row's offset from
    ``sram_row`` (``i1``), and a tile that is not 2-D, is pooled or has more than ``cols`` rows
    is BAD_EXTENT; with ``row_scale`` (a core with the softmax unit) every lane of a step takes
    the multiplier and shift of row scale ``scale_row + i1`` (``scale_read``, read beside the
    accumulator). With ``pool``
    the epilogue is applied once, to the maximum of the four accumulators (the same as the
    maximum of their epilogues, monotonic non-decreasing for multipliers >= 0). Out-of-bounds
    elements are skipped (their bytes are not strobed). Walked steps flow one per cycle (four
    accumulator reads per in-bounds pooled step) through the pipeline read -> the epilogue
    (`EpilogueDatapath`: pool max and bias, multiply, shift, round, saturate) -> beat builder;
    a step is up to a beat of elements for contiguous rows (dim-0 stride the element size),
    else one. The epilogue is ``min(cols, beat bytes / 4)`` lanes wide (a beat of int32 elements
    a cycle): an int8 step wider than that passes in parts. The W beats of a burst go from the
    cycle its AW is presented, whether or not AWREADY has come. On an error nothing more is
    issued, every presented AW is held until accepted and gets its W beats and its B response,
    then ``error`` is raised and held.
    """

    def __init__(self, config):
        check_config(config)
        self.config = config
        super().__init__({
            **dma_engine_members(STORE_INSTRUCTION, axi_write_signature(config.axi_data_width),
                                 config, shifting=params_shift(config) is not None),
            "acc_read": In(memory.ReadPort.Signature(
                addr_width=ceil_log2(config.accumulator_rows),
                shape=data.ArrayLayout(signed(32), config.cols))),
            **({"scale_read": In(memory.ReadPort.Signature(
                addr_width=ceil_log2(config.probability_rows), shape=RowScale))}
               if config.softmax else {}),
            **({"front": In(shared_front_signature(config))} if config.shared_dma else {}),
        })

    def elaborate(self, platform):
        m = Module()
        config, axi = self.config, self.axi
        beat_bytes = config.axi_data_width // 8
        words = beat_bytes // 4
        cols, rows = config.cols, config.accumulator_rows
        # The epilogue is `units` lanes wide: a bus beat of int32 elements a cycle. A step of
        # int8 elements wider than that (up to a beat) passes in parts of `units` lanes.
        units = min(cols, max(1, words))
        select = cols > units          # steps' lanes are moved to units 0.. (else unit = lane)

        client = store_front_client(config)
        m.submodules.check = check = TileCheck(cols, rows, elem_log2=client.elem_log2,
                                               pool=client.pool, dims=config.descriptor_dims,
                                               held=True)
        shared = config.shared_dma
        front, acquiring = engine_front(m, self, client)
        # The front's steps: as many lanes as the scratchpad's when it is shared.
        front_lanes, front_rows = front_geometry(config, client)
        m.submodules.beats = beats = BeatBuffer(beat_bytes, W_DEPTH)

        instr = self.instr.payload
        is_params = instr.header.opcode == Opcode.PARAMS
        options, taken_tensor = instr.store.epilogue, instr.store.tensor
        element_ok = ((taken_tensor.elem_log2 == 2)
                      | (options.requant & (taken_tensor.elem_log2 == 0)))
        dims = taken_tensor.dims
        # (The TileCheck finds a dim past the walked ones with an extent other than 1.)
        two_d = Cat(dims[d].extent == 1 for d in range(2, config.descriptor_dims)).all()
        rows_ok = ((~options.per_row | (~options.pool & (dims[1].extent <= cols) & two_d))
                   & (~options.row_scale | (options.requant & ~options.pool & ~options.per_row
                                            & two_d)))
        # A row scale on a core without the softmax unit (no row scales), or pooling on one
        # without it: UNKNOWN_OPCODE.
        missing = ((C(0) if config.softmax else options.row_scale)
                   | (C(0) if config.epilogue_pool else options.pool))
        dispatch_code = Mux(missing, ErrorCode.UNKNOWN_OPCODE,
                            Mux(element_ok, ErrorCode.BAD_EXTENT, ErrorCode.BAD_ELEMENT))
        # The running STORE's epilogue and descriptor (for the check and walker): registered
        # when taken, or without prefetch the queue's slot, which holds until it is done.
        prefetch = config.store_prefetch
        epilogue = Signal(Epilogue) if prefetch else options
        tensor = Signal(TensorDescriptor) if prefetch else taken_tensor
        if not prefetch:
            m.d.comb += self.holding.eq(self.busy)
        int8 = Signal()  # its elements are int8
        # Row scales (`Epilogue.row_scale`): tile row i1 (row sram_row + i1) takes row scale
        # scale_row + i1, read beside the accumulator; the scale rows' range is checked beside
        # the TileCheck (`scale_code`, from registers).
        scale_offset = Signal(ceil_log2(config.probability_rows))  # scale_row - sram_row
        scale_code = Signal(ErrorCode)
        if config.softmax:
            m.d.sync += [
                scale_offset.eq(epilogue.scale_row - tensor.sram_row),
                scale_code.eq(Mux(epilogue.row_scale
                                  & (epilogue.scale_row + tensor.dims[1].extent
                                     > config.probability_rows),
                                  ErrorCode.SRAM_RANGE, ErrorCode.NONE)),
            ]
        running = Signal()
        # The check and the walker take a STORE's descriptor a cycle after the engine, from
        # `tensor`: off the dispatch's path (the routed 8x8's critical path ran from the
        # controller's queue through the dispatch into the walker's registers, 19.1 ns, and
        # then into the check's, 16.3 ns).
        walk = Signal()
        stopped = Signal()
        code = Signal(ErrorCode)
        dispatch_verdict = Signal(ErrorCode)
        if config.epilogue_pool:
            m.d.comb += [
                check.held_pool.enable.eq(epilogue.pool),
                check.held_pool.pitch.eq(epilogue.pool_pitch),
                front.held_pool.eq(check.held_pool),
                check.pool.enable.eq(epilogue.pool),
                check.pool.pitch.eq(epilogue.pool_pitch),
            ]
        m.d.comb += [
            check.descriptor.payload.eq(tensor),
            check.descriptor.valid.eq(walk),
            *([] if shared else [front.walk.eq(walk)]),  # a shared front's once granted
            check.held.eq(tensor),
            front.held.eq(tensor),
            front.running.eq(running),
            front.abort.eq(stopped),
        ]

        multiplier = config.epilogue_multiplier
        shifted = params_shift(config) is not None
        m.submodules.lane_params = lane_params = LaneParams(cols, units, multiplier=multiplier,
                                                            shifted=shifted)
        m.submodules.datapath = datapath = EpilogueDatapath(units, multiplier=multiplier,
                                                            pool=config.epilogue_pool)
        m.d.comb += lane_params.instr.payload.eq(instr.params)

        # Planned steps -> A: accumulator read -> B: its data registered, parameter read, the
        # epilogue datapath's stages -> D: beat builder -> W FIFO. The stages move every cycle:
        # a step is fetched only while the FIFO has room for the beats it and the steps ahead
        # of it will emit (`reserved`), so no stall fans out to every stage's registers (the
        # routed 8x8's critical path ran from the FIFO's level through that stall, 17.9 ns).
        # The room is asked at a part's first read: a pooled part's four reads come on
        # consecutive cycles, as the epilogue's pool maximum needs.
        planned = front.steps.payload
        pool = config.epilogue_pool
        read = Signal(2 if pool else 0)  # which of the four rows of a pooled step
        last_read = ~(epilogue.pool & planned.in_bounds) | (read == 3) if pool else C(1)
        done_lanes = Signal(range(cols + 1))  # lanes of the step in earlier parts
        left = Signal(range(cols + 1))
        last_part = Signal()
        step = Signal.like(planned)  # the part of the planned step going through now
        m.d.comb += [
            left.eq(planned.count - done_lanes),
            last_part.eq(~planned.in_bounds | (left <= units)),
            step.eq(planned),
            step.lane.eq(planned.lane + done_lanes),
            step.count.eq(Mux(last_part, left, units)),
            step.offset.eq(planned.offset + done_lanes),  # only int8 steps come in parts
            step.end_of_beat.eq(planned.end_of_beat & last_part),
            step.end_of_burst.eq(planned.end_of_burst & last_part),
            step.last_in_row.eq(planned.last_in_row & last_part),
            step.last.eq(planned.last & last_part),
        ]
        d_valid = Signal()
        d_step = Signal(step_layout(front_lanes, front_rows, beat_bytes))
        d_y = data.View(data.ArrayLayout(signed(32), units), datapath.y)
        emit = d_step.in_bounds & d_step.end_of_beat
        reserved = Signal(range(W_DEPTH + 1))  # beats in the W FIFO or on their way to it
        fetch = front.steps.valid & ((read != 0) | (reserved != W_DEPTH))
        m.d.comb += [
            front.steps.ready.eq(fetch & last_read & last_part),
            self.acc_read.en.eq(fetch),
            self.acc_read.addr.eq(step.row + Mux(read[1], epilogue.pool_pitch, 0) + read[0]
                                  if config.epilogue_pool else step.row),
        ]
        m.d.sync += reserved.eq(reserved + (fetch & (read == 0) & step.in_bounds
                                            & step.end_of_beat) - beats.r_en)
        with m.If(fetch):
            m.d.sync += read.eq(Mux(last_read, 0, read + 1))
            with m.If(last_read):
                m.d.sync += done_lanes.eq(Mux(last_part, 0, done_lanes + units))

        def stage(value, name):
            return pipeline_register(m, value, name)

        a_valid, a_step = stage(fetch, "a_valid"), stage(step, "a_step")
        # The parameter entry: the step's first lane, or with per_row its tile row (< cols).
        a_entry = stage(
            Mux(epilogue.per_row, step.row - tensor.sram_row, step.lane)[:ceil_log2(cols)],
            "a_entry")
        a_read, a_last = stage(read, "a_read"), stage(last_read, "a_last")

        acc = self.acc_read.data.as_value()
        if select:  # the step's lanes, from unit 0 on
            acc = select_units(acc, a_step.lane, units, 32)
        # B: the accumulator's read data registered (a block RAM output feeds no logic but
        # the unit select), the parameters of the entry read beside it (`LaneParams`).
        b_acc, b_first = stage(acc, "b_acc"), stage(a_read == 0, "b_first")
        m.d.comb += [lane_params.lane.eq(a_entry), lane_params.same.eq(epilogue.per_row),
                     datapath.options.eq(epilogue), datapath.int8.eq(int8),
                     datapath.first.eq(b_first), datapath.acc.eq(b_acc)]
        if config.softmax:  # the row scale replaces each unit's multiplier and shift
            m.d.comb += [self.scale_read.addr.eq(step.row + scale_offset),
                         self.scale_read.en.eq(fetch)]
            b_scale = stage(self.scale_read.data, "b_scale")
            lanes = data.View(data.ArrayLayout(EpilogueParams, units), lane_params.params)
            scaled = data.View(data.ArrayLayout(EpilogueParams, units), datapath.params)
            for u in range(units):
                m.d.comb += [
                    scaled[u].bias.eq(lanes[u].bias),
                    scaled[u].multiplier.eq(Mux(epilogue.row_scale, b_scale.multiplier,
                                                lanes[u].multiplier)),
                    scaled[u].shift.eq(Mux(epilogue.row_scale, b_scale.shift, lanes[u].shift)),
                ]
        else:
            m.d.comb += datapath.params.eq(lane_params.params)
        valid, late_step = stage(a_valid & a_last, "b_valid"), stage(a_step, "b_step")
        for n in range(1, datapath.latency):
            valid, late_step = stage(valid, f"valid{n}"), stage(late_step, f"step{n}")
        m.d.sync += [d_valid.eq(valid), d_step.eq(late_step)]

        # D: the step's elements, int32 or int8, into their bytes of the beat, in the W FIFO.
        first = 0 if select else d_step.lane
        moved32, mask32 = move_units(m, d_y.as_value(), first, d_step.offset[2:], d_step.count,
                                     words, 32)
        moved8, mask8 = move_units(m, Cat(d_y[u][:8] for u in range(units)), first,
                                   d_step.offset, d_step.count, beat_bytes, 8)
        mask32_bytes = Cat(mask32[b // 4] for b in range(beat_bytes))
        m.d.comb += [beats.data.eq(Mux(int8, moved8, moved32)),
                     beats.hit.eq(Mux(int8, mask8, mask32_bytes)),
                     beats.write.eq(d_valid & d_step.in_bounds),
                     beats.commit.eq(d_valid & emit),
                     beats.last.eq(d_step.end_of_burst)]

        # AW while fewer than `write_bursts` bursts wait for B. W for bursts whose AW is on the
        # bus or was accepted: never waiting for AWREADY (AXI4 lets a slave wait for WVALID
        # before it raises AWREADY), never ahead of the AW it belongs to.
        bursts = write_bursts(config)
        outstanding = Signal(range(bursts + 1))
        released = Signal(range(bursts + 2))
        aw_waiting = Signal()
        aw_free = outstanding < bursts
        aw_presented = axi.awvalid & ~aw_waiting  # the first cycle of an AW on the bus
        head = beats.r_data
        m.d.comb += [
            axi.awid.eq(0), axi.awaddr.eq(front.bursts.payload.addr),
            axi.awlen.eq(front.bursts.payload.len), axi.awsize.eq(ceil_log2(beat_bytes)),
            axi.awburst.eq(AXI_BURST_INCR),
            axi.awvalid.eq(front.bursts.valid & aw_free),
            front.bursts.ready.eq(axi.awready & aw_free),
            axi.wdata.eq(head.data), axi.wstrb.eq(head.strb), axi.wlast.eq(head.last),
            axi.wvalid.eq(beats.r_rdy & ((released != 0) | aw_presented)),
            beats.r_en.eq(axi.wvalid & axi.wready),
            axi.bready.eq(1),
        ]
        aw_done = axi.awvalid & axi.awready
        w_done = axi.wvalid & axi.wready
        b_done = axi.bvalid & axi.bready
        m.d.sync += [outstanding.eq(outstanding + aw_done - b_done),
                     aw_waiting.eq(axi.awvalid & ~axi.awready),
                     released.eq(released + aw_presented - (w_done & axi.wlast))]
        m.d.comb += self.progress.eq(aw_done | w_done | b_done)
        bus_error = b_done & (axi.bresp != AXI_RESP_OKAY)

        walked = Signal()  # the last step has left the beat builder
        idle_bus = ~front.bursts.valid & (outstanding == 0)
        if shifted:
            m.d.comb += self.shift.eq(lane_params.shift)
        m.d.sync += [self.done.eq(0), walk.eq(0)]
        with m.FSM():
            with m.State("IDLE"):
                take = self.instr.valid & self.instr.ready
                if prefetch:
                    # Kept in every idle cycle: no decode on the registers' enable. A PARAMS
                    # is taken with its last entry, written from the queue's head.
                    m.d.sync += [epilogue.eq(options), tensor.eq(taken_tensor)]
                    m.d.comb += [self.instr.ready.eq(Mux(is_params, lane_params.instr.ready,
                                                         ~lane_params.clearing)),
                                 lane_params.instr.valid.eq(self.instr.valid & is_params)]
                else:  # taken at once, its entries written from the slot it holds (PARAMS)
                    m.d.comb += self.instr.ready.eq(~lane_params.clearing)
                # The dispatch checks are registered in every idle cycle too, and the taken
                # STORE's verdict acted on in CHECK: a STORE is taken, walked and checked
                # whatever they say (the routed 16x16's critical path ran from the store queue
                # through them into the engine's registers, 19.3 ns).
                m.d.sync += dispatch_verdict.eq(Mux(element_ok & rows_ok & ~missing,
                                                    ErrorCode.NONE, dispatch_code))
                with m.If(take):
                    with m.If(is_params):
                        if prefetch:
                            m.d.sync += self.done.eq(1)
                        else:
                            m.next = "PARAMS"
                    with m.Else():
                        m.d.sync += [walked.eq(0), walk.eq(1),
                                     int8.eq(options.requant & (taken_tensor.elem_log2 == 0))]
                        m.next = "CHECK"
            if not prefetch:
                # The entries are written while the engine holds the slot: the dispatch, which
                # waits for tokens, is not on the path into the slot's shift (the routed UP5K's
                # critical path ran from a token counter through the dispatch into the shift
                # enables of the slot's entries, 50.6 ns).
                with m.State("PARAMS"):
                    m.d.comb += [self.busy.eq(1), lane_params.instr.valid.eq(1)]
                    with m.If(lane_params.instr.ready):
                        m.d.sync += self.done.eq(1)
                        m.next = "IDLE"
            if shared:
                with m.State("ACQUIRE"):  # the checks passed: walk once the front is granted
                    m.d.comb += [self.busy.eq(1), acquiring.eq(1)]
                    with m.If(front.granted):
                        m.d.comb += front.walk.eq(1)
                        m.next = "RUN"
            with m.State("CHECK"):
                with m.If(dispatch_verdict != ErrorCode.NONE):
                    m.d.comb += [self.busy.eq(1), stopped.eq(1)]
                    m.d.sync += self.error.eq(dispatch_verdict)
                    m.next = "ERROR"
                with m.Else():
                    check_state(m, self, check, stopped, also=scale_code,
                                then="ACQUIRE" if shared else "RUN")
            with m.State("RUN"):
                m.d.comb += [self.busy.eq(1), running.eq(1)]
                with m.If(d_valid & d_step.last):
                    m.d.sync += walked.eq(1)
                with m.If((front.error != ErrorCode.NONE) | bus_error):
                    m.d.sync += code.eq(Mux(bus_error, ErrorCode.BUS_ERROR, front.error))
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
