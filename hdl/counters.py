"""Performance counters kept in a memory of 16-bit words (`CoreConfig.counters_in_ram`)."""
from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from .pipeline import SRAM_ATTRS, ring_next

__all__ = ["CounterMemory", "WORD_BITS"]

WORD_BITS = 16
"""Bits of a memory word: an iCE40 block RAM's (256 x 16)."""


class CounterMemory(wiring.Component):
    """``len(increments)`` counters of ``width`` bits in one memory of `WORD_BITS`-bit words,
    each counter ``width // WORD_BITS`` words, lowest first.

    ``amounts``: what each counter adds this cycle (at most ``increments[k]``); ``clear``: a
    pulse that sets every counter to 0 (the amounts of its cycle are dropped, as a flip-flop
    counter's would be). The memory is read and written a word a cycle, the counters in turn:
    each counter has a small accumulator of the amounts since its last visit, which its visit
    adds in, carrying up its words on the cycles after. A counter pending a clear (after
    ``clear`` and after reset) is taken as 0 at its next visit.

    ``read_index`` and ``read``, held until ``done``: ``value`` in the cycle of ``done`` is
    counter ``read_index`` as one visit wrote it (a visit that starts after the request; at
    most two rounds of ``len(increments) * width // WORD_BITS`` cycles).
    """

    def __init__(self, increments, width):
        if width % WORD_BITS:
            raise ValueError(f"width={width!r} is invalid: allowed a multiple of {WORD_BITS}")
        self.increments, self.width = tuple(increments), width
        self.words = width // WORD_BITS
        self.period = len(self.increments) * self.words
        """Cycles between two visits of a counter."""
        # An accumulator takes the amounts of a round between visits, and the visit's own.
        self.pending_bits = [ceil_log2(most * (self.period + 1) + 1) for most in increments]
        if max(self.pending_bits) > WORD_BITS:
            raise ValueError(f"increments={self.increments!r} are invalid: a round of them "
                             f"must fit a {WORD_BITS}-bit word")
        super().__init__({
            "amounts": In(data.ArrayLayout(self.amount_bits, len(self.increments))),
            "clear": In(1),
            "read_index": In(range(len(self.increments))),
            "read": In(1),
            "done": Out(1),
            "value": Out(width),
        })

    @property
    def amount_bits(self):
        return ceil_log2(max(self.increments) + 1)

    def elaborate(self, platform):
        m = Module()
        count, words = len(self.increments), self.words
        word_bits = ceil_log2(words)
        m.submodules.words = words_memory = memory.Memory(
            shape=WORD_BITS, depth=count << word_bits, init=[],
            attrs={"ram_style": "block", **SRAM_ATTRS})  # it writes the slot read before
        read_port = words_memory.read_port()
        write_port = words_memory.write_port()

        # The slot read this cycle (counter, word), and the one written: read the cycle before
        # (from reset the last slot, taken as 0: never the slot read, `SRAM_ATTRS`).
        slot = Signal(data.StructLayout({"word": word_bits, "counter": range(count)}))
        visit = Signal.like(slot, init={"word": words - 1, "counter": count - 1})
        last_word = slot.word == words - 1
        m.d.sync += [
            slot.word.eq(Mux(last_word, 0, slot.word + 1)),
            visit.eq(slot),
        ]
        with m.If(last_word):
            m.d.sync += slot.counter.eq(ring_next(slot.counter, count))
        m.d.comb += [read_port.addr.eq(slot.as_value()), read_port.en.eq(1)]

        pending = Array(Signal(bits, name=f"pending{k}")
                        for k, bits in enumerate(self.pending_bits))
        clearing = Signal(count, init=(1 << count) - 1)  # taken as 0 at the next visit
        zeroing = Signal(init=1)  # this visit's counter is taken as 0 (its words after the first)
        carry = Signal()
        first = visit.word == 0
        zero = Mux(first, clearing.bit_select(visit.counter, 1), zeroing)
        total = Signal(WORD_BITS + 1)
        m.d.comb += [
            total.eq(Mux(zero, 0, read_port.data) + Mux(first, pending[visit.counter], carry)),
            write_port.addr.eq(visit.as_value()),
            write_port.data.eq(total[:WORD_BITS]),
            write_port.en.eq(1),
        ]
        m.d.sync += [carry.eq(total[WORD_BITS]), zeroing.eq(zero)]
        for k in range(count):
            visited = first & (visit.counter == k)
            m.d.sync += pending[k].eq(Mux(visited, 0, pending[k]) + self.amounts[k])
        with m.If(first):
            m.d.sync += clearing.bit_select(visit.counter, 1).eq(0)
        with m.If(self.clear):
            m.d.sync += [clearing.eq((1 << count) - 1), *(p.eq(0) for p in pending)]

        # A read: the words one visit of the counter writes, from its first on; the last as it
        # is written, with ``done``.
        taking = Signal()
        mine = self.read & (visit.counter == self.read_index)
        lower = Signal((words - 1) * WORD_BITS)
        m.d.comb += [self.value.eq(Cat(lower, total[:WORD_BITS])),
                     self.done.eq(mine & taking & (visit.word == words - 1))]
        with m.If(mine & (first | taking) & (visit.word != words - 1)):
            m.d.sync += [lower.word_select(visit.word, WORD_BITS).eq(total[:WORD_BITS]),
                         taking.eq(1)]
        with m.If(~self.read | self.done):
            m.d.sync += taking.eq(0)
        return m
