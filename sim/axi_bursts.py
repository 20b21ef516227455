"""What the AxiRam-based memory models share (`LatencyAxiRam`, `HostileAxiRam`,
`FaultyAxiRam`): the beats of an INCR burst, and random pauses for a cocotbext-axi channel.

Part of the simulation backend (`SimDevice` with ``memory="axiram"``).
"""
import itertools

from cocotbext.axi.constants import AxiBurstType

__all__ = ["beat_word", "incr_beats", "random_pauses", "read_beats", "write_beat"]

_PAUSE_PERIOD = 997
"""Random pauses repeat after this many cycles (a prime: no beat with any burst length)."""


def random_pauses(rng, probability):
    """A pause generator for a cocotbext-axi channel: paused with ``probability`` a cycle."""
    return itertools.cycle([rng.random() < probability for _ in range(_PAUSE_PERIOD)])


def incr_beats(transaction, prefix, byte_lanes):
    """(beats, bytes per beat, first beat-aligned address) of an INCR burst (the only kind the
    core issues)."""
    burst = AxiBurstType(int(getattr(transaction, f"{prefix}burst")))
    if burst != AxiBurstType.INCR:
        raise AssertionError(f"{prefix.upper()} burst type {burst.name}: only INCR is modelled")
    size = 1 << int(getattr(transaction, f"{prefix}size"))
    assert size <= byte_lanes
    address = int(getattr(transaction, f"{prefix}addr"))
    return int(getattr(transaction, f"{prefix}len")) + 1, size, address - address % size


def beat_word(address, size, n, byte_lanes):
    """The bus-word address of beat ``n`` of an INCR burst from ``address`` of ``size`` bytes a beat."""
    return (address + n * size) // byte_lanes * byte_lanes


def read_beats(ram, ar):
    """The R beats of INCR burst ``ar`` on AxiRamRead ``ram``: (word address, R transaction with
    its ID and RLAST set; the caller sets RRESP and RDATA)."""
    beats, size, address = incr_beats(ar, "ar", ram.byte_lanes)
    for n in range(beats):
        r = ram.r_channel._transaction_obj()
        r.rid = int(ar.arid)
        r.rlast = n == beats - 1
        yield beat_word(address, size, n, ram.byte_lanes), r


def write_beat(memory, word, w, byte_lanes):
    """Write the lanes of W beat ``w`` that its WSTRB enables into ``memory`` at ``word``."""
    data = int(w.wdata).to_bytes(byte_lanes, "little")
    merged = bytearray(memory.read(word, byte_lanes))
    for lane in range(byte_lanes):
        if int(w.wstrb) >> lane & 1:
            merged[lane] = data[lane]
    memory.write(word, bytes(merged))
