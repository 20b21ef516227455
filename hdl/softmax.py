"""Softmax special-function unit (SFU): the online-softmax steps of flash attention.

Numerics (``sim/softmax_model.py`` is the bit-exact model). No step multiplies: O / l is a
multiply in the store epilogue, by the row scale NORMALIZE writes (``isa.RowScale``):

- Scores s (int32) are already in the log2 domain with ``frac`` fractional bits: x = s / 2**frac.
  The host folds the score scale (1/sqrt(d), log2(e)) into the int8 scales of Q and K
  (``firmware/attention.py``).
- State per query: m (signed 32-bit, an integer in log2 units, or -inf) and l (unsigned 32-bit,
  LF = 8 fractional bits, saturating at 2**32 - 1).
- BLOCK, per query i, over its valid keys (``k < keys`` and, with ``causal``, ``k <= i +
  causal_offset``): ``m' = max(m, ceil(max s / 2**frac))``, so ``alpha = 2**-a`` with
  ``a = min(33, m' - m)`` (33 if m = -inf): rescaling is a rounding shift,
  ``rs(v, a) = (v + ((1 << a) >> 1)) >> a`` (floor shifts).
  ``d = (m' << frac) - s >= 0``, ``n = d >> frac``, ``f = (d << 7 >> frac) & 127`` (the 7 top
  fractional bits): ``p = min(255, (EXP_TABLE[f] + (1 << (n + 3))) >> (n + 4))`` with
  ``EXP_TABLE[f] = round(2**12 * 2**(-f/128))``; p = 0 if n >= 16 or the key is masked. P goes to
  lanes 0..cols-1 of the probability buffer (0 in the other lanes). The largest p of a query
  with a valid key is in [128, 255]: up to one bit of P less than a real-valued m would give
  (see Accuracy).
  ``l' = min(2**32 - 1, rs(l, a) + (sum(p) << LF))``; unless ``first`` (which starts from
  m = -inf, l = 0), ``O = rs(O, a)``.
- NORMALIZE: with b = bitlen(l), ``mant = l << (32 - b)``, ``r = min(2**47 // mant, 2**16 -
  1)`` (2**15 <= r), sh = b - 1, written as row scale ``state_row + i`` of query i; (0, 0)
  where l = 0. A STORE of O with ``Epilogue.row_scale`` gives ``sat_int32(round_half_even(O *
  r / 2**sh))``, i.e. ``O * 2**(OUT_FRAC + LF) / l``: the attention output in units of V / 256
  (OUT_FRAC = 8), 0 where l = 0.
- Errors, raised from the registered instruction once its checks are done (a cycle per bit of
  the larger of tiles and o_tiles, then two) and the MATMULs before it (``go``); a bad one
  changes nothing else: mode not BLOCK or NORMALIZE: UNKNOWN_OPCODE; count or (BLOCK) tiles or
  o_tiles 0: BAD_EXTENT; rows past the accumulator, probability buffer or state: SRAM_RANGE
  (NORMALIZE uses only count and state_row).

Accuracy (measured by ``tests/test_softmax_pysim.py``): p is at most 0.5 LSB below and
0.5 LSB + 0.55% above ``256 * 2**-(d / 2**frac)`` (d's fraction is floored to 2**-7); r is
within 2**-15 relative of 2**47 / mant. End to end (flash attention in blocks of 4..32 keys, up
to 200 keys, scores spanning 0.5..100 in log2, int8 V), O / l / 256 is within 1.27 LSB of
V of float ``softmax(x) @ V``, 0.090 LSB rms (a 6-bit table: 0.105 rms; the previous design's
Q.10 maximum: 0.98 and 0.082): the 8-bit P dominates. Fused attention on random data (L = S =
128..512, d = 64): 1.1e-2 to 1.2e-2 relative error (``docs/DESIGN.md``).

Hardware: per lane one adder and one right shifter serve both row kinds (``base + value``, then
``>> shift``: ``((m' << frac) - s) << 7 >> frac`` for P, ``((O << 7) + half(a + 7)) >> (a + 7)``
= ``rs(O, a)`` for O rows), with ranges: the adder is 45 bits signed (P rows of valid keys:
``0 <= d << 7 < 2**44``, as ``0 <= d <= 2**36 + 2**31``; O rows: ``|(O << 7) + 2**39| <
2**40``); the shifter keeps 32 bits. Whether ``x >> shift`` fits them is a mask test of x's bits
31..43 against its sign, the mask made once per row (bits from ``31 + shift`` up; P rows ``32 +
shift``, where p is 0 if they or bits 11..31 of the output are not 0): an O element saturates
then. ``EXP_TABLE`` is in block RAM, one two-port read-only memory
per two lanes, without its 3 low bits: ``((y >> 3 >> n) + 1) >> 1`` is the p above (floors
nest). The per-query work (ceil, m', a, l) is done once per query: ``ceil(x / 2**frac)`` as
``(x >> frac) + (x & (2**frac - 1) != 0)``, ``l' = rs(l, a) + (sum(p) << LF)`` as one adder,
``(((l << 1) >> a) + (sum(p) << 9) + 1) >> 1``; NORMALIZE normalizes l by shifts of 16, 8, 4,
2 and 1 and divides (each quotient bit's compare is its subtraction's sign). A row carries
little down the pipeline: its valid lanes, its address (as wide as the accumulator's), a shift
and the P base of m' (a job: its query, that base and a); the stage
after the read makes the lane adder's base from them: for P rows ``m' << frac << 7``, clamped
(its clamp compares m' with ``2**36 >> frac``; the adder's carry-in adds the 1 of ``-x = ~x +
1``), made from the stored m (pass A: registered as the front takes a query's first row,
`spec_m`, the shift a stage later) and from m' as its job is queued (the exp pass), so no
shift is between the block RAMs and the lane adder; ``half(shift)``
for O rows. The state is two
memories, ``state_m`` (read as a query's max pass starts, written at its end) and ``state_l``
(read-modify-written at the end of the exp pass, read by NORMALIZE).

Speculation (BLOCK without ``first``): m is an integer and settles after a query's first blocks,
so usually m' = m, a = 0 and the O rescale is the identity. The max pass is then pass A: its
rows are also exp-pass rows with the stored m as m' (P rows written, p summed). At its end, a
query whose stored m is valid and equal to m' (a hit) has exactly today's P and l' = l + (sum(p)
<< LF), committed then, and its O unchanged: it is done. Any other query (a miss: m rose or is
-inf) queues its job as before: the exp pass rewrites its P rows with m', and pass A's sum is
dropped. A score above the stored m (d < 0) is a miss: whatever p the lanes make of it (0 to
255, the sums' widths hold any) is rewritten; on a hit every valid d is >= 0 and within the
ranges above. The cost: pass A's sum beside the exp pass's (the two issuers' rows interleave), a
FIFO of the stored m of up to 8 queries in flight, and the P address of the front's rows.

Timing: the max pass (or pass A) of a query (``tiles`` score rows) runs up to 8 queries ahead of
the exp pass (``tiles`` rows, writing P) and O rescale (``o_tiles`` rows; none with ``first``)
of earlier queries, so the accumulator read port is busy every cycle: a BLOCK takes
``sum(arch.block_query_cycles) + ~17`` cycles: per query ``2 * tiles`` with ``first``, else
``tiles`` on a hit, ``2 * tiles + o_tiles`` on a miss. NORMALIZE divides two quotient bits per
cycle and reads no accumulator row: ``count * 12 + ~13`` cycles (``arch.SOFTMAX_DIVIDE_CYCLES``;
l is registered as read, then normalized in two steps). The accumulator row is registered after
the block RAM read, before the lane datapath.
"""
from amaranth.hdl import C, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arch import SOFTMAX_OUT_FRAC as OUT_FRAC
from ..config import check_config
from ..isa import ErrorCode, RowScale, SoftmaxInstruction, SoftmaxMode
from .carry import add_or_subtract
from .engine import engine_members
from .pipeline import delayed, delays

