"""Formal proofs (SymbiYosys, smtbmc + Yices) of the bus rules and semaphores; see docs/formal.md.

TPUGEN_FORMAL_DEPTH=N runs every bounded proof and cover to depth N (at least the defaults).
"""
import gc
import os

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tpugen import CoreConfig
from tpugen.hdl.axi import axi_lite_signature, axi_read_signature, axi_write_signature
from tpugen.sim.formal import (AxiLiteSlaveRules, AxiReadRules, AxiWriteRules,
                               ControllerHarness, ControlRegistersHarness, Harness,
                               LoadEngineHarness, StoreEngineHarness, TokenRules, prove)

ENGINES = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32)
# Four beats per instruction, so two instructions and their tokens fit in the depth.
CONTROLLER = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=128)
EXTRA_DEPTH = int(os.environ.get("TPUGEN_FORMAL_DEPTH", "0"))


def depth(default):
    return max(default, EXTRA_DEPTH)


def explain(result):
    return (f"{result.name} ({result.mode}, depth {result.depth}): {result.status} in "
            f"{result.seconds:.0f} s; {'; '.join(result.failures) or 'no failure listed'}; "
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
                depth=depth(12)))


def test_store_engine_write_master(tmp_path):
    check(prove(StoreEngineHarness(ENGINES), "store", tmp_path, depth=depth(12)))


def test_store_engine_covers(tmp_path):
    """Within the depth a STORE completes, with a burst of several beats and two in flight."""
    check(prove(StoreEngineHarness(ENGINES), "store_cover", tmp_path, mode="cover",
                depth=depth(16)))


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
                          "ports (hdl/core.py `_quiesce`) holds the request for it")
def test_load_engine_soft_reset_keeps_the_bus(tmp_path):
    check_known(prove(LoadEngineHarness(ENGINES, soft_reset=True), "load_reset", tmp_path,
                      depth=depth(12)),
                "ARVALID held and AR stable until ARREADY")


@pytest.mark.xfail(raises=KnownFinding, strict=True,
                   reason="a reset engine drops its AWVALID: on the core, the quiescer at the "
                          "ports (hdl/core.py `_quiesce`) holds the request for it")
def test_store_engine_soft_reset_keeps_the_bus(tmp_path):
    check_known(prove(StoreEngineHarness(ENGINES, soft_reset=True), "store_reset", tmp_path,
                      depth=depth(12)),
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
        "AW: one ID", "AW: more than 1 bursts in flight", "WVALID held and W stable until WREADY",
        "W: a beat without an accepted AW",
        "W: WLAST not exactly on beat AWLEN + 1"}, explain(result)


def test_axi_lite_rules_catch_a_free_slave(tmp_path):
    result = prove(FreeHarness(AxiLiteSlaveRules(), axi_lite_signature(12)), "free_lite",
                   tmp_path, depth=4, engine=KEEP_GOING)
    assert failed_messages(result) == {
        "BVALID held and B stable until BREADY", "RVALID held and R stable until RREADY",
        "B without an accepted AW and W", "R without an accepted AR",
        "an AW lost or answered twice", "a W lost or answered twice",
        "an AR lost or answered twice"}, explain(result)


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
