"""Execute engine: MATMUL through the array into the accumulator, and SOFTMAX on the SFU."""
from amaranth.hdl import C, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arch import pending_depth
from ..isa import ErrorCode, Header, MatmulInstruction, Opcode, RowScale, SoftmaxInstruction
from .array import SystolicArray
from .engine import engine_members
from .pipeline import pipeline_register
from .softmax import SoftmaxUnit

__all__ = ["ExecuteEngine", "EXECUTE_INSTRUCTION", "accumulator_row", "probability_row",
           "scratchpad_row"]

EXECUTE_INSTRUCTION = data.UnionLayout({
    "header": Header,
    "matmul": MatmulInstruction,
    "softmax": SoftmaxInstruction,
})
"""An execute-engine instruction: a ``MatmulInstruction`` or a ``SoftmaxInstruction`` by its
opcode (the header they begin with is ``header``)."""

_QUEUE_DEPTH = 4
"""MATMUL instructions in flight: weights loading, streaming, and draining from the array (no
more than the controller dispatches ahead of their dones, `arch.pending_depth`)."""


def scratchpad_row(config):
    return data.ArrayLayout(signed(config.data_width), config.lanes)


def accumulator_row(config):
    return data.ArrayLayout(signed(config.acc_width), config.cols)


def probability_row(config):
    return data.ArrayLayout(unsigned(config.data_width), config.lanes)


class _RowFeeder(wiring.Component):
    """Reads runs of rows through synchronous read ports into a stream.

    Each ``run`` (first row, count, and with two ports a source, with ``strided`` a
    ``stride_log2``) becomes ``count`` rows on ``rows``, ``1 << stride_log2`` apart, read
    through ``reads.source<source>``; the run's last row carries ``last`` and each row its
    ``source``; with ``gaps`` a run's ``gap`` goes with its first row. One run waits behind the
    current one, so runs follow each other without a gap.
    With ``buffered`` a 3-deep FIFO absorbs the read latency so the output can stall (the
    consumer's ``ready`` reaches no block RAM); without, the row on ``rows`` is the read port's
    output, which holds while the next read waits for ``ready`` (`CoreConfig.buffered_feeders`).
    A row is as wide as the widest port's address, a count ``count_width`` bits.
    """

    def __init__(self, width, ports, *, count_width, strided=False, gaps=False, buffered=True):
        if not 1 <= len(ports) <= 2:
            raise ValueError(f"ports has {len(ports)} entries: allowed 1 or 2")
        if not isinstance(count_width, int) or count_width < 1:
            raise ValueError(f"count_width={count_width!r} is invalid: allowed an integer >= 1")
        self._ports, self._strided, self._gaps = ports, strided, gaps
        self._buffered = buffered
        gap = {"gap": 1} if gaps else {}
        super().__init__({
            "run": In(stream.Signature(data.StructLayout({
                "row": max(port.addr_width for port in ports), "count": count_width,
                **({"source": 1} if len(ports) > 1 else {}),
                **({"stride_log2": 4} if strided else {}), **gap}))),
            "reads": In(wiring.Signature({f"source{i}": Out(port)
                                          for i, port in enumerate(ports)})),
            "rows": Out(stream.Signature(data.StructLayout({"data": width, "last": 1,
                                                            "source": 1, **gap}))),
        })

    def elaborate(self, platform):
        m = Module()
        layout = self.rows.payload.shape()
        row = Signal.like(self.run.payload.row)
        remaining = Signal.like(self.run.payload.count)
        source = Signal()
        stride_log2 = Signal(4)
        queued = Signal.like(self.run.payload)
        queued_valid = Signal()
        # The row read in the cycle before (`in_flight`), and what goes with it.
        in_flight = Signal()
        in_flight_last = Signal()
        in_flight_source = Signal()
        issue = Signal()
        written = Signal(layout)
        reads = [getattr(self.reads, f"source{i}") for i in range(len(self._ports))]
        for i, read in enumerate(reads):
            m.d.comb += [read.addr.eq(row), read.en.eq(issue & (source == i))]
            with m.If(in_flight_source == i):
                m.d.comb += written.data.eq(read.data.as_value())
        m.d.comb += [written.last.eq(in_flight_last), written.source.eq(in_flight_source),
                     self.run.ready.eq(~queued_valid)]
        if self._buffered:
            m.submodules.fifo = fifo = SyncFIFO(width=layout.size, depth=3)
            advance = C(1)  # the rows read go into the FIFO
            m.d.comb += [
                issue.eq((remaining != 0) & (fifo.w_level + in_flight < fifo.depth)),
                fifo.w_stream.payload.eq(written),
                fifo.w_stream.valid.eq(in_flight),
            ]
            wiring.connect(m, fifo.r_stream, wiring.flipped(self.rows))
        else:  # the row read stays on the port's output until it is taken
            advance = ~in_flight | self.rows.ready
            m.d.comb += [
                issue.eq((remaining != 0) & advance),
                self.rows.payload.eq(written),
                self.rows.valid.eq(in_flight),
            ]
        with m.If(advance):
            m.d.sync += [in_flight.eq(issue), in_flight_last.eq(issue & (remaining == 1)),
                         in_flight_source.eq(source)]
        with m.If(self.run.valid & self.run.ready):
            m.d.sync += [queued.eq(self.run.payload), queued_valid.eq(1)]
        start = queued_valid & ((remaining == 0) | (issue & (remaining == 1)))
        with m.If(start):
            m.d.sync += [row.eq(queued.row), remaining.eq(queued.count), queued_valid.eq(0)]
            if len(reads) > 1:
                m.d.sync += source.eq(queued.source)
            if self._strided:
                m.d.sync += stride_log2.eq(queued.stride_log2)
        with m.Elif(issue):
            m.d.sync += [row.eq(row + (Const(1, len(row)) << stride_log2)),
                         remaining.eq(remaining - 1)]
        if self._gaps:
            gap = Signal()           # the current run's
            first = Signal()         # the next row issued is its first
            in_flight_gap = Signal()
            with m.If(start):
                m.d.sync += [gap.eq(queued.gap), first.eq(1)]
            with m.Elif(issue):
                m.d.sync += first.eq(0)
            with m.If(advance):
                m.d.sync += in_flight_gap.eq(issue & first & gap)
            m.d.comb += written.gap.eq(in_flight_gap)
        return m