__all__ = ["SoftmaxUnit", "EXP_BITS", "EXP_TABLE", "LF", "OUT_FRAC", "L_MAX", "SHIFT_MAX",
           "STATE_M"]

EXP_BITS = 7
"""Fractional bits of d (in log2 units) that index ``EXP_TABLE``."""
EXP_TABLE = tuple(round(2**12 * 2 ** (-f / 2**EXP_BITS)) for f in range(2**EXP_BITS))
"""``2**(-f/128)`` with 12 fractional bits: p = 256 * 2**-d is ``EXP_TABLE[f] >> (n + 4)``,
rounded."""
_TABLE_DROP = 3
"""Low bits of ``EXP_TABLE`` entries the lanes leave out of their ROM: p rounds at bit n + 3 or
above, so ``(y + 2**(n+3)) >> (n+4) == ((y >> 3 >> n) + 1) >> 1`` (floors nest)."""
LF = 8
L_MAX = (1 << 32) - 1
SHIFT_MAX = 33
"""Rescale shifts saturate here: ``rs(v, 33)`` is 0 for any int32 O and any l."""

STATE_M = data.StructLayout({"m": signed(32), "m_valid": 1})
"""One query's running maximum (its l is in ``state_l``)."""

_JOBS = 8
"""Queries the max pass may run ahead of the exp pass."""

_MAXIMUM = data.StructLayout({"valid": 1, "x": signed(32)})
_BASE = signed(45)
"""Per-row addend of the lane adder: ``m' << frac << 7`` (P rows, whose adder has a carry-in of
1) or the rounding bias ``(1 << shift) >> 1`` (O rows)."""




def _row_shape(config):
    """An accumulator row (the probability buffer and the state are smaller): the range checks
    keep every row an instruction reaches below this, so row arithmetic may wrap here."""
    return unsigned(ceil_log2(config.accumulator_rows))


def _query_shape(config):
    """A query index or count of one instruction: a count beyond the state is SRAM_RANGE."""
    return range(config.probability_rows + 1)


def _job_layout(config):
    """A query's job, from the front to the back."""
    return data.StructLayout({
        "query": _query_shape(config),
        "base": _BASE,       # the P base of m' (`_p_base`, made as the job is queued)
        "shift": 6,          # a
    })


class _Kind(enum.Enum, shape=2):
    MAX = 0      # score row, max pass
    EXP = 1      # score row, exp pass: a P row (with `spec`, also a max-pass row)
    SCALE = 2    # O row: rescaled and written back


def _op_layout(config):
    """A row operation on its way down the pipeline."""
    return data.StructLayout({
        "valid": 1,
        "kind": _Kind,
        "first": 1,
        "last": 1,
        "spec": 1,                        # EXP: pass A, p with the stored m (front)
        "lanes": range(config.cols + 1),  # MAX, EXP: lanes of valid keys
        "addr": _row_shape(config),       # EXP: P row; SCALE: O row
        "alpha_shift": 6,                 # EXP: a, for l
    })


