"""Execute engine: MATMUL instructions from the scratchpad through the array into the accumulator."""
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..isa import ErrorCode, MatmulInstruction
from .array import SystolicArray
from .engine import engine_members

__all__ = ["ExecuteEngine", "scratchpad_row", "accumulator_row"]

_QUEUE_DEPTH = 4
"""MATMUL instructions in flight: weights loading, streaming, and draining from the array."""


def scratchpad_row(config):
    return data.ArrayLayout(signed(config.data_width), config.lanes)


def accumulator_row(config):
    return data.ArrayLayout(signed(config.acc_width), config.cols)


class _RowFeeder(wiring.Component):
    """Reads runs of scratchpad rows through a synchronous read port into a stream.

    Each ``run`` (first row, count, flag) becomes ``count`` rows on ``rows``; the run's last row
    carries ``last``. A small FIFO absorbs the read latency so the output can stall.
    """

    def __init__(self, config):
        self._config = config
        self._addr_width = ceil_log2(config.scratchpad_rows)
        super().__init__({
            "run": In(stream.Signature(data.StructLayout({"row": 16, "count": 16}))),
            "read": In(memory.ReadPort.Signature(addr_width=self._addr_width,
                                                  shape=scratchpad_row(config))),
            "rows": Out(stream.Signature(data.StructLayout({"data": scratchpad_row(config),
                                                            "last": 1}))),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        layout = self.rows.payload.shape()
        m.submodules.fifo = fifo = SyncFIFO(width=layout.size, depth=3)
        written = data.View(layout, fifo.w_data)
        row = Signal(16)
        remaining = Signal(16)
        in_flight = Signal()
        in_flight_last = Signal()
        issue = Signal()
        m.d.comb += [
            self.run.ready.eq(remaining == 0),
            issue.eq((remaining != 0) & (fifo.w_level + in_flight < fifo.depth)),
            self.read.addr.eq(row),
            self.read.en.eq(issue),
            fifo.w_en.eq(in_flight),
            written.data.eq(self.read.data),
            written.last.eq(in_flight_last),
            self.rows.payload.eq(fifo.r_data),
            self.rows.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.rows.ready),
            self.idle.eq((remaining == 0) & ~in_flight & ~fifo.r_rdy),
        ]
        m.d.sync += [in_flight.eq(issue), in_flight_last.eq(issue & (remaining == 1))]
        with m.If(self.run.valid & self.run.ready):
            m.d.sync += [row.eq(self.run.payload.row), remaining.eq(self.run.payload.count)]
        with m.Elif(issue):
            m.d.sync += [row.eq(row + 1), remaining.eq(remaining - 1)]
        return m


class ExecuteEngine(wiring.Component):
    """Runs MATMUL instructions: ``acc[acc_row + i] (+)= sp[act_row + i][:rows] @ W`` for each of
    ``count`` activation vectors, where W is the ``rows`` x ``cols`` tile at ``weight_row``.

    Instructions overlap: the next weight tile loads while the current one streams, and an
    instruction is done (``done`` pulse, in order) when its last result is in the accumulator.
    """

    def __init__(self, config):
        self.config = config
        sp_addr = ceil_log2(config.scratchpad_rows)
        acc_addr = ceil_log2(config.accumulator_rows)
        super().__init__({
            **engine_members(MatmulInstruction),
            "vector": Out(1),  # an activation vector entered the array (rows * cols MACs)
            "weight_read": In(memory.ReadPort.Signature(addr_width=sp_addr,
                                                         shape=scratchpad_row(config))),
            "act_read": In(memory.ReadPort.Signature(addr_width=sp_addr,
                                                      shape=scratchpad_row(config))),
            "acc_read": In(memory.ReadPort.Signature(addr_width=acc_addr,
                                                      shape=accumulator_row(config))),
            "acc_write": In(memory.WritePort.Signature(addr_width=acc_addr,
                                                        shape=accumulator_row(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.array = array = SystolicArray(cfg)
        m.submodules.weights = weights = _RowFeeder(cfg)
        m.submodules.acts = acts = _RowFeeder(cfg)
        wiring.connect(m, wiring.flipped(self.weight_read), weights.read)
        wiring.connect(m, wiring.flipped(self.act_read), acts.read)

        # Result bookkeeping: one entry per accepted instruction, consumed as results arrive.
        target = data.StructLayout({"acc_row": 16, "count": 16, "accumulate": 1})
        m.submodules.targets = targets = SyncFIFO(width=target.size, depth=_QUEUE_DEPTH)

        pushed = data.View(target, targets.w_data)
        instr = self.instr.payload
        bad = Signal(ErrorCode)
        with m.If(instr.count == 0):
            m.d.comb += bad.eq(ErrorCode.BAD_EXTENT)
        with m.Elif((instr.weight_row + cfg.rows > cfg.scratchpad_rows)
                    | (instr.act_row + instr.count > cfg.scratchpad_rows)
                    | (instr.acc_row + instr.count > cfg.accumulator_rows)):
            m.d.comb += bad.eq(ErrorCode.SRAM_RANGE)

        accept = Signal()
        m.d.comb += [
            self.instr.ready.eq((self.error == ErrorCode.NONE) & weights.run.ready
                                & acts.run.ready & targets.w_rdy),
            accept.eq(self.instr.valid & self.instr.ready),
        ]
        with m.If(accept & (bad != ErrorCode.NONE)):
            m.d.sync += self.error.eq(bad)
        with m.Elif(accept):
            m.d.comb += [
                weights.run.valid.eq(1),
                weights.run.payload.row.eq(instr.weight_row),
                weights.run.payload.count.eq(cfg.rows),
                acts.run.valid.eq(1),
                acts.run.payload.row.eq(instr.act_row),
                acts.run.payload.count.eq(instr.count),
                targets.w_en.eq(1),
                pushed.acc_row.eq(instr.acc_row),
                pushed.count.eq(instr.count),
                pushed.accumulate.eq(instr.header.accumulate),
            ]

        m.d.comb += [
            array.weights.valid.eq(weights.rows.valid),
            weights.rows.ready.eq(array.weights.ready),
            array.acts.valid.eq(acts.rows.valid),
            acts.rows.ready.eq(array.acts.ready),
            array.acts.payload.last.eq(acts.rows.payload.last),
            self.vector.eq(array.acts.valid & array.acts.ready),
        ]
        for lane in range(cfg.cols):
            m.d.comb += array.weights.payload[lane].eq(weights.rows.payload.data[lane])
        for lane in range(cfg.rows):
            m.d.comb += array.acts.payload.data[lane].eq(acts.rows.payload.data[lane])

        # Results: read the old row (transparent, so back-to-back updates of a row see each
        # other), add or overwrite one cycle later.
        current = data.View(target, targets.r_data)
        index = Signal(16)
        result = Signal.like(array.results.payload.data)
        result_row = Signal(16)
        result_valid = Signal()
        result_accumulate = Signal()
        result_last = Signal()
        last_of_instr = index + 1 == current.count
        m.d.comb += [
            self.acc_read.addr.eq(current.acc_row + index),
            self.acc_read.en.eq(array.results.valid),
        ]
        m.d.sync += [
            result.eq(array.results.payload.data),
            result_row.eq(current.acc_row + index),
            result_valid.eq(array.results.valid),
            result_accumulate.eq(current.accumulate),
            result_last.eq(array.results.valid & last_of_instr),
        ]
        with m.If(array.results.valid):
            m.d.sync += index.eq(Mux(last_of_instr, 0, index + 1))
            m.d.comb += targets.r_en.eq(last_of_instr)
        m.d.comb += [
            self.acc_write.addr.eq(result_row),
            self.acc_write.en.eq(result_valid),
        ]
        for lane in range(cfg.cols):
            m.d.comb += self.acc_write.data[lane].eq(
                Mux(result_accumulate, self.acc_read.data[lane] + result[lane], result[lane]))
        m.d.comb += [
            self.done.eq(result_last),
            self.busy.eq(targets.r_rdy | result_valid),
            self.progress.eq(accept | result_valid | self.vector),
        ]
        return m
