"""A cocotb monitor of the core's AXI4 master: every burst inside the windows and by the rules."""
import cocotb
from cocotb.triggers import RisingEdge

__all__ = ["AxiMonitor"]


class AxiMonitor:
    """Checks each AR/AW handshake and W beat on ``<prefix>_*`` ports of ``dut``.

    ``windows`` is a list of (base, size, readable, writable). Violations are collected in
    ``errors`` (checked by the test), so one bad burst does not hide the rest.
    """

    def __init__(self, dut, windows, prefix="m_axi"):
        self.dut = dut
        self.windows = windows
        self.prefix = prefix
        self.errors = []
        self.reads = self.writes = 0
        self._w_bursts = []  # beats expected per accepted AW, in order
        self._w_beats = 0
        self.bytes_per_beat = len(self._port("wdata")) // 8
        cocotb.start_soon(self._watch())
        cocotb.start_soon(self._forget_on_reset())

    async def _forget_on_reset(self):
        """A hard reset drops the write bursts in flight on both sides of the bus."""
        while True:
            await RisingEdge(self.dut.rst)
            self._w_bursts.clear()
            self._w_beats = 0

    def _port(self, name):
        return getattr(self.dut, f"{self.prefix}_{name}")

    def _check_burst(self, kind, addr, length, size, burst):
        nbytes = (length + 1) << size
        if burst != 1:
            self.errors.append(f"{kind} {addr:#x}: burst type {burst}, expected INCR")
        if 1 << size != self.bytes_per_beat:
            self.errors.append(f"{kind} {addr:#x}: size {1 << size} bytes per beat")
        if addr // 4096 != (addr + nbytes - 1) // 4096:
            self.errors.append(f"{kind} {addr:#x}+{nbytes}: crosses a 4 KiB boundary")
        start = addr - addr % self.bytes_per_beat
        allowed = [(b, s) for b, s, r, w in self.windows if (r if kind == "read" else w)]
        if not any(b <= start and start + nbytes <= b + s for b, s in allowed):
            self.errors.append(f"{kind} {addr:#x}+{nbytes}: outside every {kind} window")

    async def _watch(self):
        port = self._port
        while True:
            await RisingEdge(self.dut.clk)
            if port("arvalid").value and port("arready").value:
                self.reads += 1
                self._check_burst("read", int(port("araddr").value), int(port("arlen").value),
                                  int(port("arsize").value), int(port("arburst").value))
            if port("awvalid").value and port("awready").value:
                self.writes += 1
                self._check_burst("write", int(port("awaddr").value), int(port("awlen").value),
                                  int(port("awsize").value), int(port("awburst").value))
                self._w_bursts.append(int(port("awlen").value) + 1)
            if port("wvalid").value and port("wready").value:
                self._w_beats += 1
                expected = self._w_bursts[0] if self._w_bursts else None
                last = bool(port("wlast").value)
                if expected is not None and last != (self._w_beats == expected):
                    self.errors.append(f"write beat {self._w_beats} of {expected}: wlast={last}")
                if last:
                    self._w_beats = 0
                    if self._w_bursts:
                        self._w_bursts.pop(0)