_ROW = data.StructLayout({"base": _BASE, "shift": 6})
"""A row's operands: as issued, its job's P base and a shift; a stage later, the lane
datapath's, ``(base + (value << 7)) >> shift`` for O rows, ``(base + ~(value << 7)) >> shift``
for P rows."""
_SUM = _BASE
"""The lane adder: ``d << 7 < 2**44`` (P rows), ``|(O << 7) + 2**39| < 2**40`` (O rows)."""
_OUT = 32
"""Bits of the lane shifter's output: an O element, or p's table index and n."""


def _reduce(m, items, combine, levels=2):
    """Tree reduction, registered after every ``levels`` levels and at the end: (result,
    latency)."""
    latency = level = 0
    while len(items) > 1:
        items = [combine(*items[i:i + 2]) if i + 1 < len(items) else items[i]
                 for i in range(0, len(items), 2)]
        level += 1
        if level % levels == 0 and len(items) > 1:
            items = [delayed(m, item, 1) for item in items]
            latency += 1
    return delayed(m, items[0], 1), latency + 1


def _larger(m, a, b):
    out = Signal(_MAXIMUM)
    m.d.comb += out.eq(Mux(b.valid & (~a.valid | (b.x > a.x)), b, a))
    return out


def _half(shift):
    """The rounding bias of a right shift: ``(1 << shift) >> 1``."""
    return (1 << shift) >> 1


def _p_base(m_x, frac):
    """The P rows' addend for a maximum ``m_x``: ``m_x << frac << 7``, clamped (``d >= 2**36 -
    2**31`` makes p = 0 for any frac)."""
    limit = 1 << 36
    # m_x << frac > limit iff m_x > limit >> frac; below the clamp only the bits that reach
    # _BASE matter: no 63-bit shift or compare.
    top = (m_x << frac)[:_BASE.width - EXP_BITS]  # >= the largest valid s of the block
    return Mux(m_x > (C(limit, 37) >> frac), limit, top) << EXP_BITS


