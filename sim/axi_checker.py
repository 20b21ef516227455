"""A checker of the core's AXI4 master port, on every clock cycle of a simulation.

Rules of AMBA AXI4 for a master:

* ARVALID, AWVALID and WVALID, once high, stay high until the handshake (A3.2.1);
* the payload of AR, AW and W does not change while VALID waits for READY (A3.2.1);
* W bursts match AW bursts in order, whichever comes first (W may lead its AW, A3.3.1): a burst
  has AWLEN + 1 beats, WLAST on the last one only (A3.4.1);
* WSTRB enables only byte lanes of the beat's bytes (A3.4.3, A3.4.1);
* no burst crosses a 4 KiB boundary (A3.4.1).

And the core's own contract: INCR bursts of full-width beats; every burst inside the access
windows latched at START (`latch`), whatever the host writes to the window registers during
the run; at most ``max_reads`` read and ``max_writes`` write bursts in flight.

R and B are only counted (the slave drives them; RREADY and BREADY may stay high). The checker
counts the handshakes it saw (``handshakes``): a checker that saw nothing checked nothing.
"""
from collections import deque

import cocotb
from cocotb.triggers import FallingEdge, RisingEdge

from ..arch import MAX_OUTSTANDING
from ..isa import NUM_WINDOWS

__all__ = ["AxiChecker", "AxiRules"]

_INCR = 1
_PAGE = 4096


class _Channel:
    """VALID, READY and payload of one master-driven channel; `sample` checks the handshake
    rules for one clock edge."""

    def __init__(self, name, port, valid, ready, payload):
        self.name = name
        self.valid, self.ready = port(valid), port(ready)
        self.payload = [port(signal) for signal in payload]
        self.waiting = None  # the payload that waited for READY at the previous edge

    def sample(self, report):
        """The payload (a tuple of ints) on a handshake at this edge, else None."""
        if not self.valid.value:
            if self.waiting is not None:
                report(f"{self.name}VALID fell before {self.name}READY (payload {self.waiting})")
                self.waiting = None
            return None
        payload = tuple(int(signal.value) for signal in self.payload)
        if self.waiting is not None and payload != self.waiting:
            report(f"{self.name} payload changed while waiting for {self.name}READY: "
                   f"{self.waiting} -> {payload}")
        if self.ready.value:
            self.waiting = None
            return payload
        self.waiting = payload
        return None


