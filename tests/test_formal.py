"""Formal proofs (SymbiYosys, smtbmc + Yices) of the bus rules, the DMA engines, the burst
planner, the controller, the configuration freeze and the soft-reset quiescer; see
docs/formal.md.

TPUGEN_FORMAL_DEPTH=N runs every bounded proof and cover to depth N (at least the defaults)
and adds the long whole-core proofs. k-induction lengths do not change.
"""
import gc
import os

import pytest
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tpugen import PRESETS, CoreConfig
from tpugen.arch import PLAN_DEPTH
from tpugen.hdl.axi import (AXI_BURST_INCR, axi_lite_signature, axi_read_signature,
                            axi_write_signature)
from tpugen.hdl.store import W_DEPTH
from tpugen.sim.formal import (AxiLiteSlaveRules, AxiReadRules, AxiWriteRules,
                               BurstPlannerHarness, ConfigFreezeHarness, ControllerHarness,
                               ControlRegistersHarness, CoreHarness, Harness, LoadEngineHarness,
                               QuiescerHarness, StoreEngineHarness, TokenRules, prove)

ENGINES = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32)
# Four beats per instruction, so two instructions and their tokens fit in the depth.
CONTROLLER = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=128)
CORE = CONTROLLER  # the whole core: a fetch and its four beats early enough for a soft reset
EXTRA_DEPTH = int(os.environ.get("TPUGEN_FORMAL_DEPTH", "0"))
whole_core = pytest.mark.skipif(not EXTRA_DEPTH, reason="a long whole-core proof: "
                                "TPUGEN_FORMAL_DEPTH=N runs it (docs/formal.md)")


def depth(default):
    return max(default, EXTRA_DEPTH)


def explain(result):
    return (f"{result.name} ({result.mode}, depth {result.depth}): {result.status} in "
            f"{result.seconds:.0f} s ({result.cpu_seconds:.0f} s of CPU); "
            f"{'; '.join(result.failures) or 'no failure listed'}; "
            f"trace {result.trace}\n{result.log[-3000:]}")


def check(result):
    assert result.passed, explain(result)


class KnownFinding(Exception):
    """The proof fails on exactly the property of a reported HDL bug."""


def check_known(result, message):
    """Pass if the proof passes (the bug is fixed: the strict xfail then reports XPASS); raise
    KnownFinding if only ``message`` fails; fail on anything else."""
    if result.passed:
        return
    if result.status == "FAIL" and result.failures and all(
            failure.startswith(message) for failure in result.failures):
        raise KnownFinding(explain(result))
    pytest.fail(explain(result))


# The components of the core.

def test_control_registers_axi_lite_slave_by_induction(tmp_path):
    """k-induction closes: the AXI4-Lite rules hold in every reachable state."""
    check(prove(ControlRegistersHarness(ENGINES), "csr", tmp_path, mode="prove", depth=4))


def test_control_registers_covers(tmp_path):
    check(prove(ControlRegistersHarness(ENGINES), "csr_cover", tmp_path, mode="cover",
                depth=depth(6)))


def test_load_engine_read_master(tmp_path):
    check(prove(LoadEngineHarness(ENGINES), "load", tmp_path, depth=depth(12)))


def test_load_engine_covers(tmp_path):
    """Within the depth a LOAD completes, with two bursts in flight and one of several beats."""
    check(prove(LoadEngineHarness(ENGINES), "load_cover", tmp_path, mode="cover",
                depth=depth(14)))


def test_store_engine_write_master(tmp_path):
    """Every rule, the windows included; no W beat is possible this early (the first at 16)."""
    check(prove(StoreEngineHarness(ENGINES), "store", tmp_path, depth=depth(13)))


def test_store_engine_w_channel(tmp_path):
    """Past the first W beats (cycle 16 on, before their AW handshake as the slave may wait for
    WVALID; the last beat of a burst of several at 17): every rule but the windows, which
    `test_burst_planner_by_induction` proves for every depth."""
    check(prove(StoreEngineHarness(ENGINES, windows=False), "store_w", tmp_path,
                depth=depth(18)))


def test_store_engine_covers(tmp_path):
    """Within the depth, against a slave that raises AWREADY only once the burst's W is offered
    (AXI4 lets it wait for WVALID): a STORE that wrote completes, with a burst of several beats,
    two in flight and W beats accepted before their AW handshake. (Before 5efc626 the engine
    waited for AWREADY first: none of these was reached.) Reached under this slave, each is
    reachable under any."""
    check(prove(StoreEngineHarness(ENGINES, w_first=True), "store_cover", tmp_path,
                mode="cover", depth=depth(26)))


