"""Softmax special-function unit (SFU): the online-softmax steps of flash attention.

Numerics (``sim/softmax_model.py`` is the bit-exact model):

- Scores s (int32) go to the log2 domain in Q.10 (FRAC = 10): ``x = (s * scale_multiplier) >>
  scale_shift`` (floor).
- ``exp2q(d)`` ~ ONE * 2**(-d / 1024), ONE = 1 << 15, for d >= 0: n = d >> 10, k = (d >> 6) & 15,
  f = d & 63, ``e = Y[k] + ((Y[k+1] - Y[k]) * f >> 6)`` with ``Y[k] = round(ONE * 2**(-k/16))``,
  ``exp2q = (e + ((1 << n) >> 1)) >> n``, 0 for n >= 16. Every ``>>`` is a floor shift.
- State per query: m (signed 48-bit Q.10, or -inf) and l (unsigned 48-bit, LF = 20 fractional
  bits, saturating at 2**48 - 1).
- BLOCK, per query i, over its valid keys (``k < keys`` and, with ``causal``, ``k <= i +
  causal_offset``): ``m' = max(m, max x)``; ``alpha = exp2q(m - m')`` (0 if m = -inf);
  ``p = min(255, (exp2q(m' - x) + 64) >> 7)`` (0 if masked) to lanes 0..cols-1 of the
  probability buffer (0 in the other lanes);
  ``l' = min(2**48 - 1, ((l * alpha + 2**14) >> 15) + (sum(p) << LF))``; unless ``first``
  (which starts from m = -inf, l = 0), ``O = (O * alpha + 2**14) >> 15``.
- NORMALIZE: with b = bitlen(l), k = 32 - b, ``mant = l << k`` (``l >> -k`` if k < 0),
  ``r = 2**47 // mant``, sh = 19 - k: ``O = sat_int32((O * r + 2**(sh-1)) >> sh)`` (``O * r <<
  -sh`` if sh < 1), i.e. ``O * 2**(OUT_FRAC + LF) / l``: the attention output in units of V / 256
  (OUT_FRAC = 8). O = 0 where l = 0. BLOCK never leaves 0 < l < 255 << LF.
- Errors, checked at accept (a bad instruction changes nothing): mode not BLOCK or NORMALIZE:
  UNKNOWN_OPCODE; count, o_tiles or (BLOCK) tiles 0: BAD_EXTENT; rows past the accumulator,
  probability buffer or state: SRAM_RANGE (NORMALIZE ignores tiles, keys, score_row, p_row).

Accuracy (measured by ``tests/test_softmax_pysim.py``): exp2q is within 7.6 LSB of
ONE * 2**(-d/1024) for every d, and within 2.5e-4 relative for d < 1024; r is within 2**-15
relative of 2**47 / mant. End to end (flash attention in blocks of 4..32 keys, up to 200 keys,
scores spanning 0.5..100 in log2, int8 V), NORMALIZE / 256 is within 0.98 LSB of V of float
``softmax(x) @ V``: the 8-bit P dominates.

Timing: the max pass of a query (``tiles`` score rows) runs up to 8 queries ahead of the exp
pass (``tiles`` rows, writing P) and O rescale (``o_tiles`` rows; none with ``first``) of
earlier queries, so the accumulator read port is busy every cycle: a BLOCK takes
``count * (2 * tiles + o_tiles) + ~10`` cycles (22 for one query). NORMALIZE divides two
quotient bits per cycle, overlapped with the O scaling of the previous query:
``count * max(o_tiles, 10) + ~10`` cycles.
"""
from amaranth.hdl import Array, C, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In
from amaranth.utils import ceil_log2

from ..arch import SOFTMAX_OUT_FRAC as OUT_FRAC
from ..config import CoreConfig
from ..isa import ErrorCode, SoftmaxInstruction, SoftmaxMode
from .engine import engine_members

__all__ = ["SoftmaxUnit", "FRAC", "ONE", "LF", "OUT_FRAC", "EXP_TABLE", "L_MAX", "STATE"]

