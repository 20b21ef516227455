"""Helpers the testbenches share: stream handshakes for amaranth.sim (after the Amaranth
guide's and glasgow's ``stream_put`` / ``stream_get``), instruction bits, a design elaborated as
for an FPGA family with its DSP blocks modelled, and a matmul that checks a `CoreDriver`'s core
still works.

Verification only: the simulation backend of `SimDevice` does not import this module.
"""
import numpy as np
from amaranth.hdl import Elaboratable, Fragment, Shape
from amaranth.sim import Simulator

from ..arch import OPCODE_BITS
from ..firmware.matmul import compile_matmul
from ..hdl.store import params_shift
from ..isa import INSTRUCTION_BYTES, Opcode
from .golden import matmul_int32

__all__ = ["UNKNOWN_INSTRUCTION", "ForFamily", "ReadWriteWatch", "exact_matmul",
           "instruction_bits", "put_instruction", "run_testbench", "stream_get", "stream_put",
           "stream_take"]


class ForFamily(Elaboratable):
    """``dut`` elaborated as for the FPGA ``family`` (its DSP blocks' instances: SB_MAC16 pairs,
    MULT18X18D with their registers), each block's arithmetic modelled (``dsp_model``), for
    amaranth.sim, which elaborates for no platform."""
    dsp_model = True

    def __init__(self, dut, family):
        self.dut, self.family = dut, family

    def elaborate(self, platform):
        return Fragment.get(self.dut, self)


class ReadWriteWatch:
    """Watches pairs of a read port and a write port that is not transparent to it, each
    ``(label, read_en, read_addr, write_en, write_addr)``, every cycle of ``watch`` (an
    amaranth.sim process): ``overlaps`` counts a pair read beside a write, ``collisions`` lists
    ``(cycle, label, address)`` where the read is of the row written in that cycle (on an FPGA
    a block RAM would return an undefined value)."""

    def __init__(self, pairs):
        self.pairs = list(pairs)
        self.overlaps = 0
        self.collisions = []

    async def watch(self, ctx):
        signals = [signal for _, *ports in self.pairs for signal in ports]
        cycle = 0
        async for _, _, *values in ctx.tick().sample(*signals):
            cycle += 1
            for index, (label, *_) in enumerate(self.pairs):
                read_en, read_addr, write_en, write_addr = values[4 * index:4 * index + 4]
                self.overlaps += bool(read_en and write_en)
                if read_en and write_en and read_addr == write_addr:
                    self.collisions.append((cycle, label, read_addr))


def run_testbench(dut, testbench):
    """Simulate ``dut`` on a 1 MHz clock until the amaranth.sim testbench ``testbench``
    returns."""
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


async def stream_put(ctx, stream, payload):
    """Offer ``payload`` on ``stream`` until it is taken; valid is low again on return."""
    ctx.set(stream.payload, payload)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream):
    """Take the next payload of ``stream``, with ready high until then (a stream without
    ``ready`` cannot be held back: the next valid payload)."""
    has_ready = hasattr(stream, "ready")
    if has_ready:
        ctx.set(stream.ready, 1)
    payload, = await ctx.tick().sample(stream.payload).until(stream.valid)
    if has_ready:
        ctx.set(stream.ready, 0)
    return payload


async def stream_take(ctx, stream, cycles, rng):
    """The payloads ``stream`` hands over in ``cycles`` cycles, with ready raised in a random
    half of them (``rng``, a numpy Generator): backpressure."""
    taken = []
    for _ in range(cycles):
        ready = bool(rng.integers(0, 2))
        ctx.set(stream.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        if valid and ready:
            taken.append(payload)
    ctx.set(stream.ready, 0)
    return taken


def instruction_bits(layout, raw):
    """Instruction bytes ``raw`` (`isa.encode`) as the bits of ``layout``, an engine's
    instruction payload (a union of the instructions it takes): those beyond its width are
    dropped. Set them on the payload's ``as_value()``."""
    return int.from_bytes(raw, "little") & ((1 << Shape.cast(layout).width) - 1)


async def put_instruction(ctx, stream, raw, engine=None):
    """`stream_put` of instruction bytes ``raw`` on an engine's instruction ``stream``; returns
    the cycles it waited for ready. An ``engine`` with a ``shift`` output
    (`engine.engine_members`) has the entries moved down as its queue would
    (`store.params_shift`): by one entry in each cycle it asks, until it takes; and the
    instruction stays on ``stream`` while the ``engine`` is ``holding`` it, as in its queue's
    slot."""
    shape = stream.payload.shape()
    shifting = engine is not None and "shift" in engine.signature.members
    offset, stride, count = params_shift(engine.config) if shifting else (0, 0, 0)
    region = (1 << stride * count) - 1
    value = int.from_bytes(raw, "little")
    ctx.set(stream.valid, 1)
    waited = 0
    while True:
        ctx.set(stream.payload.as_value(),
                instruction_bits(shape, value.to_bytes(len(raw), "little")))
        _, _, ready, shift = await ctx.tick().sample(
            stream.ready, engine.shift if shifting else stream.valid)
        if ready:
            break
        waited += 1
        if shifting and shift:
            entries = value >> offset & region
            value = value & ~(region << offset) | (entries >> stride) << offset
    ctx.set(stream.valid, 0)
    while engine is not None and ctx.get(engine.holding):
        await ctx.tick()
    return waited


UNKNOWN_INSTRUCTION = bytes([max(set(range(2 ** OPCODE_BITS)) - set(Opcode))]) + bytes(
    INSTRUCTION_BYTES - 1)
"""An instruction whose opcode is none of `Opcode` (the core stops with UNKNOWN_OPCODE)."""


async def exact_matmul(core, rng, windows, *, program, a_addr, b_addr, c_addr):
    """(outcome, exact): a random 6x5x3 matmul run by ``core`` in ``windows``, as a check that
    the core works (reads and writes memory) after whatever ran before."""
    await core.set_windows(windows)
    m, k, n = 6, 5, 3
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    core.ram.write(a_addr, a.tobytes())
    core.ram.write(b_addr, b.tobytes())
    code = compile_matmul(core.config, m, k, n, a_addr=a_addr, b_addr=b_addr, c_addr=c_addr)
    result = await core.run(code.to_bytes(), program, timeout_cycles=100_000)
    got = np.frombuffer(core.ram.read(c_addr, 4 * m * n), dtype="<i4").reshape(m, n)
    return result, np.array_equal(got, matmul_int32(a, b))
