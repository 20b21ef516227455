"""An AXI4 memory with the latency of a real one: cocotbext-axi's AxiRam, but each read burst's
data and each write response come a fixed number of clock cycles after the request, pipelined.

AxiRam answers a read burst two or three cycles after its AR and takes the next AR only once
the previous burst's beats are out, so it hides what outstanding requests are for. Here every
AR is accepted at once (one a cycle), its beats are read then and sent ``read_latency`` cycles
after the handshake, in order, one a cycle (R back-pressure delays them further); B responses
likewise come ``write_latency`` cycles after the burst's last W beat.

The delay line and the two burst processes also serve `HostileAxiRam` (sim/hostile_ram.py),
which draws a latency per burst and lets the responses of different IDs overtake each other.
"""
import random
from collections import deque

import cocotb
from cocotb.triggers import ClockCycles, Event, First, RisingEdge
from cocotbext.axi import AxiResp
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.memory import Memory

from .axi_bursts import beat_word, incr_beats, read_beats, write_beat

__all__ = ["LatencyAxiRam"]


class _DelayLine:
    """Sends items on a cocotbext-axi source, each no earlier than its delay after its `put`.

    Items of one lane go in the order they were put. When the heads of several lanes are due,
    ``rng`` picks one at random (without it: the one put first). ``overtaken`` counts the items
    sent while an item put before them was still waiting.
    """

    def __init__(self, source, clock, rng=None):
        self.source, self.clock, self.rng = source, clock, rng
        self.cycle = 0
        self.lanes = {}
        self.puts = self.overtaken = 0
        self.arrived = Event()
        self.tasks = [cocotb.start_soon(self._count()), cocotb.start_soon(self._forward())]

    def put(self, items, delay, lane=0):
        """Queue ``items`` on ``lane``, due ``delay`` clock cycles from now."""
        queue = self.lanes.setdefault(lane, deque())
        for item in items:
            queue.append((self.cycle + delay, self.puts, item))
            self.puts += 1
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
            self.arrived.clear()
            heads = [queue for queue in self.lanes.values() if queue]
            if not heads:
                await self.arrived.wait()
                continue
            due = [queue for queue in heads if queue[0][0] <= self.cycle]
            if not due:
                wait = min(queue[0][0] for queue in heads) - self.cycle
                await First(ClockCycles(self.clock, wait), self.arrived.wait())
                continue
            lane = self.rng.choice(due) if self.rng else min(due, key=lambda q: q[0][1])
            _, order, item = lane.popleft()
            waiting = [queue[0][1] for queue in heads if queue]
            self.overtaken += bool(waiting) and order > min(waiting)
            await self.source.send(item)


class _DelayedResponses:
    """Mixin of the read and write halves: a `_DelayLine` on ``_channel_name``, replaced at
    every reset. ``latency``: (least, most) clock cycles from a burst to its answer, drawn per
    burst with ``rng``; with ``reorder`` the answers to different IDs are on lanes of their own
    (in order per ID, as AXI wants) that ``rng`` interleaves, else all in request order."""

    def __init__(self, latency, rng, reorder, *args, **kwargs):
        self.latency, self.rng, self.reorder = latency, rng, reorder
        self._line = None
        self._overtaken = 0
        super().__init__(*args, **kwargs)

    @property
    def overtaken(self):
        """Answers sent before an answer to an earlier burst, since the start."""
        return self._overtaken + (self._line.overtaken if self._line else 0)

    def _handle_reset(self, state):
        if self._line is not None:
            self._overtaken += self._line.overtaken
            self._line.stop()
            self._line = None
        if not state:
            self._line = _DelayLine(getattr(self, self._channel_name), self.clock,
                                    self.rng if self.reorder else None)
        super()._handle_reset(state)

    def _answer(self, items, id_):
        """Send ``items``, the answer to one burst of ID ``id_``, after a drawn latency."""
        self._line.put(items, self.rng.randint(*self.latency), id_ if self.reorder else 0)


class _LatencyRead(_DelayedResponses, AxiRamRead):
    _channel_name = "r_channel"

    async def _process_read(self):
        while True:
            ar = await self.ar_channel.recv()
            beats = []
            for word, r in read_beats(self, ar):
                r.rresp = AxiResp.OKAY
                r.rdata = int.from_bytes(await self._read(word, self.byte_lanes), "little")
                beats.append(r)
            self._answer(beats, int(ar.arid))


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
            self._answer([b], b.bid)


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
        rng = random.Random(0)  # draws the fixed latencies; no reordering
        self.write_if = _LatencyWrite((write_latency, write_latency), rng, False, bus.write,
                                      clock, reset, reset_active_level, mem=self.mem)
        self.read_if = _LatencyRead((read_latency, read_latency), rng, False, bus.read, clock,
                                    reset, reset_active_level, mem=self.mem)
