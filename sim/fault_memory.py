"""An AXI4 memory model that answers chosen address ranges with SLVERR or DECERR, or not at all.

cocotbext-axi's AxiRam always answers OKAY (SLVERR only when its own memory access raises), so
`FaultyAxiRam` keeps its channels, reset handling and pause generators and replaces the two
burst processes: a read beat inside a read fault returns zeros with the fault's response, a
write burst touching a write fault is not written and gets the fault's response on B. A fault
without a response is a memory that hangs: the burst never completes (nor any after it) until
the next reset.
"""
from dataclasses import dataclass

from cocotb.triggers import Event
from cocotbext.axi import AxiResp
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.constants import AxiBurstType
from cocotbext.axi.memory import Memory

__all__ = ["Fault", "FaultyAxiRam", "beat_word", "incr_beats", "read_beats", "write_beat"]


@dataclass(frozen=True)
class Fault:
    """Accesses of kind ``access`` ("read" or "write") to ``[base, base + size)`` answer
    ``response``: SLVERR, DECERR, or None for never."""
    base: int
    size: int
    access: str
    response: AxiResp = AxiResp.SLVERR

    def __post_init__(self):
        if self.access not in ("read", "write"):
            raise ValueError(f'access={self.access!r} is invalid: allowed "read" or "write"')
        if self.response not in (AxiResp.SLVERR, AxiResp.DECERR, None):
            raise ValueError(f"response={self.response!r} is invalid: allowed SLVERR, DECERR "
                             f"or None")
        if self.size < 1:
            raise ValueError(f"size={self.size!r} is invalid: allowed >= 1")

    def hits(self, access, address, length):
        return (access == self.access and address < self.base + self.size
                and self.base < address + length)


def _response(faults, access, address, length):
    """The response to an access: the first fault that covers it, else OKAY."""
    return next((f.response for f in faults if f.hits(access, address, length)), AxiResp.OKAY)


async def _hang():
    """Wait until the burst process is killed by a reset."""
    await Event().wait()


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


class _FaultyRead(AxiRamRead):
    def __init__(self, faults, *args, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)

    async def _process_read(self):
        while True:
            ar = await self.ar_channel.recv()
            for word, r in read_beats(self, ar):
                r.rresp = _response(self.faults, "read", word, self.byte_lanes)
                if r.rresp is None:
                    await _hang()
                data = (bytes(self.byte_lanes) if r.rresp != AxiResp.OKAY
                        else await self._read(word, self.byte_lanes))
                r.rdata = int.from_bytes(data, "little")
                await self.r_channel.send(r)


class _FaultyWrite(AxiRamWrite):
    def __init__(self, faults, *args, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)

    async def _process_write(self):
        while True:
            aw = await self.aw_channel.recv()
            beats, size, address = incr_beats(aw, "aw", self.byte_lanes)
            response = _response(self.faults, "write", address, beats * size)
            for n in range(beats):
                w = await self.w_channel.recv()
                assert bool(int(w.wlast)) == (n == beats - 1), f"WLAST on beat {n} of {beats}"
                if response is not AxiResp.OKAY:
                    continue
                write_beat(self, beat_word(address, size, n, self.byte_lanes) % self.size, w,
                           self.byte_lanes)
            if response is None:
                await _hang()
            b = self.b_channel._transaction_obj()
            b.bid = int(aw.awid)
            b.bresp = response
            await self.b_channel.send(b)


class FaultyAxiRam(Memory):
    """A drop-in for cocotbext-axi's ``AxiRam`` (same constructor and ``read`` / ``write``,
    ``read_if`` / ``write_if``) with a list ``faults`` of `Fault`, empty at first: change it at
    any time, it applies from the next burst on."""

    def __init__(self, bus, clock, reset=None, reset_active_level=True, size=2**64, mem=None,
                 **kwargs):
        super().__init__(size, mem, **kwargs)
        self.faults = []
        self.write_if = _FaultyWrite(self.faults, bus.write, clock, reset, reset_active_level,
                                     mem=self.mem)
        self.read_if = _FaultyRead(self.faults, bus.read, clock, reset, reset_active_level,
                                   mem=self.mem)
