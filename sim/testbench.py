"""Helpers the testbenches share: stream handshakes for amaranth.sim (after the Amaranth
guide's and glasgow's ``stream_put`` / ``stream_get``) and instruction bits.

Verification only: the simulation backend of `SimDevice` does not import this module.
"""
from amaranth.hdl import Shape

from ..arch import OPCODE_BITS
from ..isa import INSTRUCTION_BYTES, Opcode

__all__ = ["UNKNOWN_INSTRUCTION", "instruction_payload", "put_instruction", "stream_get",
           "stream_put"]


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


def instruction_payload(layout, raw):
    """Instruction bytes ``raw`` (`isa.encode`) as a constant of ``layout``, an engine's
    instruction payload: the bits beyond its width are dropped."""
    bits = int.from_bytes(raw, "little")
    return layout.from_bits(bits & ((1 << Shape.cast(layout).width) - 1))


async def put_instruction(ctx, stream, raw):
    """`stream_put` of instruction bytes ``raw`` on an engine's instruction ``stream``."""
    await stream_put(ctx, stream, instruction_payload(stream.payload.shape(), raw))


UNKNOWN_INSTRUCTION = bytes([max(set(range(2 ** OPCODE_BITS)) - set(Opcode))]) + bytes(
    INSTRUCTION_BYTES - 1)
"""An instruction whose opcode is none of `Opcode` (the core stops with UNKNOWN_OPCODE)."""