class ExecuteEngine(wiring.Component):
    """Runs MATMUL instructions: ``acc[acc_row + i] (+)= A[act_row + (i << act_stride_log2)]
    [:rows] @ W`` for each of ``count`` activation vectors, where W is the ``rows`` x ``cols``
    tile at ``weight_row`` and A is the scratchpad (int8) or, with ``act_probabilities``, the
    probability buffer (uint8).

    Each instruction is registered when taken, checked from that register over the next two
    cycles (a SOFTMAX one) and dispatched from registers after that (no path from the
    controller's queue to the checks).
    MATMULs overlap: the next one is taken while the current one streams, so its weight tile
    shifts into the array meanwhile and its vectors follow without a gap; an
    instruction is done (``done`` pulse, in order) when its last result is in the accumulator.
    A SOFTMAX waits for the MATMULs before it, then runs on the `SoftmaxUnit`, which owns the
    accumulator ports and the probability buffer's write port until it is done.
    """

    def __init__(self, config):
        self.config = config
        sp_addr = ceil_log2(config.scratchpad_rows)
        acc_addr = ceil_log2(config.accumulator_rows)
        prob_addr = ceil_log2(config.probability_rows)
        probabilities = {
            "prob_read": In(memory.ReadPort.Signature(addr_width=prob_addr,
                                                       shape=probability_row(config))),
            "prob_write": In(memory.WritePort.Signature(addr_width=prob_addr,
                                                         shape=probability_row(config))),
            "scale_write": In(memory.WritePort.Signature(addr_width=prob_addr, shape=RowScale)),
        } if config.softmax else {}
        super().__init__({
            **engine_members(EXECUTE_INSTRUCTION),
            "vector": Out(1),  # an activation vector entered the array (rows * cols MACs)
            "weight_read": In(memory.ReadPort.Signature(addr_width=sp_addr,
                                                         shape=scratchpad_row(config))),
            "act_read": In(memory.ReadPort.Signature(addr_width=sp_addr,
                                                      shape=scratchpad_row(config))),
            **probabilities,
            "acc_read": In(memory.ReadPort.Signature(addr_width=acc_addr,
                                                      shape=accumulator_row(config))),
            "acc_write": In(memory.WritePort.Signature(addr_width=acc_addr,
                                                        shape=accumulator_row(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.array = array = SystolicArray(cfg)
        # A MATMUL's count is at most the accumulator's rows (its range check).
        count_width = ceil_log2(cfg.accumulator_rows + 1)
        m.submodules.weights = weights = _RowFeeder(scratchpad_row(cfg).size,
                                                    [self.weight_read.signature.flip()],
                                                    count_width=ceil_log2(cfg.rows + 1),
                                                    buffered=cfg.buffered_feeders)
        act_sources = [self.act_read] + ([self.prob_read] if cfg.softmax else [])
        m.submodules.acts = acts = _RowFeeder(scratchpad_row(cfg).size,
                                              [port.signature.flip() for port in act_sources],
                                              count_width=count_width, strided=True, gaps=True,
                                              buffered=cfg.buffered_feeders)
        wiring.connect(m, wiring.flipped(self.weight_read), weights.reads.source0)
        for i, port in enumerate(act_sources):
            wiring.connect(m, wiring.flipped(port), getattr(acts.reads, f"source{i}"))
        if cfg.softmax:
            m.submodules.softmax = softmax = SoftmaxUnit(cfg)
            wiring.connect(m, wiring.flipped(self.prob_write), softmax.p_write)
            wiring.connect(m, wiring.flipped(self.scale_write), softmax.scale_write)
        else:  # a unit that is never started: its outputs stay at their reset values
            softmax = SoftmaxUnit.signature_of(cfg).create()

        # Result bookkeeping: one entry per accepted MATMUL, consumed as results arrive.
        target = data.StructLayout({"acc_row": len(self.acc_write.addr), "count": count_width,
                                    "accumulate": 1})
        m.submodules.targets = targets = SyncFIFO(width=target.size,
                                                  depth=min(_QUEUE_DEPTH, pending_depth(cfg)))

        pushed = data.View(target, targets.w_data)
        # Registered decode: an instruction is taken from the queue into `ins`, checked there
        # over the next two cycles (the span of its activation rows registered in the first,
        # the verdict in `bad` in the second: the routed 8x8's critical path ran through the
        # shift and both adds in one, 16.7 ns), and dispatched from registers the cycle after;
        # the next one is taken in that same cycle.
        # Without `CoreConfig.execute_prefetch` `ins` is the queue's slot, held until dispatch.
        prefetch = cfg.execute_prefetch
        ins = Signal(EXECUTE_INSTRUCTION) if prefetch else self.instr.payload
        held = Signal()     # `ins` holds an instruction
        spanned = Signal()  # ... and `act_span` is its span
        checked = Signal()  # ... and `bad` is its verdict
        bad = Signal(ErrorCode)
        instr = ins.matmul
        is_softmax = ins.header.opcode == Opcode.SOFTMAX
        act_rows = Mux(instr.act_probabilities, cfg.probability_rows, cfg.scratchpad_rows)
        # The span, saturated where it passes every row: the check tells no larger one apart.
        span = (instr.count - 1) << instr.act_stride_log2
        span_bits = ceil_log2(max(cfg.scratchpad_rows, cfg.probability_rows))
        act_span = Signal(span_bits + 1)
        verdict = Signal(ErrorCode)
        with m.If(instr.count == 0):
            m.d.comb += verdict.eq(ErrorCode.BAD_EXTENT)
        with m.Elif((instr.weight_row + cfg.rows > cfg.scratchpad_rows)
                    | (instr.act_row + act_span >= act_rows)
                    | (instr.acc_row + instr.count > cfg.accumulator_rows)):
            m.d.comb += verdict.eq(ErrorCode.SRAM_RANGE)
        if not cfg.softmax:
            with m.Elif(instr.act_probabilities):  # no probability buffer
                m.d.comb += verdict.eq(ErrorCode.UNKNOWN_OPCODE)
        with m.If(held & ~checked):
            with m.If(is_softmax):  # it goes on unchecked: the softmax unit checks its own
                m.d.sync += [bad.eq(ErrorCode.NONE), checked.eq(1)]
            with m.Elif(~spanned):
                m.d.sync += [act_span.eq(Mux(span[span_bits:].any(), 1 << span_bits,
                                             span[:span_bits])),
                             spanned.eq(1)]
            with m.Else():
                m.d.sync += [bad.eq(verdict), checked.eq(1)]

        # The array and the softmax unit take turns on the accumulator.
        result_valid = Signal()  # a result on its way to the accumulator
        matmul_idle = ~targets.r_rdy & ~result_valid
        launchable = held & checked & (bad == ErrorCode.NONE) & (self.error == ErrorCode.NONE)
        dispatch = Signal()
        accept = Signal()  # a MATMUL goes to the feeders
        softmax_failed = softmax.error != ErrorCode.NONE  # the engine's error a cycle later
        m.d.comb += [
            softmax.instr.payload.eq(ins.softmax),
            # A SOFTMAX is taken while the MATMULs before it finish (its checks run then) and
            # starts once they are done.
            softmax.instr.valid.eq(launchable & is_softmax),
            softmax.go.eq(matmul_idle),
            dispatch.eq(launchable & Mux(
                is_softmax, softmax.instr.ready,
                weights.run.ready & acts.run.ready & targets.w_rdy & ~softmax.busy)),
            accept.eq(dispatch & ~is_softmax),
            # Nothing is taken while a SOFTMAX is here or runs: its error blames it. Nor in
            # the cycle the unit raises it (the engine's error follows a cycle later): a
            # held instruction would keep the engine busy forever, and the controller, which
            # waits for every engine to be idle after an error, with it.
            self.instr.ready.eq((self.error == ErrorCode.NONE) & ~softmax_failed
                                & ~softmax.busy & (~held | (accept if prefetch else 0))),
        ]
        if not prefetch:
            m.d.comb += self.holding.eq(held)
        with m.If(dispatch):
            m.d.sync += held.eq(0)
        with m.If(self.instr.valid & self.instr.ready):
            m.d.sync += [held.eq(1), spanned.eq(0), checked.eq(0)]
            if prefetch:
                m.d.sync += ins.eq(self.instr.payload)
        # A row is written two cycles after its result comes (one without
        # `CoreConfig.registered_accumulate`, where the wait below is a cycle longer than it
        # needs; the accumulator's execute port is not transparent: no bypass of a row).
        # So a MATMUL that accumulates into the last
        # row the one before it wrote (its first row, or its second) waits two cycles after
        # that one's last vector: its results then read those rows after they are written.
        # The vector before that last one is the same MATMUL's (the row before its last, the
        # second case), or one at least three cycles before the MATMUL's first vector (after
        # a MATMUL of one vector the next weight tile is taken no sooner: `min_tile_length`).
        last_row = Signal.like(self.acc_write.addr)
        with m.If(softmax.error != ErrorCode.NONE):
            m.d.sync += self.error.eq(softmax.error)
        with m.Elif(held & checked & (bad != ErrorCode.NONE)):
            m.d.sync += [self.error.eq(bad), held.eq(0)]
        with m.Elif(accept):
            if cfg.softmax:
                m.d.comb += acts.run.payload.source.eq(instr.act_probabilities)
            m.d.sync += last_row.eq(instr.acc_row + instr.count - 1)
            m.d.comb += [
                weights.run.valid.eq(1),
                weights.run.payload.row.eq(instr.weight_row),
                weights.run.payload.count.eq(cfg.rows),
                acts.run.valid.eq(1),
                acts.run.payload.row.eq(instr.act_row),
                acts.run.payload.count.eq(instr.count),
                acts.run.payload.stride_log2.eq(instr.act_stride_log2),
                acts.run.payload.gap.eq(instr.header.accumulate & (
                    (instr.acc_row == last_row) | (instr.acc_row + 1 == last_row))),
                targets.w_en.eq(1),
                pushed.acc_row.eq(instr.acc_row),
                pushed.count.eq(instr.count),
                pushed.accumulate.eq(instr.header.accumulate),
            ]

        took = Signal(2)  # the array took a vector one (bit 0) or two (bit 1) cycles before
        hold = acts.rows.payload.gap & took.any()
        m.d.sync += took.eq(Cat(self.vector, took[0]))
        m.d.comb += [
            array.weights.valid.eq(weights.rows.valid),
            weights.rows.ready.eq(array.weights.ready),
            array.acts.valid.eq(acts.rows.valid & ~hold),
            acts.rows.ready.eq(array.acts.ready & ~hold),
            array.acts.payload.last.eq(acts.rows.payload.last),
            self.vector.eq(array.acts.valid & array.acts.ready),
        ]
        weight_data = data.View(scratchpad_row(cfg), weights.rows.payload.data)
        for lane in range(cfg.cols):
            m.d.comb += array.weights.payload[lane].eq(weight_data[lane])
        act_bytes = acts.rows.payload.data
        for lane in range(cfg.rows):
            byte = act_bytes[lane * 8:(lane + 1) * 8]
            m.d.comb += array.acts.payload.data[lane].eq(
                Cat(byte, byte[7] & ~acts.rows.payload.source) if cfg.softmax else byte)

        # Results: read the old row (only to accumulate) as the result comes, register the
        # row read beside the result, add or overwrite two cycles later (the block RAM's output
        # through the adder into the write was the routed 8x8's critical path, 15.6 ns); or
        # without `CoreConfig.registered_accumulate` read the row a cycle before the result
        # comes (`SystolicArray.ahead`) and add or overwrite as it comes, from the array's
        # output registers: no register of the result. A row is never read before it is
        # written (see ``last_row``).
        current = data.View(target, targets.r_data)
        index = Signal(count_width)
        arrived = data.StructLayout({"valid": 1, "last": 1, "accumulate": 1,
                                     "row": len(self.acc_write.addr)})
        result = Signal(arrived)  # a cycle after the row is read
        reading = array.results.valid if cfg.registered_accumulate else array.ahead
        last_of_instr = index + 1 == current.count
        m.d.sync += [
            result.row.eq(current.acc_row + index),
            result.valid.eq(reading),
            result.accumulate.eq(current.accumulate),
            result.last.eq(reading & last_of_instr),
        ]
        if cfg.registered_accumulate:
            result_data = pipeline_register(m, array.results.payload.data, "result_data")
            adding = pipeline_register(m, result, "adding")  # ... and with the row read
            adding_data = pipeline_register(m, result_data, "adding_data")
            old_row = pipeline_register(m, self.acc_read.data, "old_row")
        else:
            adding, adding_data, old_row = result, array.results.payload.data, self.acc_read.data
        m.d.comb += [result_valid.eq(result.valid | adding.valid)]
        with m.If(reading):
            m.d.sync += index.eq(Mux(last_of_instr, 0, index + 1))
            m.d.comb += targets.r_en.eq(last_of_instr)
        # A SOFTMAX taken while MATMULs still write their results gets the ports after them:
        # it starts (`running`) once they are done, and no MATMUL is taken until it is done, so
        # the ports' select is a register of the unit (from its checks through the MATMULs'
        # idle test into the ports' 300 multiplexers was the routed 8x8's critical path at seed
        # 1, 22.2 ns).
        with m.If(softmax.running):
            m.d.comb += [
                self.acc_read.addr.eq(softmax.acc_read.addr),
                self.acc_read.en.eq(softmax.acc_read.en),
                self.acc_write.addr.eq(softmax.acc_write.addr),
                self.acc_write.en.eq(softmax.acc_write.en),
                self.acc_write.data.eq(softmax.acc_write.data),
            ]
        with m.Else():
            m.d.comb += [
                self.acc_read.addr.eq(current.acc_row + index),
                self.acc_read.en.eq(reading & current.accumulate),
                self.acc_write.addr.eq(adding.row),
                self.acc_write.en.eq(adding.valid),
            ]
            for lane in range(cfg.cols):
                m.d.comb += self.acc_write.data[lane].eq(
                    Mux(adding.accumulate, old_row[lane] + adding_data[lane], adding_data[lane]))
        m.d.comb += [
            softmax.acc_read.data.eq(self.acc_read.data),
            self.done.eq(adding.last | softmax.done),
            # Busy until the softmax unit's error is the engine's: the controller takes an
            # idle engine without an error as done with its work (a program ending in a
            # failing SOFTMAX ended in done, found by the fuzzer).
            self.busy.eq(held | targets.r_rdy | result_valid | softmax.busy
                         | softmax_failed & (self.error == ErrorCode.NONE)),
            self.progress.eq(accept | result_valid | self.vector | softmax.progress),
        ]
        return m
