"""Delay lines and register stages: a value some cycles later, in flip-flops of the module's
sync domain; a stream through a `SkidBuffer` or a `StreamRegister`; a `BufferedFifo`."""
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BufferedFifo", "SRAM_ATTRS", "SkidBuffer", "StreamRegister", "delayed", "delays",
           "pipeline_register", "ring_next"]


SRAM_ATTRS = {"no_rw_check": 1}
"""Attributes of a memory none of whose read ports that is not transparent reads the row written
in the same cycle. ``no_rw_check``: such a read returns an undefined value (yosys maps the port
straight to block RAM instead of emulating the old value with a delayed write and bypass
registers; board builds, which give yosys RTLIL, mark the ports so:
`fpga.synth.rtlil_with_no_rw_check`). `tests/test_sram_pysim.py` watches every such memory of
the core while it runs programs."""


def delays(m, value, cycles):
    """``value`` 1, 2, ... ``cycles`` cycles later (registers driven in ``m``)."""
    stages = []
    for _ in range(cycles):
        reg = Signal.like(value)
        m.d.sync += reg.eq(value)
        stages.append(value := reg)
    return stages


def delayed(m, value, cycles):
    """``value`` ``cycles`` (>= 0) cycles later: itself when 0."""
    return delays(m, value, cycles)[-1] if cycles else value


def ring_next(index, size):
    """The index after ``index`` in a ring of ``size`` slots (a FIFO's pointer)."""
    return Mux(index == size - 1, 0, index + 1)


def pipeline_register(m, value, name):
    """``value`` one stage later: a register of ``m`` named ``name`` (for timing reports)."""
    reg = Signal.like(value, name=name)
    m.d.sync += reg.eq(value)
    return reg


class SkidBuffer(wiring.Component):
    """A stream register stage with a beat of room beside it: ``o``'s payload and valid and
    ``i``'s ready are flip-flops, a beat a cycle passes with a cycle of latency, and a beat that
    arrives while ``o`` waits goes to the skid register (so ``i.ready`` need not look at
    ``o.ready``). A two-entry FIFO with its output read from a register, not from LUT RAM."""

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        skid = Signal(self.i.payload.shape())
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(self.o.ready | ~self.o.valid):
            # The output register is free: it takes the skid's beat first, else the input's.
            m.d.sync += [self.o.payload.eq(Mux(skid_valid, skid, self.i.payload)),
                         self.o.valid.eq(skid_valid | self.i.valid), skid_valid.eq(0)]
        with m.Elif(self.i.valid & ~skid_valid):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m


class StreamRegister(wiring.Component):
    """A stream register stage: ``o``'s payload and valid are flip-flops, a beat a cycle passes
    with a cycle of latency, and ``i.ready`` is ``o.ready`` or ``o`` empty (a combinational
    path back, unlike a `SkidBuffer`'s: for a clock with time to spare, half the flip-flops)."""

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(self.o.ready | ~self.o.valid)
        with m.If(self.i.ready):
            m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        return m


class BufferedFifo(fifo.SyncFIFOBuffered):
    """`amaranth.lib.fifo.SyncFIFOBuffered` whose memory has `SRAM_ATTRS`: it reads an entry
    only when it has one and writes only when it has room, so its read and write addresses
    differ whenever it does both (on an iCE40 the bypass cost 74 flip-flops for the store
    engine's W beats alone)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        if self.depth > 1:  # (one entry is a register, no memory)
            m.submodules.storage.attrs.update(SRAM_ATTRS)
        return m
