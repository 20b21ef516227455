"""LOAD engine: int8 tiles from external memory into scratchpad rows over AXI4 reads."""
from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In
from amaranth.utils import ceil_log2

from ..arch import MAX_OUTSTANDING, PLAN_DEPTH
from ..config import check_config
from ..isa import ErrorCode, Header, LoadIm2colInstruction, LoadInstruction
from .axi import AXI_BURST_INCR, AXI_RESP_OKAY, axi_read_signature
from .dma_front import FrontClient, engine_front, front_geometry, shared_front_signature
from .engine import check_state, dma_engine_members
from .pipeline import BufferedFifo
from .walker import (Im2colWalker, TileCheck, im2col_walker_signature, select_units, step_layout,
                     unit_move)

__all__ = ["LoadEngine", "LOAD_INSTRUCTION", "MAX_OUTSTANDING", "PLAN_DEPTH", "load_front_client"]

LOAD_INSTRUCTION = data.UnionLayout({
    "header": Header,
    "load": LoadInstruction,
    "load_im2col": LoadIm2colInstruction,
})
"""A LOAD as the engine takes it: a ``LoadInstruction``, or a ``LoadIm2colInstruction`` when
``header.im2col`` is set (the header they begin with is ``header``)."""



def load_front_client(config):
    """What the load engine needs of its DMA front (`FrontClient`)."""
    return FrontClient(lanes=config.lanes, rows=config.scratchpad_rows, elem_log2=(0,),
                       pool=False, permission="read", max_steps=PLAN_DEPTH // 4, max_beats=256,
                       holds=config.load_prefetch)


def _im2col_check(desc, lanes, rows):
    """The error of an ``Im2colDescriptor`` found before any access, or NONE."""
    bad_extent = ((desc.rows == 0) | (desc.lanes == 0) | (desc.lanes > lanes) |
                  (desc.kernel_h == 0) | (desc.kernel_w == 0) | (desc.conv_stride == 0))
    return Mux(bad_extent, ErrorCode.BAD_EXTENT,
               Mux(desc.sram_row + desc.rows > rows, ErrorCode.SRAM_RANGE, ErrorCode.NONE))