class AxiRules:
    """The checks of `AxiChecker`, one clock edge at a time (`edge`), on the signals of the
    master port ``<prefix>_*`` of ``dut``; no simulator needed.

    Violations go to ``errors`` (strings), so one does not hide the rest; ``windows``: the
    (base, size, readable, writable) latched by `latch`, none before; ``count``: the windows the
    core has (`CoreConfig.windows`), the first ones of those the host writes.
    """

    def __init__(self, dut, *, prefix="m_axi", max_reads=MAX_OUTSTANDING + 1,
                 max_writes=MAX_OUTSTANDING, count=NUM_WINDOWS):
        """``max_reads``: the load engine's bursts and one instruction fetch."""
        self.max_in_flight = {"read": max_reads, "write": max_writes}
        self.count = count
        self.windows = []
        self.errors = []
        self.handshakes = dict.fromkeys(("AR", "AW", "W", "R", "B"), 0)
        self.cycle = 0

        def port(name):
            return getattr(dut, f"{prefix}_{name}")

        self.bytes_per_beat = len(port("wdata")) // 8
        self._ar = _Channel("AR", port, "arvalid", "arready",
                            ("araddr", "arlen", "arsize", "arburst"))
        self._aw = _Channel("AW", port, "awvalid", "awready",
                            ("awaddr", "awlen", "awsize", "awburst"))
        self._w = _Channel("W", port, "wvalid", "wready", ("wstrb", "wlast", "wdata"))
        self._r = [port(name) for name in ("rvalid", "rready", "rlast")]
        self._b = [port(name) for name in ("bvalid", "bready")]
        self.clear()

    def latch(self, windows):
        """The windows a program is started with (of them, the core's ``count``): every burst
        from now on must lie in them."""
        self.windows = list(windows)[:self.count]

    def stats(self):
        """Handshakes seen and errors found (the first 20), as plain data; taken at the end of
        a test, when the bus must be quiet, so a W burst still without its AW (or the reverse)
        is an error too."""
        errors = self.errors + self._unfinished()
        return {"handshakes": dict(self.handshakes), "errors": errors[:20],
                "error_count": len(errors)}

    def _unfinished(self):
        """Errors for the write bursts left half done: W without AW, AW without all its W."""
        errors = [f"a W burst of {len(strobes)} beats without its AW" for strobes in self._early]
        if self._strobes and not self._aws:
            errors.append(f"{len(self._strobes)} W beats without their AW")
        errors += [f"AW {address:#x} of {beats} beats without all its W beats"
                   for address, _, beats in self._aws]
        return errors

    def clear(self):
        """Forget the bursts in flight (a hard reset drops them on both sides)."""
        self._in_flight = {"read": 0, "write": 0}
        self._aws = deque()     # (address, bytes per beat, beats) of AWs whose W burst is open
        self._early = deque()   # WSTRB per beat of W bursts that ended before their AW
        self._strobes = []      # WSTRB per beat of the W burst under way
        for channel in (self._ar, self._aw, self._w):
            channel.waiting = None

    def _report(self, message):
        self.errors.append(f"cycle {self.cycle}: {message}")

    def edge(self):
        """Check the signals as they are at a rising clock edge."""
        self.cycle += 1
        counts, report = self.handshakes, self._report
        if (ar := self._ar.sample(report)) is not None:
            self._request("read", "AR", ar)
        if (aw := self._aw.sample(report)) is not None:
            self._request("write", "AW", aw)
            self._address(aw[0], 1 << aw[2], aw[1] + 1)
        if (w := self._w.sample(report)) is not None:
            counts["W"] += 1
            self._beat(w[0], bool(w[1]))
        rvalid, rready, rlast = self._r
        if rvalid.value and rready.value:
            counts["R"] += 1
            if rlast.value:
                self._in_flight["read"] -= 1
        bvalid, bready = self._b
        if bvalid.value and bready.value:
            counts["B"] += 1
            self._in_flight["write"] -= 1

    def _request(self, kind, channel, payload):
        """An AR or AW handshake: one more burst in flight, and the burst checked."""
        self.handshakes[channel] += 1
        self._in_flight[kind] += 1
        if self._in_flight[kind] > self.max_in_flight[kind]:
            self._report(f"{self._in_flight[kind]} {kind} bursts in flight, at most "
                         f"{self.max_in_flight[kind]}")
        self._check_burst(kind, *payload)

    def _check_burst(self, kind, address, length, size, burst):
        nbytes = (length + 1) << size
        if burst != _INCR:
            self._report(f"{kind} {address:#x}: burst type {burst}, expected INCR")
        if 1 << size != self.bytes_per_beat:
            self._report(f"{kind} {address:#x}: {1 << size} bytes per beat on a "
                         f"{self.bytes_per_beat}-byte bus")
        if address // _PAGE != (address + nbytes - 1) // _PAGE:
            self._report(f"{kind} {address:#x}+{nbytes}: crosses a 4 KiB boundary")
        start = address - address % self.bytes_per_beat
        allowed = [(b, s) for b, s, r, w in self.windows if (r if kind == "read" else w)]
        if not any(b <= start and start + nbytes <= b + s for b, s in allowed):
            self._report(f"{kind} {address:#x}+{nbytes}: outside every {kind} window latched "
                         f"at START {self.windows}")

    def _address(self, address, size, beats):
        """An AW handshake: the next W burst without an AW is this one's."""
        aw = (address, size, beats)
        if self._early:
            strobes = self._early.popleft()
            for n, strobe in enumerate(strobes):
                self._check_beat(aw, n, strobe, n == len(strobes) - 1)
            return
        self._aws.append(aw)
        if len(self._aws) == 1:  # the W burst under way, if any, is this AW's
            for n, strobe in enumerate(self._strobes):
                self._check_beat(aw, n, strobe, False)

    def _beat(self, strobe, last):
        """A W handshake: checked against its AW if that is known, else kept until it is."""
        n = len(self._strobes)
        self._strobes.append(strobe)
        if self._aws:
            self._check_beat(self._aws[0], n, strobe, last)
        if last:
            if self._aws:
                self._aws.popleft()
            else:
                self._early.append(self._strobes)
            self._strobes = []

    def _check_beat(self, aw, n, strobe, last):
        """Beat ``n`` of the W burst of ``aw`` (address, bytes per beat, beats): WLAST on the
        last beat only, WSTRB within the beat's bytes."""
        address, size, beats = aw
        if n >= beats:
            self._report(f"W beat {n + 1} of a burst of {beats} (AWADDR {address:#x}): no WLAST")
            return
        if last != (n == beats - 1):
            self._report(f"W beat {n + 1} of {beats} (AWADDR {address:#x}): WLAST={int(last)}")
        aligned = address - address % size
        first = address if n == 0 else aligned + n * size
        lane = first % self.bytes_per_beat
        lanes = ((1 << (aligned + (n + 1) * size - first)) - 1) << lane
        if strobe & ~lanes:
            self._report(f"W beat {n + 1} of {beats} (AWADDR {address:#x}): WSTRB "
                         f"{strobe:#x} outside the beat's byte lanes {lanes:#x}")


class AxiChecker(AxiRules):
    """`AxiRules` on every rising edge of ``dut.clk`` of a cocotb simulation; while ``dut.rst``
    is high nothing is checked and the bursts in flight are forgotten."""

    def __init__(self, dut, **options):
        super().__init__(dut, **options)
        self.dut = dut
        self._resetting = False
        cocotb.start_soon(self._watch())
        cocotb.start_soon(self._track_reset())

    async def _track_reset(self):
        while True:
            await RisingEdge(self.dut.rst)
            self._resetting = True
            await FallingEdge(self.dut.rst)
            self._resetting = False

    async def _watch(self):
        clock_edge = RisingEdge(self.dut.clk)
        while True:
            await clock_edge
            if self._resetting:
                self.clear()
            else:
                self.edge()
