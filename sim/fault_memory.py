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
from cocotbext.axi.memory import Memory

from .axi_bursts import beat_word, incr_beats, read_beats, write_beat

__all__ = ["Fault", "FaultyAxiRam"]


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


class _WithFaults:
    """A burst process that answers with ``faults`` (its first argument)."""

    def __init__(self, faults, *args, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)


class _FaultyRead(_WithFaults, AxiRamRead):

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


class _FaultyWrite(_WithFaults, AxiRamWrite):

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