class LoadEngine(wiring.Component):
    """Executes LOAD instructions: external int8 elements -> scratchpad rows.

    Lane ``lane + i0`` of each row gets its element, lanes from ``lane + extent0`` on get 0, as
    does an out-of-bounds element (padding); lanes below ``lane`` keep their contents (each
    step's lanes are written as it comes, a byte enable per lane, the zeros past the row's last
    step with it). With ``header.im2col`` set the instruction is read as a
    ``LoadIm2colInstruction``: a tile of the lowered matrix of a convolution, walked by an
    ``Im2colWalker``. One walked step per cycle from the R channel, shifted into place: up to a
    beat of lanes for contiguous rows (dim-0 stride 1), else one element; up to
    ``MAX_OUTSTANDING`` bursts in flight. On an error nothing more is issued, every outstanding
    burst is drained, then ``error`` is raised and held. An instruction is registered when
    taken (or, without `CoreConfig.load_prefetch`, read from the queue's slot, held meanwhile)
    and decoded the next cycle; an im2col LOAD's check is registered
    then and acted on the cycle after.
    """

    def __init__(self, config):
        check_config(config)
        self.config = config
        super().__init__({
            **dma_engine_members(LOAD_INSTRUCTION, axi_read_signature(config.axi_data_width),
                                 config),
            "sp_write": In(memory.WritePort.Signature(
                addr_width=ceil_log2(config.scratchpad_rows),
                shape=data.ArrayLayout(signed(8), config.lanes), granularity=1)),
            **({"front": In(shared_front_signature(config))} if config.shared_dma else {}),
        })

    def elaborate(self, platform):
        m = Module()
        config, axi = self.config, self.axi
        beat_bytes = config.axi_data_width // 8
        lanes, rows = config.lanes, config.scratchpad_rows

        dims = config.descriptor_dims
        m.submodules.check = check = TileCheck(lanes, rows, elem_log2=0, dims=dims, held=True)
        shared = config.shared_dma
        client = load_front_client(config)
        front, acquiring = engine_front(m, self, client)
        # The front's elements and steps: rows as wide as the accumulator's when it is shared.
        _, front_rows = front_geometry(config, client)
        if config.im2col:
            m.submodules.im2col_walker = im2col_walker = Im2colWalker(lanes, front_rows,
                                                                      config.address_width)
        else:  # a walker that never starts: an im2col LOAD stops with UNKNOWN_OPCODE
            im2col_walker = im2col_walker_signature(lanes, front_rows,
                                                    config.address_width).create()
        wiring.connect(m, im2col_walker.elements, front.extra)
        # A planned step with where its bytes go (`unit_move`), formed as it is queued.
        layout = data.StructLayout({"step": step_layout(lanes, front_rows, beat_bytes),
                                    "offset": ceil_log2(beat_bytes), "mask": lanes})
        m.submodules.plan = plan = BufferedFifo(width=layout.size, depth=PLAN_DEPTH)
        queued = layout(plan.w_data)
        move_offset, move_mask = unit_move(front.steps.payload.offset,
                                           front.steps.payload.lane,
                                           front.steps.payload.count, lanes)

        # The running LOAD: registered when taken and decoded the next cycle, or without
        # prefetch the queue's slot, which holds until the walk runs (a tensor LOAD: the
        # front keeps what it walks by, `FrontClient.holds`, and the engine the first lane) or
        # until the LOAD is done (an im2col LOAD, whose walker reads the slot throughout).
        prefetch = config.load_prefetch
        instr = Signal(LOAD_INSTRUCTION) if prefetch else self.instr.payload
        tensor = instr.load.tensor
        lane = tensor.lane if prefetch else Signal.like(tensor.lane)
        if not prefetch:
            released = Signal()  # the slot is the controller's again
            m.d.comb += self.holding.eq(self.busy & ~released)

        def release(tensor_load):
            """Statements that give the slot back once ``tensor_load``'s walk runs."""
            return [] if prefetch else [released.eq(tensor_load)]
        im2col_desc = instr.load_im2col.im2col
        im2col_code = Signal(ErrorCode)
        im2col = Signal()    # the instruction is an im2col load
        # Checks passed, elements flow: a register that is 1 exactly in RUN (set as the FSM
        # enters it), so the walkers' ready, and from it the clock enables of their many
        # registers, decode no FSM state (the routed 8x8's critical path ran from the state
        # through the im2col walker's step into them, 16.1 ns).
        running = Signal()
        draining = Signal()  # stopped on an error, R beats still accepted
        stopped = Signal()
        code = Signal(ErrorCode)
        im2col_verdict = Signal(ErrorCode)
        m.d.comb += [
            check.descriptor.payload.eq(tensor),
            check.held.eq(tensor),  # instr holds until the LOAD ends
            front.held.eq(tensor),
            im2col_walker.descriptor.payload.eq(im2col_desc),
            im2col_walker.held.eq(im2col_desc),  # instr holds until the LOAD ends
            im2col_code.eq(_im2col_check(im2col_desc, lanes, rows) if config.im2col
                           else ErrorCode.UNKNOWN_OPCODE),
            front.external.eq(im2col),
            front.running.eq(running),
            front.abort.eq(stopped),
            im2col_walker.abort.eq(stopped),
            queued.step.eq(front.steps.payload),
            queued.offset.eq(move_offset),
            queued.mask.eq(move_mask),
            plan.w_en.eq(front.steps.valid),
            front.steps.ready.eq(plan.w_rdy),
        ]

        # AR: the planner's bursts, while fewer than MAX_OUTSTANDING are in flight.
        outstanding = Signal(range(MAX_OUTSTANDING + 1))
        ar_free = outstanding < MAX_OUTSTANDING
        m.d.comb += [
            axi.arid.eq(0), axi.araddr.eq(front.bursts.payload.addr),
            axi.arlen.eq(front.bursts.payload.len), axi.arsize.eq(ceil_log2(beat_bytes)),
            axi.arburst.eq(AXI_BURST_INCR),
            axi.arvalid.eq(front.bursts.valid & ar_free),
            front.bursts.ready.eq(axi.arready & ar_free),
        ]
        ar_done = axi.arvalid & axi.arready
        r_done = axi.rvalid & axi.rready
        m.d.sync += outstanding.eq(outstanding + ar_done - (r_done & axi.rlast))

        # R -> scratchpad: one planned step (its lanes zero when out of bounds) per cycle,
        # written as it comes (the lanes of the row from the first on, a lane's write enable
        # each): its own lanes, and with the row's last step the lanes past it (zero fill).
        planned = layout(plan.r_data)
        step, mask = planned.step, planned.mask
        moved = select_units(Mux(step.in_bounds, axi.rdata, 0), planned.offset, lanes, 8)
        first_lane = Mux(im2col, 0, lane)
        kept_lanes = Cat(first_lane <= k for k in range(lanes))  # the lanes a row write enables
        past = Cat(~mask[k:].any() for k in range(lanes))  # the lanes past the step's
        bus_error = axi.rvalid & (axi.rresp != AXI_RESP_OKAY)
        # RREADY is high for a step that ends its beat whether or not RVALID is (AXI allows
        # it): no path from R through the step's take to RREADY and on to the soft reset's
        # burst count (the routed 8x8's critical path, 16.7 ns). A failing beat is taken on
        # the bus then and dropped, as in DRAIN.
        wants_beat = running & plan.r_rdy & step.in_bounds & step.end_of_beat
        take = running & plan.r_rdy & (~step.in_bounds | axi.rvalid) & ~bus_error
        m.d.comb += [
            plan.r_en.eq(take),
            axi.rready.eq(draining | wants_beat),
            self.sp_write.addr.eq(step.row),
            self.sp_write.data.eq(Cat(Mux(mask[k], moved.word_select(k, 8), 0)
                                      for k in range(lanes))),
            self.sp_write.en.eq(Mux(take, kept_lanes & (mask | Mux(step.last_in_row, past, 0)),
                                    0)),
            self.progress.eq(ar_done | r_done | self.sp_write.en.any()),
        ]

        m.d.sync += self.done.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.instr.ready.eq(1)
                with m.If(self.instr.valid):
                    if prefetch:
                        m.d.sync += instr.eq(self.instr.payload)
                    else:
                        m.d.sync += [released.eq(0), lane.eq(self.instr.payload.load.tensor.lane)]
                    m.next = "DECODE"
            with m.State("DECODE"):
                plain = ~instr.header.im2col
                m.d.comb += [self.busy.eq(1), check.descriptor.valid.eq(plain)]
                if not shared:  # a walk starts with its check (a shared front's once granted)
                    m.d.comb += front.walk.eq(plain)
                m.d.sync += [im2col.eq(instr.header.im2col), im2col_verdict.eq(im2col_code)]
                with m.If(plain):
                    m.next = "CHECK"
                with m.Else():
                    m.next = "IM2COL"
            with m.State("IM2COL"):
                # The im2col check's verdict, registered in DECODE: the walker's many registers
                # wait for no compare (the routed 8x8's critical path ran from the instruction
                # through the check into them, 18.4 ns).
                m.d.comb += self.busy.eq(1)
                if not shared:
                    m.d.comb += im2col_walker.descriptor.valid.eq(
                        im2col_verdict == ErrorCode.NONE)
                with m.If(im2col_verdict == ErrorCode.NONE):
                    if shared:
                        m.next = "ACQUIRE"
                    else:
                        m.d.sync += running.eq(1)
                        m.next = "RUN"
                with m.Else():
                    m.d.sync += self.error.eq(im2col_verdict)
                    m.next = "ERROR"
            with m.State("CHECK"):
                passed = check_state(m, self, check, stopped,
                                     then="ACQUIRE" if shared else "RUN")
                if not shared:
                    with m.If(passed):
                        m.d.sync += [running.eq(1), *release(1)]
            if shared:
                with m.State("ACQUIRE"):  # the checks passed: walk once the front is granted
                    m.d.comb += [self.busy.eq(1), acquiring.eq(1)]
                    with m.If(front.granted):
                        m.d.comb += [front.walk.eq(~im2col),
                                     im2col_walker.descriptor.valid.eq(im2col)]
                        m.d.sync += [running.eq(1), *release(~im2col)]
                        m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                with m.If((front.error != ErrorCode.NONE) | bus_error):
                    m.d.sync += [code.eq(Mux(bus_error, ErrorCode.BUS_ERROR, front.error)),
                                 running.eq(0)]
                    m.next = "DRAIN"
                with m.Elif(take & step.last):
                    m.d.sync += [self.done.eq(1), running.eq(0)]
                    m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += [self.busy.eq(1), draining.eq(1), stopped.eq(1)]
                with m.If(~front.bursts.valid & (outstanding == 0)):
                    m.d.sync += self.error.eq(code)
                    m.next = "ERROR"
            with m.State("ERROR"):
                m.d.comb += stopped.eq(1)
        return m