class SoftmaxUnit(wiring.Component):
    """Runs SOFTMAX instructions on the accumulator (scores, O), the probability buffer and the
    row scales (``scale_write``, NORMALIZE's output for the store epilogue).

    The per-query state lives in ``state_m`` (``STATE_M``) and ``state_l`` (32 bits), each
    ``probability_rows`` entries. The score rows and O rows of an instruction must not overlap.
    """

    def __init__(self, config):
        check_config(config)
        self.config = config
        self.state_m = memory.Memory(shape=STATE_M, depth=config.probability_rows, init=[])
        self.state_l = memory.Memory(shape=32, depth=config.probability_rows, init=[])
        super().__init__(self.signature_of(config))

    @staticmethod
    def signature_of(config):
        """The unit's signature for ``config``."""
        acc_addr = ceil_log2(config.accumulator_rows)
        acc_row = data.ArrayLayout(signed(32), config.cols)
        return wiring.Signature({
            **engine_members(SoftmaxInstruction),
            "go": In(1),  # the accumulator is the unit's: the MATMULs before it are done
            # Started (a register): it reads and writes the accumulator only while this is high.
            "running": Out(1),
            "acc_read": In(memory.ReadPort.Signature(addr_width=acc_addr, shape=acc_row)),
            "acc_write": In(memory.WritePort.Signature(addr_width=acc_addr, shape=acc_row)),
            "p_write": In(memory.WritePort.Signature(
                addr_width=ceil_log2(config.probability_rows),
                shape=data.ArrayLayout(unsigned(8), config.lanes))),
            "scale_write": In(memory.WritePort.Signature(
                addr_width=ceil_log2(config.probability_rows), shape=RowScale)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        cols = cfg.cols
        m.submodules.state_m = self.state_m
        m.submodules.state_l = self.state_l
        m_read, m_write = self.state_m.read_port(), self.state_m.write_port()
        l_read, l_write = self.state_l.read_port(), self.state_l.write_port()
        m.d.comb += l_read.en.eq(0)  # a read port's enable is 1 unless driven
        job, rows, queries = _job_layout(cfg), _row_shape(cfg), _query_shape(cfg)
        m.submodules.jobs = jobs = SyncFIFO(width=job.size, depth=_JOBS)
        # The stored m of each query the front started, read as it starts (a cycle before), for
        # its max pass's end (as many as queries in flight, `ahead`).
        m.submodules.stored = stored = SyncFIFO(width=STATE_M.size, depth=_JOBS)

        # Accept an instruction into `ins` (while the MATMULs before it may still run); form the
        # products of its fields by shift and add, a bit of tiles and o_tiles a cycle
        # (`checking`: no multiplier, and the cycles overlap those MATMULs), then (`judging`)
        # compare the rows they reach with the memories into `verdict`, and once the
        # accumulator is the unit's (`go`, `judged`) start it or raise the error: every check
        # starts from registers, not from the controller's queue, and the start's many
        # registers wait for no compare (the routed 8x8's critical path ran from `ins` through
        # the compares into them, 19.2 ns). It stays in `ins` until done.
        ins = Signal(SoftmaxInstruction)
        checking = Signal()
        judging = Signal()
        judged = Signal()
        verdict = Signal(ErrorCode)
        checks = checking | judging | judged
        active = Signal()
        block = ins.mode == SoftmaxMode.BLOCK
        o_span = Signal(24)    # o_tiles * count
        tile_span = Signal(24)  # tiles * count
        shifted_count = Signal(24)  # count << (the bits of tiles and o_tiles added so far)
        tiles_left, o_tiles_left = Signal(8), Signal(8)  # their bits still to add
        p_offset = Signal(rows)  # a score row's P row, less the score row
        l_offset = Signal(rows)  # a query's state row, less its last P row
        bad = Signal(ErrorCode)
        with m.If((ins.mode != SoftmaxMode.BLOCK) & (ins.mode != SoftmaxMode.NORMALIZE)):
            m.d.comb += bad.eq(ErrorCode.UNKNOWN_OPCODE)
        with m.Elif((ins.count == 0) | (block & ((ins.o_tiles == 0) | (ins.tiles == 0)))):
            m.d.comb += bad.eq(ErrorCode.BAD_EXTENT)
        with m.Elif((ins.state_row + ins.count > cfg.probability_rows)
                    | (block & (
                        (ins.o_row + o_span > cfg.accumulator_rows)
                        | (ins.score_row + tile_span > cfg.accumulator_rows)
                        | (ins.p_row + tile_span > cfg.probability_rows)))):
            m.d.comb += bad.eq(ErrorCode.SRAM_RANGE)
        accept = Signal()
        start = Signal()
        m.d.comb += [
            self.instr.ready.eq((self.error == ErrorCode.NONE) & ~self.busy),
            accept.eq(self.instr.valid & self.instr.ready),
            self.busy.eq(active | checks),
            self.running.eq(active),
        ]
        with m.If(accept):
            payload = self.instr.payload
            m.d.sync += [ins.eq(payload), checking.eq(1), o_span.eq(0), tile_span.eq(0),
                         shifted_count.eq(payload.count), tiles_left.eq(payload.tiles),
                         o_tiles_left.eq(payload.o_tiles)]
        with m.If(checking):
            m.d.sync += [tile_span.eq(tile_span + Mux(tiles_left[0], shifted_count, 0)),
                         o_span.eq(o_span + Mux(o_tiles_left[0], shifted_count, 0)),
                         shifted_count.eq(shifted_count << 1),
                         tiles_left.eq(tiles_left >> 1), o_tiles_left.eq(o_tiles_left >> 1)]
            with m.If((tiles_left[1:] == 0) & (o_tiles_left[1:] == 0)):
                m.d.sync += [checking.eq(0), judging.eq(1)]
        with m.If(judging):
            m.d.sync += [judging.eq(0), judged.eq(1), verdict.eq(bad),
                         p_offset.eq(ins.p_row - ins.score_row),
                         l_offset.eq(ins.state_row - ins.p_row - tile_span + ins.count)]
        with m.If(judged & self.go):
            m.d.sync += judged.eq(0)
            with m.If(verdict != ErrorCode.NONE):
                m.d.sync += self.error.eq(verdict)
            with m.Else():
                m.d.sync += active.eq(1)
                m.d.comb += start.eq(1)

        def capped(diagonal):
            """Keys a query sees whose causal limit is ``diagonal`` (its query index plus
            ``causal_offset + 1``): ``keys``, or fewer past that limit."""
            return Mux(ins.causal & (diagonal < ins.keys), diagonal, ins.keys)

        def diagonal(query):
            """The causal limit of ``query`` (a Python int folds its ``+ 1``)."""
            return ins.causal_offset + (query + 1)

        def key_limit(query):
            """Keys ``query`` sees."""
            return capped(diagonal(query))

        def valid_lanes(rest):
            """Lanes of a tile with ``rest`` valid keys from its first on."""
            return Mux(rest < 0, 0, Mux(rest > cols, cols, rest))

        # Two issuers share the read port: the front runs the max pass of each query and
        # queues a job; the back takes jobs and issues the exp pass and the O rows. The front
        # has priority but runs at most _JOBS queries ahead of the back. Without `first`, the
        # front's pass is speculative (pass A): its rows are max-pass rows and exp-pass rows
        # with the stored m as m' (`spec`); a query whose m' is its stored m (a hit) is done
        # then and queues no job.
        ahead = Signal(range(_JOBS + 1))
        started = Signal()
        # The keys left from a tile's first on (limit - key) are registers: their tile steps
        # subtract ``cols``, and a query's limit is formed when it starts (off the op's path).
        f_query, f_tile, f_addr = Signal(queries), Signal(8), Signal(rows)
        f_left = Signal(signed(34))
        # Whether f_query < count, a register set with f_query: the compare's carry chain into
        # `front`, and from there into the back's pop and its job's registers, was the routed
        # 8x8's critical path (16.9 ns).
        f_more = Signal()
        # The causal limit of the query after f_query, a register stepped with it (the add of
        # the offset on the way from f_query into f_left was the routed 8x8's critical path,
        # 14.4 ns).
        f_next_diagonal = Signal(signed(34))
        front = Signal()
        m.d.comb += front.eq(active & block & f_more & ((f_tile != 0) | (ahead < _JOBS)))

        b_have, b_job, b_scale = Signal(), Signal(job), Signal()
        b_tile, b_addr, b_paddr, b_left = Signal(8), Signal(rows), Signal(rows), Signal(signed(34))
        retired = Signal(queries)  # queries whose job was taken, that hit or were normalized
        hit = Signal()  # a query of pass A hit: it is done and queues no job
        back = Signal()
        # Whether the back's row is the last of its pass (exp, or with `b_scale` the O
        # rescale), a register stepped with b_tile: the compare's carry chain into the back's
        # pop, and from there into its job's registers, was the routed 8x8's critical path
        # (14.9 ns).
        b_tile_last = Signal()
        b_end = b_tile_last & (b_scale | ins.first)
        m.d.comb += back.eq(b_have & ~front)

        op, row = Signal(_op_layout(cfg)), Signal(_ROW)
        with m.If(front):
            m.d.comb += [
                self.acc_read.addr.eq(f_addr),
                op.valid.eq(1),
                op.kind.eq(Mux(ins.first, _Kind.MAX, _Kind.EXP)),
                op.spec.eq(~ins.first),
                op.first.eq(f_tile == 0),
                op.last.eq(f_tile + 1 == ins.tiles),
                op.lanes.eq(valid_lanes(f_left)),
                op.addr.eq(f_addr + p_offset),
                row.shift.eq(ins.frac),
                started.eq(f_tile == 0),
            ]
        with m.Elif(back):
            m.d.comb += [self.acc_read.addr.eq(b_addr), op.valid.eq(1)]
            with m.If(b_scale):
                m.d.comb += [
                    op.kind.eq(_Kind.SCALE),
                    op.addr.eq(b_addr),
                    row.shift.eq(b_job.shift + EXP_BITS),
                ]
            with m.Else():
                m.d.comb += [
                    op.kind.eq(_Kind.EXP),
                    op.first.eq(b_tile == 0),
                    op.last.eq(b_tile_last),
                    op.lanes.eq(valid_lanes(b_left)),
                    op.addr.eq(b_paddr),
                    op.alpha_shift.eq(b_job.shift),
                    row.base.eq(b_job.base),
                    row.shift.eq(ins.frac),
                ]
        m.d.comb += self.acc_read.en.eq(op.valid)

        # The stored m of the query whose first row the front may issue next, read a cycle
        # before (the port reads every cycle, its address from registers: `f_state` is
        # f_query's state row, set while the instruction is checked): as the front takes that
        # row (`started`), it is registered (`spec_m`: pass A's base is made from it in the
        # stage after the read, not from the block RAM's output, whose path through the
        # base's shift was the unit's critical path placed alone, 13.5 ns) and goes to
        # `stored`.
        f_last = front & (f_tile + 1 == ins.tiles)
        f_state = Signal.like(m_read.addr)
        m.d.comb += [m_read.addr.eq(f_state + f_last), m_read.en.eq(1)]
        spec_m = Signal.like(m_read.data.m)
        with m.If(front & started):
            m.d.sync += spec_m.eq(m_read.data.m)

        with m.If(checking):
            m.d.sync += [f_query.eq(0), f_more.eq(ins.count != 0), f_tile.eq(0),
                         f_state.eq(ins.state_row), f_next_diagonal.eq(diagonal(1))]
        with m.If(start):
            m.d.sync += [f_addr.eq(ins.score_row), f_left.eq(key_limit(C(0, 1)))]
        with m.Elif(f_last):
            m.d.sync += [f_query.eq(f_query + 1), f_more.eq(f_query + 1 < ins.count),
                         f_tile.eq(0), f_state.eq(f_state + 1),
                         f_addr.eq(ins.score_row + f_query + 1),
                         f_left.eq(capped(f_next_diagonal)),
                         f_next_diagonal.eq(f_next_diagonal + 1)]
        with m.Elif(front):
            m.d.sync += [f_tile.eq(f_tile + 1), f_addr.eq(f_addr + ins.count),
                         f_left.eq(f_left - cols)]

        job_out = data.View(job, jobs.r_data)
        pop = Signal()
        m.d.comb += [pop.eq(jobs.r_rdy & (~b_have | (back & b_end))), jobs.r_en.eq(pop)]
        with m.If(start):
            m.d.sync += b_have.eq(0)
        with m.Elif(pop):
            m.d.sync += [
                b_have.eq(1), b_job.eq(job_out), b_scale.eq(0),
                b_tile.eq(0), b_tile_last.eq(ins.tiles == 1),
                b_left.eq(key_limit(job_out.query)),
                b_addr.eq(ins.score_row + job_out.query),
                b_paddr.eq(ins.p_row + job_out.query),
            ]
        with m.Elif(back & b_end):
            m.d.sync += b_have.eq(0)
        with m.Elif(back & ~b_scale & b_tile_last):
            m.d.sync += [b_scale.eq(1), b_tile.eq(0), b_tile_last.eq(ins.o_tiles == 1),
                         b_addr.eq(ins.o_row + b_job.query)]
        with m.Elif(back):
            m.d.sync += [b_tile.eq(b_tile + 1),
                         b_tile_last.eq(b_tile + 2 == Mux(b_scale, ins.o_tiles, ins.tiles)),
                         b_addr.eq(b_addr + ins.count),
                         b_paddr.eq(b_paddr + ins.count), b_left.eq(b_left - cols)]
        m.d.sync += [ahead.eq(Mux(start, 0, ahead + started - pop - hit)),
                     retired.eq(Mux(start, 0, retired + pop + hit + self.scale_write.en))]

        # The row pipeline: ops[s] is the operation in stage s (read issued in stage 0).
        ops = [op]

        def at(stage):
            while len(ops) <= stage:
                ops.extend(delays(m, ops[-1], 1))
            return ops[stage]

        # 1: the row read (block RAM output).  2: registered (`read_data`), base + (value << 7
        # or its complement).  3: >> shift, and whether it overflows _OUT bits.  4: O rows
        # written back, saturated; P index.
        read_data = Signal.like(self.acc_read.data)
        m.d.sync += read_data.eq(self.acc_read.data)
        # The lane adder's base: P rows' from m' (pass A's from the stored m, `spec_m`, set
        # as the query's first row was issued), O rows' the rounding bias of their shift
        # (BLOCK's a = 0: ((O << 7) + 64) >> 7 is O).
        row_1, row_2 = delayed(m, row, 1), Signal(_ROW)
        p_base = Mux(at(1).spec, _p_base(spec_m, ins.frac), row_1.base)
        m.d.sync += [row_2.base.eq(Mux(at(1).kind == _Kind.EXP, p_base, _half(row_1.shift))),
                     row_2.shift.eq(row_1.shift)]
        # The op and the operands at the lane adder (stage 2), then at the shifter and at the
        # write.
        sum_op, sum_row, shift_op, write_op = at(2), row_2, at(3), at(4)
        shift_row = delayed(m, sum_row, 1)

        sums = [Signal(_SUM) for _ in range(cols)]
        invert = sum_op.kind == _Kind.EXP
        for j in range(cols):
            # P rows: base + ~(s << 7) + 1 = ((m' << frac) - s) << 7.
            m.d.sync += sums[j].eq(add_or_subtract(m, sum_row.base, read_data[j] << EXP_BITS,
                                                   invert, f"lane{j}", platform))
        # x >> shift fits _OUT bits (signed) iff x's bits from _OUT - 1 + shift up equal its
        # sign; P rows test from _OUT + shift up (p is 0 if one is set): a mask per row.
        # The mask is made from the row's shift a stage early, at the lane adder, and registered
        # beside the shift (the routed 8x8's critical path ran from the shift's register, whose
        # fanout is every lane's shifter, through this compare, 19.3 ns).
        wide = range(_OUT - 1, _SUM.width - 1)
        above, lowest = Signal(len(wide)), Signal(range(_OUT + 64))
        m.d.comb += lowest.eq(sum_row.shift + Mux(sum_op.kind == _Kind.EXP, _OUT, _OUT - 1))
        m.d.sync += above.eq(Cat(lowest <= i for i in wide))
        shifted = [Signal(signed(_OUT)) for _ in range(cols)]
        over, negative = Signal(cols), Signal(cols)
        for j in range(cols):
            sign = sums[j][-1]
            m.d.sync += [
                shifted[j].eq(sums[j] >> shift_row.shift),
                over[j].eq((Cat(sums[j][i] ^ sign for i in wide) & above).any()),
                negative[j].eq(sign),
            ]
        ok = Signal(cols)
        m.d.sync += ok.eq(Cat(j < at(3).lanes for j in range(cols)))
        m.d.comb += [
            self.acc_write.addr.eq(write_op.addr),
            self.acc_write.en.eq(write_op.valid & (write_op.kind == _Kind.SCALE)),
        ]
        for j in range(cols):
            m.d.comb += self.acc_write.data[j].eq(
                Mux(over[j], Mux(negative[j], -2**31, 2**31 - 1), shifted[j]))

        # Max pass: the row maximum of the raw scores, its ceiling in log2 units (registered:
        # ceil is monotonic, so the query's maximum of them is ceil of its maximum score), then
        # the query's, then the job.
        items = []
        for j in range(cols):
            item = Signal(_MAXIMUM)
            m.d.comb += [item.valid.eq(j < at(2).lanes), item.x.eq(read_data[j])]
            items.append(item)
        # A register after every level: a compare of 32 bits and its select is a level (two
        # were the 8x8 unit's critical path alone, 16.0 ns).
        row_max, max_latency = _reduce(m, items, lambda a, b: _larger(m, a, b), levels=1)
        # ceil(x / 2**frac) as floor plus "a remainder" (yosys maps -(-x >> frac) to about
        # three times the cells of one shifter), the shift and the add in stages of their own
        # (both in one were the 8x8 unit's critical path alone, 11.8 ns).
        row_floor, row_remainder = Signal(_MAXIMUM), Signal()
        row_ceiling = Signal(_MAXIMUM)
        m.d.sync += [
            row_floor.valid.eq(row_max.valid),
            row_floor.x.eq(row_max.x >> ins.frac),
            row_remainder.eq((row_max.x & ((C(1, 32) << ins.frac) - 1)).any()),
            row_ceiling.valid.eq(row_floor.valid),
            row_ceiling.x.eq(row_floor.x + row_remainder),
        ]
        max_latency += 2
        op_max = at(2 + max_latency)
        running, merged = Signal(_MAXIMUM), Signal(_MAXIMUM)
        m.d.comb += merged.eq(Mux(op_max.first, row_ceiling,
                                  _larger(m, running, row_ceiling)))
        is_max = op_max.valid & ((op_max.kind == _Kind.MAX) | op_max.spec)
        with m.If(is_max):
            m.d.sync += running.eq(merged)
        m_query = Signal(queries)  # the query of the max pass's next job
        with m.If(start):
            m.d.sync += m_query.eq(0)
        with m.Elif(is_max & op_max.last):
            m.d.sync += m_query.eq(m_query + 1)
        m.d.comb += [stored.w_en.eq(front & started), stored.w_data.eq(m_read.data)]

        # 0: m_blk = ceil(max s / 2**frac), the stored m read.  1: m' (written back), a hit.
        # 2: a; the job (m', a) queued.
        step = data.StructLayout({"valid": 1, "query": queries, "m": _MAXIMUM, "old": _MAXIMUM})
        new = Signal(step)
        m.d.sync += [new.valid.eq(is_max & op_max.last), new.query.eq(m_query),
                     new.m.eq(merged)]
        old = Signal(_MAXIMUM)
        stored_m = data.View(STATE_M, stored.r_data)
        m.d.comb += [
            stored.r_en.eq(new.valid),
            old.valid.eq(stored_m.m_valid & ~ins.first),
            old.x.eq(stored_m.m),
        ]
        steps = delays(m, new, 2)
        m.d.sync += [steps[0].m.eq(_larger(m, old, new.m)), steps[0].old.eq(old)]
        m.d.comb += [
            m_write.en.eq(steps[0].valid),
            m_write.addr.eq(ins.state_row + steps[0].query),
            m_write.data.m.eq(steps[0].m.x),
            m_write.data.m_valid.eq(steps[0].m.valid),
        ]
        rise = steps[0].m.x - steps[0].old.x
        alpha_shift = Signal(6)
        m.d.sync += [
            alpha_shift.eq(Mux(~steps[0].old.valid | (rise > SHIFT_MAX), SHIFT_MAX, rise)),
            # m' = m (not -inf, so no first): pass A's P rows and sum are the exp pass's.
            hit.eq(steps[0].valid & steps[0].old.valid & (rise == 0)),
        ]
        # The job's P base, made from m' in the stage before the push (shifted and clamped on
        # the way into the job FIFO it was the routed 8x8's and 16x16's critical path, 16.8 ns).
        job_base = Signal(_BASE)
        m.d.sync += job_base.eq(_p_base(steps[0].m.x, ins.frac))
        pushed = data.View(job, jobs.w_data)
        with m.If(steps[1].valid & ~hit):
            m.d.comb += [
                jobs.w_en.eq(1),
                pushed.query.eq(steps[1].query),
                pushed.base.eq(job_base),
                pushed.shift.eq(alpha_shift),
            ]

        # Exp pass: P rows (the table is read in stage 4, shifted by n in 5, p rounded in 6,
        # written in 7: `p_stage`), their sum, then l read (stage p_stage - 2 + sum_latency,
        # registered) and written.
        index = data.StructLayout({"f": EXP_BITS, "n": 4, "big": _OUT - EXP_BITS - 4})
        # A block RAM ROM per two lanes (one yosys memory with a read port per lane crashes its
        # memory_libmap at 16 lanes).
        entries = [y >> _TABLE_DROP for y in EXP_TABLE]
        n_5, zero_5 = Signal(data.ArrayLayout(4, cols)), Signal(cols)
        y_5 = []
        probs = [Signal(8) for _ in range(cols)]
        for j in range(cols):
            if j % 2 == 0:
                m.submodules[f"table{j // 2}"] = table = memory.Memory(
                    shape=13 - _TABLE_DROP, depth=len(entries), init=entries,
                    attrs={"rom_style": "block"})
            z = data.View(index, shifted[j])
            port = table.read_port()
            m.d.comb += port.addr.eq(z.f)
            y_5.append(port.data)
            m.d.sync += [n_5[j].eq(z.n), zero_5[j].eq(~ok[j] | over[j] | (z.big != 0))]
            # The table's output shifted, then rounded in a stage of its own (the block RAM's
            # output through both was the 8x8 unit's critical path alone, 14.6 ns).
            y_6, zero_6 = Signal.like(y_5[j]), Signal()
            m.d.sync += [y_6.eq(y_5[j] >> n_5[j]), zero_6.eq(zero_5[j])]
            rounded = (y_6 + 1) >> 1
            m.d.sync += probs[j].eq(Mux(zero_6, 0, Mux(rounded > 255, 255, rounded)))
        p_stage = 7
        m.d.comb += [
            self.p_write.addr.eq(at(p_stage).addr),
            self.p_write.en.eq(at(p_stage).valid & (at(p_stage).kind == _Kind.EXP)),
        ]
        for j in range(cols):
            m.d.comb += self.p_write.data[j].eq(probs[j])
        row_sum, sum_latency = _reduce(m, probs, lambda a, b: a + b)
        # A query's hit is known at its max pass's end (stage max_latency + 5, `hit`): its sum
        # comes no earlier.
        hit_latency = max_latency + 5
        lag = max(hit_latency - p_stage - sum_latency, 0)
        row_sum = delayed(m, row_sum, lag)
        sum_latency += lag
        op_sum = at(p_stage + sum_latency)
        is_exp = op_sum.valid & (op_sum.kind == _Kind.EXP)
        # The front's (pass A) and the back's rows interleave: a running sum for each.
        totals = []
        for spec in (0, 1):
            running_sum = Signal(range(255 * 255 * cols + 1))
            totals.append(Mux(op_sum.first, 0, running_sum) + row_sum)
            with m.If(is_exp & (op_sum.spec == spec)):
                m.d.sync += running_sum.eq(totals[-1])
        total = Mux(op_sum.spec, totals[1], totals[0])
        # Whether pass A's query hit, from its max pass's end (`hit`) to its sum's.
        hit_sum = delayed(m, hit, p_stage + sum_latency - hit_latency)
        # A query's state row is its last P row (`addr`) plus `l_offset`. l is read two stages
        # before its sum and registered as read (a query's l is written once, after its reads).
        before = at(p_stage - 2 + sum_latency)
        l_rows = [Signal(rows, name=f"l_row{k}") for k in range(2)]  # `before`'s state row, on
        m.d.sync += [l_rows[0].eq(before.addr + l_offset), l_rows[1].eq(l_rows[0])]
        l_row = l_rows[1]  # op_sum's
        with m.If(before.valid & (before.kind == _Kind.EXP) & before.last):
            m.d.comb += [l_read.addr.eq(before.addr + l_offset), l_read.en.eq(1)]
        l_read_data = Signal(32)
        m.d.sync += l_read_data.eq(l_read.data)
        l_old = Mux(ins.first, 0, l_read_data)
        # rs(l, a) + (sum << LF) with one adder: ((l << 1 >> a) + 1) >> 1 is rs(l, a) for any
        # a >= 0 (floors nest), and the even sum << (LF + 1) joins it before the last shift.
        l_new = (((l_old << 1) >> op_sum.alpha_shift) + (total << (LF + 1)) + 1) >> 1
        m.d.sync += [
            l_write.en.eq(is_exp & op_sum.last & (~op_sum.spec | hit_sum)),
            l_write.addr.eq(l_row),
            l_write.data.eq(Mux(l_new > L_MAX, L_MAX, l_new)),
        ]

        # NORMALIZE: r = 2**47 // mant, two quotient bits per cycle (bits 17..0; 17 is 0),
        # written as the query's row scale: min(r, 2**16 - 1) and sh.
        n_query, n_current = Signal(queries), Signal(queries)
        n_mant, n_rem, n_quot = Signal(32), Signal(33), Signal(18)
        n_shift, n_zero, n_step = Signal(6), Signal(), Signal(range(9))
        l_in = Signal(32)  # l as read, registered before its normalization
        # l normalized to [2**31, 2**32) by shifts of 16 and 8 (`COARSE`), then 4, 2, 1
        # (`NORMALIZE`): its leading zeros (all five in a cycle were the routed 8x8's critical
        # path, 14.3 ns).
        def normalize(value, shifts):
            """``value`` shifted left by each of ``shifts`` whose top bits are zero, and those
            shifts' flags (the largest shift's flag the top bit)."""
            zeros = []
            for k in shifts:
                zeros.insert(0, value[32 - k:] == 0)
                value = Mux(zeros[0], value << k, value)[:32]
            return value, Cat(*zeros)
        coarse_zeros = Signal(2)
        coarse, coarse_found = normalize(l_in, (16, 8))
        mant, fine_zeros = normalize(l_in, (4, 2, 1))
        rem, bits = n_rem, []
        for _ in range(2):
            difference = rem - n_mant  # one carry chain: its sign is the compare
            fits = ~difference[-1]
            rem = (Mux(fits, difference, rem) << 1)[:33]
            bits.insert(0, fits)
        quotient = Cat(*bits, n_quot)[:18]
        read = Signal()
        can_read = active & ~block & (n_query < ins.count)
        with m.FSM():
            with m.State("READ"):
                with m.If(can_read):
                    m.d.comb += read.eq(1)
                    m.next = "LATCH"
            with m.State("LATCH"):
                m.d.sync += l_in.eq(l_read.data)
                m.next = "COARSE"
            with m.State("COARSE"):
                m.d.sync += [l_in.eq(coarse), coarse_zeros.eq(coarse_found)]
                m.next = "NORMALIZE"
            with m.State("NORMALIZE"):
                m.d.sync += [n_mant.eq(mant), n_shift.eq(31 - Cat(fine_zeros, coarse_zeros)),
                             n_zero.eq(l_in == 0), n_rem.eq(1 << 30), n_step.eq(8)]
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                m.d.sync += [n_rem.eq(rem), n_quot.eq(quotient), n_step.eq(n_step - 1)]
                with m.If(n_step == 0):
                    m.d.comb += [
                        self.scale_write.en.eq(1),
                        self.scale_write.addr.eq(ins.state_row + n_current),
                        self.scale_write.data.multiplier.eq(
                            Mux(n_zero, 0, Mux(quotient[16:].any(), 2**16 - 1, quotient))),
                        self.scale_write.data.shift.eq(Mux(n_zero, 0, n_shift)),
                    ]
                    m.d.comb += read.eq(can_read)
                    with m.If(can_read):
                        m.next = "LATCH"
                    with m.Else():
                        m.next = "READ"
        # (Reset while the instruction is checked: the checks are not on the read's path.)
        with m.If(checking):
            m.d.sync += n_query.eq(0)
        with m.If(read):
            m.d.comb += [l_read.addr.eq(ins.state_row + n_query), l_read.en.eq(1)]
            m.d.sync += [n_current.eq(n_query), n_query.eq(n_query + 1)]

        stages = [o.valid for o in ops[1:]] + [new.valid] + [s.valid for s in steps]
        m.d.comb += [
            self.done.eq(active & ~b_have & (retired == ins.count) & ~Cat(*stages).any()
                         & ~l_write.en),
            self.progress.eq(accept | checks | self.acc_read.en | self.acc_write.en
                             | self.scale_write.en
                             | self.p_write.en | l_read.en | m_write.en | l_write.en),
        ]
        with m.If(self.done):
            m.d.sync += active.eq(0)
        return m