FRAC = 10
ONE = 1 << 15
LF = 20
EXP_TABLE = tuple(round(ONE * 2 ** (-k / 16)) for k in range(17))
L_MAX = (1 << 48) - 1

STATE = data.StructLayout({"m": signed(48), "m_valid": 1, "l": 48})
"""One query's softmax state."""

_JOBS = 8
"""Queries the max pass may run ahead of the exp pass."""

_MAXIMUM = data.StructLayout({"valid": 1, "x": signed(48)})

_JOB = data.StructLayout({
    "query": 16,
    "m": _MAXIMUM,       # BLOCK: the new maximum
    "l": 48,             # BLOCK: l * alpha, rounded
    "mult": 17,          # O row scale: alpha (BLOCK) or r (NORMALIZE) ...
    "shift": signed(7),  # ... and its rounding right shift (left if negative)
})


class _Kind(enum.Enum, shape=2):
    MAX = 0    # score row, max pass
    EXP = 1    # score row, exp pass: a P row
    SCALE = 2  # O row: scaled and written back


def _op_layout(config):
    """A row operation on its way down the pipeline."""
    return data.StructLayout({
        "valid": 1,
        "kind": _Kind,
        "first": 1,
        "last": 1,
        "lanes": range(config.cols + 1),  # MAX, EXP: lanes of valid keys
        "mult": 17,
        "shift": signed(7),
        "round": 1,
        "addr": 16,                       # EXP: P row; SCALE: O row
        "job": _JOB,                      # EXP: query, m, l
    })


def _delays(m, value, cycles):
    """``value`` 1, 2, ... ``cycles`` cycles later."""
    stages = []
    for _ in range(cycles):
        reg = Signal.like(value)
        m.d.sync += reg.eq(value)
        stages.append(value := reg)
    return stages


def _reduce(m, items, combine):
    """Tree reduction, registered after every two levels and at the end: (result, latency)."""
    latency = level = 0
    while len(items) > 1:
        items = [combine(*items[i:i + 2]) if i + 1 < len(items) else items[i]
                 for i in range(0, len(items), 2)]
        level += 1
        if level % 2 == 0 and len(items) > 1:
            items = [_delays(m, item, 1)[0] for item in items]
            latency += 1
    return _delays(m, items[0], 1)[0], latency + 1


def _larger(m, a, b):
    out = Signal(_MAXIMUM)
    m.d.comb += out.eq(Mux(b.valid & (~a.valid | (b.x > a.x)), b, a))
    return out


def _exp2q(m, d, zero):
    """exp2q(d) two cycles later, for d < 2**14; 0 with ``zero``."""
    table = Array(C(y, 16) for y in EXP_TABLE[:16])
    slope = Array(C(b - a, signed(12)) for a, b in zip(EXP_TABLE, EXP_TABLE[1:]))
    k = d[6:10]
    e, n, z = Signal(16), Signal(4), Signal()
    m.d.sync += [e.eq(table[k] + ((slope[k] * d[:6]) >> 6)), n.eq(d[10:14]), z.eq(zero)]
    out = Signal(16)
    m.d.sync += out.eq(Mux(z, 0, (e + (C(1, 16) << n)[1:]) >> n))
    return out


