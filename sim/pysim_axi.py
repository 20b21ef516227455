"""A Python AXI4 memory for amaranth.sim testbenches, checking the master's side of the protocol.

``AxiMemory`` serves the read (AR/R) and write (AW/W/B) channels of a master from a bytearray,
with random ready/valid delays, random read and write-response latency and any number of
bursts in flight (one ID, in order). It asserts the AXI rules the DMA engines promise: INCR
bursts of the full bus size, at most 256 beats, no 4 KiB crossing, WLAST exactly on the last
beat, and every beat inside ``allowed`` (a list of ``(base, size)`` byte ranges).
"""
import random
from collections import deque

from tpugen.hdl.axi import AXI_BURST_INCR, AXI_RESP_OKAY, AXI_RESP_SLVERR

__all__ = ["AxiMemory"]



class AxiMemory:
    """``size`` bytes at address 0; bursts touching ``error_ranges`` get SLVERR responses.

    ``ready`` and ``valid`` are the probabilities that a ready/valid is offered in a cycle;
    ``latency`` is the largest number of extra cycles before read data or a write response.
    ``reads``/``writes`` count beats, ``ar``/``aw`` bursts; ``ident``: the ID of every burst;
    ``peak_writes``: the most write bursts in flight (AW taken, B not yet) at once.
    """

    def __init__(self, size, data_width, *, allowed, error_ranges=(), seed=0, ready=0.7,
                 valid=0.8, latency=6, ident=0):
        self.mem = bytearray(size)
        self.beat_bytes = data_width // 8
        self.allowed = list(allowed)
        self.error_ranges = list(error_ranges)
        self.rng = random.Random(seed)
        self.ready, self.valid, self.latency, self.ident = ready, valid, latency, ident
        self.ar = self.aw = self.reads = self.writes = 0
        self._open_reads = self._open_writes = 0
        self.peak_writes = 0

    def in_flight(self):
        """Bursts accepted whose last R beat or whose B response has not been accepted."""
        return self._open_reads + self._open_writes

    def _chance(self, p):
        return self.rng.random() < p

    def _delay(self):
        return self.rng.randint(0, self.latency)

    def _check_burst(self, kind, addr, length, size, burst, ident):
        bb = self.beat_bytes
        assert ident == self.ident, f"{kind}ID={ident}"
        assert burst == AXI_BURST_INCR, f"{kind}BURST={burst}"
        assert 1 << size == bb, f"{kind}SIZE={size} on a {bb}-byte bus"
        assert 0 <= length <= 255, f"{kind}LEN={length}"
        start = addr & ~(bb - 1)
        end = start + (length + 1) * bb
        assert start // 4096 == (end - 1) // 4096, \
            f"{kind} burst {addr:#x}+{length + 1} beats crosses a 4 KiB boundary"
        for beat in range(start, end, bb):
            assert any(base <= beat and beat + bb <= base + span for base, span in self.allowed), \
                f"{kind} beat at {beat:#x} outside the allowed ranges"
        return any(base < end and start < base + span for base, span in self.error_ranges)

    def read_process(self, bus):
        """A background testbench serving ``bus`` (an ``axi_read_signature`` master)."""
        async def process(ctx):
            bursts = deque()  # [next beat address, beats left, cycle the data is ready, error]
            cycle = 0
            arready = 0
            beat = None       # (data, resp, last) on the R channel
            while True:
                ctx.set(bus.arready, arready)
                if beat is None and bursts and bursts[0][2] <= cycle and self._chance(self.valid):
                    burst = bursts[0]
                    addr = burst[0]
                    beat = (int.from_bytes(self.mem[addr:addr + self.beat_bytes], "little"),
                            AXI_RESP_SLVERR if burst[3] else AXI_RESP_OKAY, burst[1] == 1)
                    burst[0] += self.beat_bytes
                    burst[1] -= 1
                    if burst[1] == 0:
                        bursts.popleft()
                ctx.set(bus.rvalid, beat is not None)
                if beat is not None:
                    ctx.set(bus.rdata, beat[0])
                    ctx.set(bus.rresp, beat[1])
                    ctx.set(bus.rlast, beat[2])
                    ctx.set(bus.rid, self.ident)
                _, _, arvalid, araddr, arlen, arsize, arburst, arid, rready = \
                    await ctx.tick().sample(bus.arvalid, bus.araddr, bus.arlen, bus.arsize,
                                            bus.arburst, bus.arid, bus.rready)
                cycle += 1
                if arvalid and arready:
                    error = self._check_burst("AR", araddr, arlen, arsize, arburst, arid)
                    self.ar += 1
                    self._open_reads += 1
                    bursts.append([araddr & ~(self.beat_bytes - 1), arlen + 1,
                                   cycle + self._delay(), error])
                if beat is not None and rready:
                    self.reads += 1
                    self._open_reads -= beat[2]
                    beat = None
                arready = self._chance(self.ready)
        return process

    def write_process(self, bus):
        """A background testbench serving ``bus`` (an ``axi_write_signature`` master).

        W beats are accepted only for bursts whose AW has been accepted (a legal slave)."""
        async def process(ctx):
            bursts = deque()     # [next beat address, beats left, error]
            responses = deque()  # (cycle the response is ready, resp)
            cycle = 0
            awready = wready = 0
            response = None
            while True:
                ctx.set(bus.awready, awready)
                ctx.set(bus.wready, wready)
                if (response is None and responses and responses[0][0] <= cycle and
                        self._chance(self.valid)):
                    response = responses.popleft()[1]
                ctx.set(bus.bvalid, response is not None)
                ctx.set(bus.bresp, response or 0)
                ctx.set(bus.bid, 0)
                (_, _, awvalid, awaddr, awlen, awsize, awburst, awid, wvalid, wdata, wstrb,
                 wlast, bready) = await ctx.tick().sample(
                    bus.awvalid, bus.awaddr, bus.awlen, bus.awsize, bus.awburst, bus.awid,
                    bus.wvalid, bus.wdata, bus.wstrb, bus.wlast, bus.bready)
                cycle += 1
                if wvalid and wready:
                    burst = bursts[0]
                    assert bool(wlast) == (burst[1] == 1), \
                        f"WLAST={wlast} with {burst[1]} beats left in the burst"
                    data = wdata.to_bytes(self.beat_bytes, "little")
                    for i in range(self.beat_bytes):
                        if wstrb >> i & 1:
                            self.mem[burst[0] + i] = data[i]
                    self.writes += 1
                    burst[0] += self.beat_bytes
                    burst[1] -= 1
                    if burst[1] == 0:
                        bursts.popleft()
                        responses.append((cycle + self._delay(),
                                          AXI_RESP_SLVERR if burst[2] else AXI_RESP_OKAY))
                if awvalid and awready:
                    error = self._check_burst("AW", awaddr, awlen, awsize, awburst, awid)
                    self.aw += 1
                    self._open_writes += 1
                    self.peak_writes = max(self.peak_writes, self._open_writes)
                    bursts.append([awaddr & ~(self.beat_bytes - 1), awlen + 1, error])
                if response is not None and bready:
                    self._open_writes -= 1
                    response = None
                awready = self._chance(self.ready)
                wready = bool(bursts) and self._chance(self.ready)
        return process
