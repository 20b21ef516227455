"""`AxiRules`, the checks of the AXI checker every simulation of the core runs, on hand-made
signal traces: each rule reports the master that breaks it, and passes the one that keeps it."""
from types import SimpleNamespace

import pytest

from tpugen.arch import MAX_OUTSTANDING
from tpugen.sim.axi_checker import AxiRules

BEAT = 8
"""Bytes per beat (a 64-bit bus)."""
WINDOWS = [(0x1000, 0x1000, True, False), (0x4000, 0x1000, False, True)]
SIGNALS = ("arvalid arready araddr arlen arsize arburst awvalid awready awaddr awlen awsize "
           "awburst wvalid wready wstrb wlast wdata rvalid rready rlast bvalid bready").split()


class _Signal(SimpleNamespace):
    def __len__(self):
        return 8 * BEAT


class _Bus:
    """The master port's signals, all 0 (INCR, full-width beats once a burst is set)."""

    def __init__(self):
        self.dut = SimpleNamespace(**{f"m_axi_{name}": _Signal(value=0) for name in SIGNALS})
        self.rules = AxiRules(self.dut)
        self.rules.latch(WINDOWS)

    def cycle(self, **values):
        """Set ``values`` (the rest stay, but every VALID falls after the edge), a clock edge."""
        for name, value in values.items():
            getattr(self.dut, f"m_axi_{name}").value = value
        self.rules.edge()
        for name in SIGNALS:
            if name.endswith("valid"):
                getattr(self.dut, f"m_axi_{name}").value = 0

    def read(self, address, beats=1, ready=1):
        self.cycle(arvalid=1, arready=ready, araddr=address, arlen=beats - 1, arsize=3,
                   arburst=1)

    def address(self, address, beats, ready=1):
        self.cycle(awvalid=1, awready=ready, awaddr=address, awlen=beats - 1, awsize=3,
                   awburst=1)

    def beats(self, strobes, last_at):
        for n, strobe in enumerate(strobes):
            self.cycle(wvalid=1, wready=1, wstrb=strobe, wlast=int(n == last_at))

    @property
    def errors(self):
        return self.rules.errors


def test_w_may_lead_its_aw_and_every_handshake_is_counted():
    bus = _Bus()
    bus.beats([0xFF, 0xFF], last_at=1)     # a whole W burst before its AW
    bus.beats([0xFF], last_at=0)           # and the next one's
    bus.address(0x4000, 2)
    bus.address(0x4010, 1)
    bus.address(0x4018, 3)
    bus.beats([0xFF, 0xFF, 0x0F], last_at=2)  # after it
    bus.read(0x1000, 4)
    bus.cycle(rvalid=1, rready=1, rlast=1, bvalid=1, bready=1)
    assert bus.errors == []
    assert bus.rules.handshakes == {"AR": 1, "AW": 3, "W": 6, "R": 1, "B": 1}


@pytest.mark.parametrize("lead", [False, True], ids=["aw-first", "w-first"])
@pytest.mark.parametrize("sent,last_at,expected", [
    (2, 1, ["W beat 2 of 3 (AWADDR 0x4000): WLAST=1"]),
    (4, 3, ["W beat 3 of 3 (AWADDR 0x4000): WLAST=0",
            "W beat 4 of a burst of 3 (AWADDR 0x4000): no WLAST"]),
], ids=["early", "late"])
def test_wlast_must_end_the_burst_of_awlen_plus_one_beats(lead, sent, last_at, expected):
    bus = _Bus()
    if lead:
        bus.beats([0xFF] * sent, last_at)
        bus.address(0x4000, 3)
    else:
        bus.address(0x4000, 3)
        bus.beats([0xFF] * sent, last_at)
    assert [e.split(": ", 1)[1] for e in bus.errors] == expected


def test_valid_must_hold_until_ready_with_a_stable_payload():
    bus = _Bus()
    bus.read(0x1000, ready=0)
    bus.read(0x1040, ready=0)
    bus.cycle()
    assert len(bus.errors) == 2
    assert "AR payload changed while waiting for ARREADY" in bus.errors[0]
    assert "ARVALID fell before ARREADY" in bus.errors[1]


def test_bursts_stay_in_the_latched_windows_and_their_pages():
    bus = _Bus()
    bus.read(0x1FF8, beats=1)
    bus.read(0x1FF8, beats=2)      # crosses 0x2000: a page and the window
    bus.address(0x1000, 1)         # a read-only window
    bus.beats([0xFF], last_at=0)
    bus.rules.latch([(0, 1 << 20, True, True)])
    bus.address(0x1000, 1)
    bus.beats([0xFF], last_at=0)
    assert [e.split(": ", 1)[1][:40] for e in bus.errors] == [
        "read 0x1ff8+16: crosses a 4 KiB boundary",
        "read 0x1ff8+16: outside every read windo",
        "write 0x1000+8: outside every write wind"]


def test_strobes_stay_in_the_bytes_of_the_beat():
    bus = _Bus()
    bus.address(0x4004, 2)                # the first beat holds bytes 4..7 of its word
    bus.beats([0xF0, 0xFF], last_at=1)
    assert bus.errors == []
    bus.address(0x4004, 1)
    bus.beats([0x1F], last_at=0)
    assert len(bus.errors) == 1 and "WSTRB 0x1f outside the beat's byte lanes 0xf0" in bus.errors[0]


def test_outstanding_bursts_are_bounded():
    bus = _Bus()
    for n in range(MAX_OUTSTANDING + 2):
        bus.read(0x1000 + 64 * n)
    for n in range(MAX_OUTSTANDING + 1):
        bus.address(0x4000 + 8 * n, 1)
    assert [e.split(": ", 1)[1] for e in bus.errors] == [
        f"{MAX_OUTSTANDING + 2} read bursts in flight, at most {MAX_OUTSTANDING + 1}",
        f"{MAX_OUTSTANDING + 1} write bursts in flight, at most {MAX_OUTSTANDING}"]


def test_a_write_burst_left_half_done_is_an_error_at_the_end():
    """At the end of a test (a quiet bus) a W burst without its AW, W beats without their AW and
    an AW without all its W beats are errors; matched bursts are not."""
    bus = _Bus()
    bus.address(0x4000, 1)
    bus.beats([0xFF], last_at=0)
    assert bus.rules.stats()["errors"] == []
    bus.beats([0xFF], last_at=0)       # a whole W burst, and no AW comes
    bus.beats([0xFF], last_at=-1)      # a beat of the next one
    assert bus.rules.stats()["errors"] == ["a W burst of 1 beats without its AW",
                                           "1 W beats without their AW"]
    other = _Bus()
    other.address(0x4000, 2)
    other.beats([0xFF], last_at=-1)
    assert other.rules.stats()["errors"] == ["AW 0x4000 of 2 beats without all its W beats"]