class SoftmaxUnit(wiring.Component):
    """Runs SOFTMAX instructions on the accumulator (scores, O) and the probability buffer.

    The per-query state lives in ``state`` (``probability_rows`` entries of ``STATE``). The
    score rows and O rows of an instruction must not overlap.
    """

    def __init__(self, config):
        if not isinstance(config, CoreConfig):
            raise ValueError(f"config must be a CoreConfig, not {config!r}")
        self.config = config
        self.state = memory.Memory(shape=STATE, depth=config.probability_rows, init=[])
        self._state_read = self.state.read_port()
        self._state_write = self.state.write_port()
        super().__init__(self.signature_of(config))

    @staticmethod
    def signature_of(config):
        """The unit's signature for ``config``."""
        acc_addr = ceil_log2(config.accumulator_rows)
        acc_row = data.ArrayLayout(signed(32), config.cols)
        return wiring.Signature({
            **engine_members(SoftmaxInstruction),
            "acc_read": In(memory.ReadPort.Signature(addr_width=acc_addr, shape=acc_row)),
            "acc_write": In(memory.WritePort.Signature(addr_width=acc_addr, shape=acc_row)),
            "p_write": In(memory.WritePort.Signature(
                addr_width=ceil_log2(config.probability_rows),
                shape=data.ArrayLayout(unsigned(8), config.lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        cols = cfg.cols
        m.submodules.state = self.state
        m.submodules.jobs = jobs = SyncFIFO(width=_JOB.size, depth=_JOBS)
        state_read, state_write = self._state_read, self._state_write
        m.d.comb += state_read.en.eq(0)  # a read port's enable is 1 unless driven

        # Accept and check an instruction; it stays in `ins` until done.
        ins = Signal(SoftmaxInstruction)
        active = Signal()
        block = ins.mode == SoftmaxMode.BLOCK
        instr = self.instr.payload
        is_block = instr.mode == SoftmaxMode.BLOCK
        bad = Signal(ErrorCode)
        with m.If((instr.mode != SoftmaxMode.BLOCK) & (instr.mode != SoftmaxMode.NORMALIZE)):
            m.d.comb += bad.eq(ErrorCode.UNKNOWN_OPCODE)
        with m.Elif((instr.count == 0) | (instr.o_tiles == 0) | (is_block & (instr.tiles == 0))):
            m.d.comb += bad.eq(ErrorCode.BAD_EXTENT)
        with m.Elif((instr.o_row + instr.o_tiles * instr.count > cfg.accumulator_rows)
                    | (instr.state_row + instr.count > cfg.probability_rows)
                    | (is_block & (
                        (instr.score_row + instr.tiles * instr.count > cfg.accumulator_rows)
                        | (instr.p_row + instr.tiles * instr.count > cfg.probability_rows)))):
            m.d.comb += bad.eq(ErrorCode.SRAM_RANGE)
        accept = Signal()
        start = Signal()
        m.d.comb += [
            self.instr.ready.eq((self.error == ErrorCode.NONE) & ~active),
            accept.eq(self.instr.valid & self.instr.ready),
            self.busy.eq(active),
        ]
        with m.If(accept & (bad != ErrorCode.NONE)):
            m.d.sync += self.error.eq(bad)
        with m.Elif(accept):
            m.d.sync += [ins.eq(instr), active.eq(1)]
            m.d.comb += start.eq(1)

        def valid_lanes(query, key):
            limit = Mux(ins.causal & (query + ins.causal_offset + 1 < ins.keys),
                        query + ins.causal_offset + 1, ins.keys)
            rest = limit - key
            return Mux(rest < 0, 0, Mux(rest > cols, cols, rest))

        # Two issuers share the read port: the front runs the max pass (BLOCK) or the
        # reciprocal (NORMALIZE) of each query and queues a job; the back takes jobs and
        # issues the exp pass and the O rows. The front has priority but runs at most _JOBS
        # queries ahead of the back.
        ahead = Signal(range(_JOBS + 1))
        started = Signal()
        f_query, f_tile, f_addr, f_key = Signal(16), Signal(8), Signal(16), Signal(16)
        front = Signal()
        m.d.comb += front.eq(active & block & (f_query < ins.count)
                             & ((f_tile != 0) | (ahead < _JOBS)))

        b_have, b_job, b_scale = Signal(), Signal(_JOB), Signal()
        b_tile, b_addr, b_paddr, b_key, b_jobs = (Signal(8), Signal(16), Signal(16), Signal(16),
                                                  Signal(16))
        back = Signal()
        b_end = Mux(b_scale, b_tile + 1 == ins.o_tiles, (b_tile + 1 == ins.tiles) & ins.first)
        m.d.comb += back.eq(b_have & ~front)

        op = Signal(_op_layout(cfg))
        with m.If(front):
            m.d.comb += [
                self.acc_read.addr.eq(f_addr),
                op.valid.eq(1),
                op.kind.eq(_Kind.MAX),
                op.first.eq(f_tile == 0),
                op.last.eq(f_tile + 1 == ins.tiles),
                op.lanes.eq(valid_lanes(f_query, f_key)),
                op.mult.eq(ins.scale_multiplier),
                op.shift.eq(ins.scale_shift),
                op.job.query.eq(f_query),
                started.eq(f_tile == 0),
            ]
        with m.Elif(back):
            m.d.comb += [self.acc_read.addr.eq(b_addr), op.valid.eq(1), op.job.eq(b_job)]
            with m.If(b_scale):
                m.d.comb += [
                    op.kind.eq(_Kind.SCALE),
                    op.addr.eq(b_addr),
                    op.mult.eq(b_job.mult),
                    op.shift.eq(b_job.shift),
                    op.round.eq(b_job.shift > 0),
                ]
            with m.Else():
                m.d.comb += [
                    op.kind.eq(_Kind.EXP),
                    op.first.eq(b_tile == 0),
                    op.last.eq(b_tile + 1 == ins.tiles),
                    op.lanes.eq(valid_lanes(b_job.query, b_key)),
                    op.mult.eq(ins.scale_multiplier),
                    op.shift.eq(ins.scale_shift),
                    op.addr.eq(b_paddr),
                ]
        m.d.comb += self.acc_read.en.eq(op.valid)

        with m.If(start):
            m.d.sync += [f_query.eq(0), f_tile.eq(0), f_addr.eq(instr.score_row), f_key.eq(0)]
        with m.Elif(front & (f_tile + 1 == ins.tiles)):
            m.d.sync += [f_query.eq(f_query + 1), f_tile.eq(0),
                         f_addr.eq(ins.score_row + f_query + 1), f_key.eq(0)]
        with m.Elif(front):
            m.d.sync += [f_tile.eq(f_tile + 1), f_addr.eq(f_addr + ins.count),
                         f_key.eq(f_key + cols)]

        job_out = data.View(_JOB, jobs.r_data)
        pop = Signal()
        m.d.comb += [pop.eq(jobs.r_rdy & (~b_have | (back & b_end))), jobs.r_en.eq(pop)]
        with m.If(start):
            m.d.sync += [b_have.eq(0), b_jobs.eq(0)]
        with m.Elif(pop):
            m.d.sync += [
                b_have.eq(1), b_job.eq(job_out), b_scale.eq(~block), b_tile.eq(0), b_key.eq(0),
                b_addr.eq(Mux(block, ins.score_row, ins.o_row) + job_out.query),
                b_paddr.eq(ins.p_row + job_out.query), b_jobs.eq(b_jobs + 1),
            ]
        with m.Elif(back & b_end):
            m.d.sync += b_have.eq(0)
        with m.Elif(back & ~b_scale & (b_tile + 1 == ins.tiles)):
            m.d.sync += [b_scale.eq(1), b_tile.eq(0), b_addr.eq(ins.o_row + b_job.query)]
        with m.Elif(back):
            m.d.sync += [b_tile.eq(b_tile + 1), b_addr.eq(b_addr + ins.count),
                         b_paddr.eq(b_paddr + ins.count), b_key.eq(b_key + cols)]
        m.d.sync += ahead.eq(Mux(start, 0, ahead + started - pop))

        # The row pipeline: ops[s] is the operation in stage s (read issued in stage 0).
        ops = [op]

        def at(stage):
            while len(ops) <= stage:
                ops.extend(_delays(m, ops[-1], 1))
            return ops[stage]

        # 1: row * mult (+ rounding bias).  2: shift.  3: O rows written back, saturated.
        bias = Signal(35)
        m.d.comb += bias.eq(Mux(at(1).round, (C(1, 1) << at(1).shift[:6])[1:36], 0))
        products = [Signal(signed(50)) for _ in range(cols)]
        for j in range(cols):
            m.d.sync += products[j].eq(self.acc_read.data[j] * at(1).mult + bias)
        values = [Signal(signed(62)) for _ in range(cols)]
        ok = Signal(cols)
        for j in range(cols):
            m.d.sync += values[j].eq(Mux(at(2).shift < 0, products[j] << (-at(2).shift)[:4],
                                         products[j] >> at(2).shift[:6]))
        m.d.sync += ok.eq(Cat(j < at(2).lanes for j in range(cols)))
        m.d.comb += [
            self.acc_write.addr.eq(at(3).addr),
            self.acc_write.en.eq(at(3).valid & (at(3).kind == _Kind.SCALE)),
        ]
        for j in range(cols):
            m.d.comb += self.acc_write.data[j].eq(
                Mux(values[j] > 2**31 - 1, 2**31 - 1, Mux(values[j] < -2**31, -2**31, values[j])))
        xs = [value[:48].as_signed() for value in values]

        # Max pass: the row maximum, then the query's, then (with the old state) the job.
        items = []
        for j in range(cols):
            item = Signal(_MAXIMUM)
            m.d.comb += [item.valid.eq(ok[j]), item.x.eq(xs[j])]
            items.append(item)
        row_max, latency = _reduce(m, items, lambda a, b: _larger(m, a, b))
        op_max = at(3 + latency)
        running, merged = Signal(_MAXIMUM), Signal(_MAXIMUM)
        m.d.comb += merged.eq(Mux(op_max.first, row_max, _larger(m, running, row_max)))
        is_max = op_max.valid & (op_max.kind == _Kind.MAX)
        with m.If(is_max):
            m.d.sync += running.eq(merged)
        with m.If(is_max & op_max.last):
            m.d.comb += [state_read.addr.eq(ins.state_row + op_max.job.query),
                         state_read.en.eq(1)]

        step = data.StructLayout({"valid": 1, "query": 16, "m": _MAXIMUM, "old": _MAXIMUM,
                                  "l": 48})
        new = Signal(step)
        m.d.sync += [new.valid.eq(is_max & op_max.last), new.query.eq(op_max.job.query),
                     new.m.eq(merged)]
        stored = Signal(_MAXIMUM)
        m.d.comb += [stored.valid.eq(state_read.data.m_valid & ~ins.first),
                     stored.x.eq(state_read.data.m)]
        steps = _delays(m, new, 4)
        m.d.sync += [
            steps[0].m.eq(_larger(m, stored, new.m)),
            steps[0].old.eq(stored),
            steps[0].l.eq(Mux(ins.first, 0, state_read.data.l)),
        ]
        drop = steps[0].m.x - steps[0].old.x
        alpha = _exp2q(m, drop[:14], ~steps[0].old.valid | (drop >= 1 << 14))
        scaled, alpha_4 = Signal(64), Signal.like(alpha)
        m.d.sync += [scaled.eq(steps[2].l * alpha + (1 << 14)), alpha_4.eq(alpha)]
        pushed = data.View(_JOB, jobs.w_data)
        with m.If(steps[3].valid):
            m.d.comb += [
                jobs.w_en.eq(1),
                pushed.query.eq(steps[3].query),
                pushed.m.eq(steps[3].m),
                pushed.l.eq(scaled >> 15),
                pushed.mult.eq(alpha_4),
                pushed.shift.eq(15),
            ]

        # Exp pass: P rows, their sum, the new state.
        exps = []
        for j in range(cols):
            gap = Signal(signed(len(at(3).job.m.x - xs[j])), name=f"gap{j}")
            m.d.comb += gap.eq(at(3).job.m.x - xs[j])
            exps.append(_exp2q(m, gap[:14], ~ok[j] | (gap >= 1 << 14)))
        probs = [Signal(8) for _ in range(cols)]
        for j in range(cols):
            rounded = (exps[j] + 64) >> 7
            m.d.sync += probs[j].eq(Mux(rounded > 255, 255, rounded))
        m.d.comb += [
            self.p_write.addr.eq(at(6).addr),
            self.p_write.en.eq(at(6).valid & (at(6).kind == _Kind.EXP)),
        ]
        for j in range(cols):
            m.d.comb += self.p_write.data[j].eq(probs[j])
        row_sum, latency = _reduce(m, probs, lambda a, b: a + b)
        op_sum = at(6 + latency)
        running_sum = Signal(range(255 * 255 * cols + 1))
        total = Mux(op_sum.first, 0, running_sum) + row_sum
        is_exp = op_sum.valid & (op_sum.kind == _Kind.EXP)
        with m.If(is_exp):
            m.d.sync += running_sum.eq(total)
        l_new = op_sum.job.l + (total << LF)
        m.d.sync += [
            state_write.en.eq(is_exp & op_sum.last),
            state_write.addr.eq(ins.state_row + op_sum.job.query),
            state_write.data.m.eq(op_sum.job.m.x),
            state_write.data.m_valid.eq(op_sum.job.m.valid),
            state_write.data.l.eq(Mux(l_new > L_MAX, L_MAX, l_new)),
        ]

        # NORMALIZE: r = 2**47 // mant, two quotient bits per cycle (bits 17..0; 17 is 0).
        n_query, n_current = Signal(16), Signal(16)
        n_mant, n_rem, n_quot = Signal(32), Signal(33), Signal(18)
        n_shift, n_zero, n_step = Signal(signed(7)), Signal(), Signal(range(9))
        l_in = state_read.data.l
        width = Signal(range(49))
        for i in range(48):
            with m.If(l_in[i]):
                m.d.comb += width.eq(i + 1)
        rem, bits = n_rem, []
        for _ in range(2):
            fits = rem >= n_mant
            rem = (Mux(fits, rem - n_mant, rem) << 1)[:33]
            bits.insert(0, fits)
        quotient = Cat(*bits, n_quot)[:18]
        read = Signal()
        can_read = active & ~block & (n_query < ins.count) & (ahead < _JOBS)
        with m.FSM():
            with m.State("READ"):
                with m.If(can_read):
                    m.d.comb += read.eq(1)
                    m.next = "NORMALIZE"
            with m.State("NORMALIZE"):
                m.d.sync += [n_mant.eq((l_in << 32) >> width), n_shift.eq(width - 13),
                             n_zero.eq(l_in == 0), n_rem.eq(1 << 30), n_step.eq(8)]
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                m.d.sync += [n_rem.eq(rem), n_quot.eq(quotient), n_step.eq(n_step - 1)]
                with m.If(n_step == 0):
                    m.d.comb += [jobs.w_en.eq(1), pushed.query.eq(n_current),
                                 pushed.mult.eq(Mux(n_zero, 0, quotient)),
                                 pushed.shift.eq(Mux(n_zero, 0, n_shift))]
                    m.d.comb += read.eq(can_read)
                    with m.If(can_read):
                        m.next = "NORMALIZE"
                    with m.Else():
                        m.next = "READ"
        with m.If(start):
            m.d.sync += n_query.eq(0)
        with m.Elif(read):
            m.d.comb += [state_read.addr.eq(ins.state_row + n_query), state_read.en.eq(1),
                         started.eq(1)]
            m.d.sync += [n_current.eq(n_query), n_query.eq(n_query + 1)]

        stages = [o.valid for o in ops[1:]] + [new.valid] + [s.valid for s in steps]
        m.d.comb += [
            self.done.eq(active & ~b_have & (b_jobs == ins.count) & ~Cat(*stages).any()
                         & ~state_write.en),
            self.progress.eq(accept | self.acc_read.en | self.acc_write.en | self.p_write.en
                             | state_read.en | state_write.en),
        ]
        with m.If(self.done):
            m.d.sync += active.eq(0)
        return m
