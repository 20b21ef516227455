"""An AXI4 memory that uses every freedom AXI4 gives a slave, to find the masters that rely on
more than the protocol promises.

`HostileAxiRam` is cocotbext-axi's AxiRam with the burst processes of `LatencyAxiRam`
(sim/latency_ram.py: every AR taken at once, many bursts in flight) and, each switchable:

* ``aw_waits_for_w``: AWREADY stays low until the W channel has presented (WVALID high) the
  first beat of the burst that AW belongs to (AMBA AXI4 A3.3.1 allows it); W beats are taken
  before their AW (cocotbext-axi's W sink holds two);
* ``stall``: every channel (AW, W, B, AR, R) paused at random with this probability a cycle;
* ``read_latency`` / ``write_latency``: (least, most) clock cycles from a burst to its data or
  its response, drawn per burst;
* ``reorder``: the responses of different IDs interleaved beat by beat at random, and a later
  burst of one ID may overtake an earlier burst of another (those of one ID stay in order).

All randomness comes from ``seed``.
"""
import random

from cocotbext.axi.memory import Memory

from .axi_bursts import random_pauses
from .latency_ram import _LatencyRead, _LatencyWrite

__all__ = ["HostileAxiRam"]

def _latency(name, value):
    """(least, most) clock cycles, checked."""
    if not (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] <= value[1]):
        raise ValueError(f"{name}={value!r} is invalid: allowed (least, most) cycles, "
                         f"0 <= least <= most")
    return value


class _AwWaitsForW:
    """The pause generator of the AW channel: paused while the W channel has not presented the
    first beat of the next AW's burst (W bursts started vs AW accepted), and when ``stalls``
    says so.

    cocotbext-axi's sink applies a pause one or two cycles after the generator sets it, so the
    gate opens for one cycle at a time, at most every third cycle, and the AW sink takes one AW
    at a time (it is full, AWREADY low, from the cycle after a handshake until its burst process
    takes the AW): one opening lets at most one AW through, and the next opening knows of it.
    """

    def __init__(self, bus, stalls):
        self.bus, self.stalls = bus, stalls
        self.held = 0
        """Cycles that AWVALID was high and AWREADY held low for want of W data."""
        self.clear()

    def clear(self):
        """Forget every burst (a reset)."""
        self.w_started = self.aw_accepted = 0
        self.in_burst = False
        self.shut = 0  # cycles the gate stays shut after an opening

    def __iter__(self):
        return self

    def __next__(self):
        aw, w = self.bus.aw, self.bus.w
        awvalid = bool(aw.awvalid.value)
        if awvalid and aw.awready.value:
            assert self.w_started > self.aw_accepted, "AWREADY rose before the burst's WVALID"
            self.aw_accepted += 1
        if w.wvalid.value:
            if not self.in_burst:
                self.w_started += 1
                self.in_burst = True
            if w.wready.value and w.wlast.value:
                self.in_burst = False
        waiting = self.w_started <= self.aw_accepted
        self.held += awvalid and waiting
        stalled = next(self.stalls)
        if waiting or self.shut or stalled:
            self.shut = max(0, self.shut - 1)
            return True
        self.shut = 2
        return False


class _HostileWrite(_LatencyWrite):
    def __init__(self, gate, *args, **kwargs):
        self.gate = gate
        super().__init__(*args, **kwargs)

    def _handle_reset(self, state):
        if self.gate is not None:
            self.gate.clear()
        super()._handle_reset(state)


class HostileAxiRam(Memory):
    """A drop-in for cocotbext-axi's ``AxiRam`` (same constructor, ``read`` / ``write``,
    ``read_if`` / ``write_if``) that uses the slave's freedoms of AXI4 (see the module); all on
    by default. ``aw_held`` counts the cycles AWVALID waited for W data, ``overtaken`` the
    responses that went before an earlier request's."""

    def __init__(self, bus, clock, reset=None, reset_active_level=True, size=2**64, mem=None, *,
                 seed=0, aw_waits_for_w=True, stall=0.3, read_latency=(0, 64),
                 write_latency=(0, 64), reorder=True, **kwargs):
        super().__init__(size, mem, **kwargs)
        if not (isinstance(stall, (int, float)) and 0 <= stall < 1):
            raise ValueError(f"stall={stall!r} is invalid: allowed a probability in [0, 1)")
        rng = random.Random(seed)
        stalls = {name: random_pauses(rng, stall) for name in ("aw", "w", "b", "ar", "r")}
        self.aw_gate = _AwWaitsForW(bus.write, stalls["aw"]) if aw_waits_for_w else None
        self.write_if = _HostileWrite(self.aw_gate, _latency("write_latency", write_latency),
                                      rng, reorder, bus.write, clock, reset, reset_active_level,
                                      mem=self.mem)
        self.read_if = _LatencyRead(_latency("read_latency", read_latency), rng, reorder,
                                    bus.read, clock, reset, reset_active_level, mem=self.mem)
        if self.aw_gate is not None:
            self.write_if.aw_channel.queue_occupancy_limit = 1
        for name, half in (("aw", self.write_if), ("w", self.write_if), ("b", self.write_if),
                           ("ar", self.read_if), ("r", self.read_if)):
            pauses = self.aw_gate if name == "aw" and self.aw_gate else stall and stalls[name]
            if pauses:
                getattr(half, f"{name}_channel").set_pause_generator(pauses)

    @property
    def aw_held(self):
        return self.aw_gate.held if self.aw_gate else 0

    @property
    def overtaken(self):
        return self.read_if.overtaken + self.write_if.overtaken