PLANNERS = {"load": dict(max_steps=PLAN_DEPTH // 4, max_beats=256, permission="read"),
            "store": dict(max_steps=256, max_beats=W_DEPTH // 2, permission="write")}
"""The burst planners of the engines (the store's ``max_steps`` is 256 per 32-bit word of a
beat: 256 is the smallest, the bound that matters for the counters)."""


@pytest.mark.parametrize("engine", PLANNERS)
@pytest.mark.parametrize("width", [32, 64, 128])
def test_burst_planner_by_induction(tmp_path, engine, width):
    """k-induction closes: for every depth, no burst crosses 4 KiB or has too many beats, no
    element outside the windows (any of the four) or with an overflowing address is taken, and
    every beat of a burst is one an element was taken in."""
    check(prove(BurstPlannerHarness(width // 8, **PLANNERS[engine]), "planner", tmp_path,
                mode="prove", depth=2))


@pytest.mark.parametrize("width", [32, 64, 128])
def test_burst_planner_covers(tmp_path, width):
    """Bursts of several beats, one ending at a 4 KiB boundary, each window the only one
    granting a burst, and a refused element."""
    check(prove(BurstPlannerHarness(width // 8, **PLANNERS["store"]), "planner_cover", tmp_path,
                mode="cover", depth=depth(6)))


def test_configuration_frozen_during_a_run_by_induction(tmp_path):
    """k-induction closes: whatever a free host writes, the program base and length, watchdog
    and windows stay those of the START while the controller runs (on the RTL before the
    registers were locked the base case fails at step 4)."""
    check(prove(ConfigFreezeHarness(CONTROLLER, fetch=False), "freeze", tmp_path, mode="prove",
                depth=6))


def test_fetch_keeps_the_configuration_of_its_start(tmp_path):
    """The fetch under the read-master rules against the windows captured at START, a host
    writing any register meanwhile: ARADDR stable while ARVALID waits, every beat inside a
    window of the START."""
    # 13: the fetch starts a cycle after START's window check (CHECK).
    check(prove(ConfigFreezeHarness(CONTROLLER), "freeze_fetch", tmp_path, depth=depth(13)))


def test_configuration_freeze_covers(tmp_path):
    """A write to a locked register is refused mid-run, a fetch goes out and its burst
    completes."""
    check(prove(ConfigFreezeHarness(CONTROLLER), "freeze_cover", tmp_path, mode="cover",
                depth=depth(20)))


def test_quiescer_at_the_ports(tmp_path):
    """A soft reset in any bus state: the ports keep the AXI4 rules (found by this proof and
    fixed: a W beat waiting for WREADY had its WDATA and WSTRB replaced by zeros), W never goes
    before its AW is presented (it did on 5efc626), the bus is clean when the quiescer lets go,
    and the datapath's new bursts get their own responses."""
    check(prove(QuiescerHarness(ENGINES), "quiesce", tmp_path, depth=depth(10)))


def test_quiescer_covers(tmp_path):
    """A soft reset in each of QUIESCE_STATES, each followed by a new burst that completes."""
    check(prove(QuiescerHarness(ENGINES), "quiesce_cover", tmp_path, mode="cover",
                depth=depth(8)))


def test_core_soft_reset_at_the_ports(tmp_path):
    """The whole core, the host issuing soft resets and STARTs at any time: the AXI4 rules at
    the ports and the bus clean when the quiescer lets go (a soft reset can find a fetch AR
    waiting from cycle 11)."""
    check(prove(CoreHarness(CORE), "core", tmp_path, depth=depth(14)))


@whole_core
def test_core_soft_reset_covers(tmp_path):
    """A soft reset with a fetch AR waiting and one with a fetch burst owed, each followed by a
    new run whose fetch completes (cycles 21 and 23: the datapath is reset the cycle after the
    soft reset; about 4 min of CPU)."""
    check(prove(CoreHarness(CORE), "core_cover", tmp_path, mode="cover", depth=depth(24)))


@whole_core
def test_tiny_core_soft_reset_at_the_ports(tmp_path):
    """`test_core_soft_reset_at_the_ports` on the tiny preset (32-bit bus, 4 KiB memories)."""
    check(prove(CoreHarness(PRESETS["tiny"]), "core_tiny", tmp_path, depth=depth(16)))


def test_controller_fetch_and_tokens(tmp_path):
    check(prove(ControllerHarness(CONTROLLER), "controller", tmp_path, depth=depth(14)))


def test_controller_covers(tmp_path):
    """Within the depth instructions are fetched and dispatched and tokens taken."""
    check(prove(ControllerHarness(CONTROLLER), "controller_cover", tmp_path, mode="cover",
                depth=depth(14)))


def test_controller_fetch_holds_arvalid_through_errors(tmp_path):
    """Found by this proof: the fetch used to drop ARVALID when an error stopped the core."""
    check(prove(ControllerHarness(CONTROLLER, errors=True), "controller_errors", tmp_path,
                depth=depth(8)))


@pytest.mark.xfail(raises=KnownFinding, strict=True,
                   reason="a reset engine drops its ARVALID: on the core, the quiescer at the "
                          "ports (hdl/core.py `_quiesce`) resets it once the request is taken")
def test_load_engine_soft_reset_keeps_the_bus(tmp_path):
    check_known(prove(LoadEngineHarness(ENGINES, soft_reset=True), "load_reset", tmp_path,
                      depth=depth(12)),
                "ARVALID held and AR stable until ARREADY")


@pytest.mark.xfail(raises=KnownFinding, strict=True,
                   reason="a reset engine drops its AWVALID: on the core, the quiescer at the "
                          "ports (hdl/core.py `_quiesce`) resets it once the request is taken")
def test_store_engine_soft_reset_keeps_the_bus(tmp_path):
    check_known(prove(StoreEngineHarness(ENGINES, soft_reset=True), "store_reset", tmp_path,
                      depth=depth(14)),
                "AWVALID held and AW stable until AWREADY")


# The rules themselves: each assertion fails on a component that drives the bus freely.

def _free_outputs(signature):
    """A component whose ``bus`` (of ``signature``) outputs follow its free ``drive`` inputs."""
    outputs = {name: member for name, member in signature.members.items() if member.flow == Out}

    class Free(wiring.Component):
        def __init__(self):
            super().__init__({"bus": Out(signature),
                              "drive": In(wiring.Signature(
                                  {name: Out(member.shape) for name, member in outputs.items()}))})

        def elaborate(self, platform):
            m = Module()
            m.d.comb += [getattr(self.bus, name).eq(getattr(self.drive, name)) for name in outputs]
            return m

    return Free()


class FreeHarness(Harness):
    """``rules`` watching a free component on ``signature``; ``windows`` free inputs."""

    def __init__(self, rules, signature):
        self.rules, self.signature = rules, signature
        free = {name: getattr(rules, name) for name in ("pick", "windows")
                if name in rules.signature.members}
        super().__init__(_free_outputs(signature), free)

    def constrain(self, m):
        m.submodules.rules = self.rules
        m.d.comb += [getattr(self.rules, name).eq(getattr(self.dut.bus, name))
                     for name in self.signature.members]


def failed_messages(result):
    return {failure.rsplit(" (step", 1)[0] for failure in result.failures}


KEEP_GOING = "smtbmc --keep-going yices"


def test_read_rules_catch_a_free_master(tmp_path):
    result = prove(FreeHarness(AxiReadRules(32, 1), axi_read_signature(32)), "free_read",
                   tmp_path, depth=4, engine=KEEP_GOING)
    assert failed_messages(result) == {
        "ARVALID held and AR stable until ARREADY", "AR: an INCR burst of full, aligned beats",
        "AR: burst crosses a 4 KiB boundary", "AR: a beat outside every read window",
        "AR: one ID", "AR: more than 1 bursts in flight"}, explain(result)


def test_write_rules_catch_a_free_master(tmp_path):
    result = prove(FreeHarness(AxiWriteRules(32, 1), axi_write_signature(32)), "free_write",
                   tmp_path, depth=4, engine=KEEP_GOING)
    assert failed_messages(result) == {
        "AWVALID held and AW stable until AWREADY", "AW: an INCR burst of full, aligned beats",
        "AW: burst crosses a 4 KiB boundary", "AW: a beat outside every write window",
        "AW: one ID", "AW: more than 1 bursts in flight",
        "WVALID held and WLAST stable until WREADY", "WDATA and WSTRB stable until WREADY",
        "W: WLAST not exactly on beat AWLEN + 1",
        "W: a burst sent ahead of its AW not of AWLEN + 1 beats",
        "W: more than 1 bursts ahead of their AW"}, explain(result)


class LegalWriter(wiring.Component):
    """An AXI4 write master that keeps the rules and lets the solver (``go_aw``, ``go_w``)
    choose when each AW and W beat goes: W bursts up to two ahead of their AW, with it or after
    it. Burst k has 1 + k % 2 beats, at address 0."""

    def __init__(self):
        super().__init__({"bus": Out(axi_write_signature(32)), "go_aw": In(1), "go_w": In(1),
                          "data": In(32)})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        aws = Signal(4)     # AW handshakes
        bursts = Signal(4)  # W bursts complete
        beat = Signal()     # W beats of the current burst
        in_flight = Signal(range(3))
        aw_done = bus.awvalid & bus.awready
        w_done = bus.wvalid & bus.wready
        b_done = bus.bvalid & bus.bready
        m.d.comb += [bus.awlen.eq(aws[0]), bus.awsize.eq(2), bus.awburst.eq(AXI_BURST_INCR),
                     bus.wlast.eq(beat == bursts[0]), bus.wstrb.eq(0xf), bus.bready.eq(1)]
        m.d.sync += in_flight.eq(in_flight + aw_done - b_done)
        with m.If(aw_done):
            m.d.sync += [aws.eq(aws + 1), bus.awvalid.eq(0)]
        with m.If(~bus.awvalid & self.go_aw & (in_flight < 2)):
            m.d.sync += bus.awvalid.eq(1)
        with m.If(w_done):
            m.d.sync += [bus.wvalid.eq(0), beat.eq(Mux(bus.wlast, 0, beat + 1))]
            with m.If(bus.wlast):
                m.d.sync += bursts.eq(bursts + 1)
        with m.If((~bus.wvalid | w_done) & self.go_w &
                  (bursts + (w_done & bus.wlast) < aws + 2)):
            m.d.sync += [bus.wvalid.eq(1), bus.wdata.eq(self.data)]
        return m


class LegalHarness(Harness):
    def __init__(self):
        self.rules = AxiWriteRules(32, 2)
        super().__init__(LegalWriter())

    def constrain(self, m):
        m.submodules.rules = self.rules
        window = self.rules.windows[0]
        m.d.comb += [window.base.eq(0), window.end.eq(4096), window.write.eq(1)]
        m.d.comb += [getattr(self.rules, name).eq(getattr(self.dut.bus, name))
                     for name in axi_write_signature(32).members]


def test_write_rules_accept_w_before_with_or_after_aw(tmp_path):
    """A legal master that sends W beats before, with and after their AW passes, and the
    solver does send a W beat before its AW handshake."""
    check(prove(LegalHarness(), "legal_write", tmp_path, depth=depth(10)))
    check(prove(LegalHarness(), "legal_write_cover", tmp_path, mode="cover", depth=depth(10)))


def test_axi_lite_rules_catch_a_free_slave(tmp_path):
    result = prove(FreeHarness(AxiLiteSlaveRules(), axi_lite_signature(12).flip()), "free_lite",
                   tmp_path, depth=4, engine=KEEP_GOING)
    assert failed_messages(result) == {
        "BVALID held and B stable until BREADY", "RVALID held and R stable until RREADY",
        "B without an accepted AW and W", "R without an accepted AR",
        "AWREADY and WREADY differ", "an AW lost or answered twice",
        "a W lost or answered twice", "an AR lost or answered twice"}, explain(result)


class Alone(Harness):
    """A checker on its own, every input free."""

    def constrain(self, m):
        pass


def test_token_rules_catch_free_events(tmp_path):
    result = prove(Alone(TokenRules(2, capacity=1)), "free_tokens", tmp_path, depth=4,
                   engine=KEEP_GOING)
    assert failed_messages(result) == {
        f"tokens_{link}: {what}" for link in ("0_1", "1_0")
        for what in ("a token taken that was never given", "more than 1 tokens")}, explain(result)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("make, match", [
    (lambda: AxiReadRules(48, 8), "data_width=48"),
    (lambda: AxiWriteRules(64, 0), "max_bursts=0"),
    (lambda: AxiReadRules(32, 1, granting=5), "granting=5"),
    (lambda: AxiWriteRules(32, 1, role="monitor"), "role='monitor'"),
    (lambda: AxiLiteSlaveRules(2), "addr_width=2"),
    (lambda: TokenRules(1), "engines=1"),
    (lambda: TokenRules(3, capacity=0), "capacity=0"),
    (lambda: LoadEngineHarness("tiny"), "config='tiny'"),
    (lambda: prove(None, "x", ".", mode="pdr"), "mode='pdr'"),
    (lambda: prove(None, "x", ".", depth=0), "depth=0"),
])
def test_bad_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    gc.collect()  # the rejected component warns when collected: here, where that is filtered
