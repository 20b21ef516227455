"""An AXI4 memory with the latency of a real one: cocotbext-axi's AxiRam, but each read burst's
data and each write response come a fixed number of clock cycles after the request, pipelined.

AxiRam answers a read burst two or three cycles after its AR and takes the next AR only once
the previous burst's beats are out, so it hides what outstanding requests are for. Here every
AR is accepted at once (one a cycle), its beats are read then and sent ``read_latency`` cycles
after the handshake, in order, one a cycle (R back-pressure delays them further); B responses
likewise come ``write_latency`` cycles after the burst's last W beat.
"""
from collections import deque

import cocotb
from cocotb.triggers import ClockCycles, Event, RisingEdge
from cocotbext.axi import AxiResp
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.memory import Memory

from .fault_memory import beat_word, incr_beats, read_beats, write_beat

__all__ = ["LatencyAxiRam"]


class _DelayLine:
    """Sends items on a cocotbext-axi source in order, each no earlier than ``latency`` clock
    cycles after its `put`; any number may wait."""

    def __init__(self, source, clock, latency):
        self.source, self.clock, self.latency = source, clock, latency
        self.cycle = 0
        self.waiting = deque()
        self.arrived = Event()
        self.tasks = [cocotb.start_soon(self._count()), cocotb.start_soon(self._forward())]

    def put(self, item):
        self.waiting.append((self.cycle + self.latency, item))
        self.arrived.set()

    def stop(self):
        for task in self.tasks:
            task.cancel()

    async def _count(self):
        while True:
            await RisingEdge(self.clock)
            self.cycle += 1

    async def _forward(self):
        while True:
            if not self.waiting:
                self.arrived.clear()
                await self.arrived.wait()
                continue
            due, item = self.waiting[0]
            if self.cycle < due:
                await ClockCycles(self.clock, due - self.cycle)
                continue
            self.waiting.popleft()
            await self.source.send(item)


class _DelayedResponses:
    """Mixin of the read and write halves: a `_DelayLine` on ``_channel_name``, replaced at
    every reset."""

    def __init__(self, latency, *args, **kwargs):
        self.latency = latency
        self._line = None
        super().__init__(*args, **kwargs)

    def _handle_reset(self, state):
        if self._line is not None:
            self._line.stop()
            self._line = None
        if not state:
            self._line = _DelayLine(getattr(self, self._channel_name), self.clock, self.latency)
        super()._handle_reset(state)


class _LatencyRead(_DelayedResponses, AxiRamRead):
    _channel_name = "r_channel"

    async def _process_read(self):
        while True:
            ar = await self.ar_channel.recv()
            for word, r in read_beats(self, ar):
                r.rresp = AxiResp.OKAY
                r.rdata = int.from_bytes(await self._read(word, self.byte_lanes), "little")
                self._line.put(r)


class _LatencyWrite(_DelayedResponses, AxiRamWrite):
    _channel_name = "b_channel"

    async def _process_write(self):
        while True:
            aw = await self.aw_channel.recv()
            beats, size, address = incr_beats(aw, "aw", self.byte_lanes)
            for n in range(beats):
                w = await self.w_channel.recv()
                assert bool(int(w.wlast)) == (n == beats - 1), f"WLAST on beat {n}"
                write_beat(self, beat_word(address, size, n, self.byte_lanes) % self.size, w,
                           self.byte_lanes)
            b = self.b_channel._transaction_obj()
            b.bid = int(aw.awid)
            b.bresp = AxiResp.OKAY
            self._line.put(b)


class LatencyAxiRam(Memory):
    """A drop-in for cocotbext-axi's ``AxiRam`` (same constructor, ``read`` / ``write``,
    ``read_if`` / ``write_if``) with ``read_latency`` and ``write_latency`` (default: the same)
    clock cycles between a request and its answer."""

    def __init__(self, bus, clock, reset=None, reset_active_level=True, size=2**64, mem=None, *,
                 read_latency=20, write_latency=None, **kwargs):
        super().__init__(size, mem, **kwargs)
        write_latency = read_latency if write_latency is None else write_latency
        for name, value in (("read_latency", read_latency), ("write_latency", write_latency)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 0")
        self.write_if = _LatencyWrite(write_latency, bus.write, clock, reset, reset_active_level,
                                      mem=self.mem)
        self.read_if = _LatencyRead(read_latency, bus.read, clock, reset, reset_active_level,
                                    mem=self.mem)
