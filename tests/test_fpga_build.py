"""Board builds (PLL, reset, yosys + nextpnr, report, cache) and flashing.

The real builds use a small stand-in for BoardSystem (a counter and a multiplier on the LEDs,
the UART looped back) so they take seconds, not the core's minutes; set TPUGEN_BOARD_BUILDS=1
to also build BoardSystem with a 2x2 core for each board (about 20 CPU minutes each).
"""
import gc
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path

import pytest
from amaranth import Cat, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.back import verilog
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.config import PRESETS
from tpugen.cli import main
from tpugen.fpga.boards import BOARDS, board_named
from tpugen.fpga import build as build_module
from tpugen.fpga import timing as timing_module
from tpugen.fpga.build import (BuildError, RouterWatch, _run_build, build, build_system,
                               cached_report, cell_sources, critical_paths, format_report,
                               last_build, pll_settings)
from tpugen.fpga.flash import FlashError, flash, flash_command
from tpugen.hdl.board_top import PllReset
from tpugen.hdl.core import TpuCore

TOOLS = Path(sys.executable).parent
ULX3S, ICEBREAKER = BOARDS["ulx3s-85f"], BOARDS["icebreaker"]


class StandIn(wiring.Component):
    """BoardSystem's ports around a little logic: a counter, an 8x8 multiplier, a UART loop."""
    uart_rx: In(1)
    uart_tx: Out(1)
    leds: Out(4)

    def elaborate(self, platform):
        m = Module()
        counter = Signal(24)
        a, b, product = Signal(8), Signal(8), Signal(16)
        m.d.sync += [counter.eq(counter + 1), a.eq(Cat(self.uart_rx, a[:-1])),
                     b.eq(counter[:8]), product.eq(a * b)]
        m.d.comb += [self.uart_tx.eq(self.uart_rx),
                     self.leds.eq(Cat(counter[-1], product[15], product[7], product.xor()))]
        return m


class TooManyBlockRams(StandIn):
    """128 kbit of memory: 32 iCE40 EBRs of 4 kbit, where the UP5K has 30."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = ram = memory.Memory(shape=16, depth=8192, init=[])
        write, read = ram.write_port(), ram.read_port()
        address, data = Signal(13), Signal(16)
        m.d.sync += [address.eq(Cat(self.uart_rx, address[:-1])), data.eq(data + self.uart_rx)]
        m.d.comb += [write.addr.eq(address), write.data.eq(data), write.en.eq(self.uart_rx),
                     read.addr.eq(~address), self.leds.eq(read.data[:4]),
                     self.uart_tx.eq(read.data.xor())]
        return m


# -- boards -----------------------------------------------------------------------------------

def test_unknown_board_is_a_value_error_listing_the_boards():
    with pytest.raises(ValueError, match="unknown board 'de10'.*ulx3s-85f, icebreaker"):
        board_named("de10")
    with pytest.raises(ValueError, match="ulx3s-85f, icebreaker"):
        build("ulx3s", CoreConfig())
    with pytest.raises(ValueError, match="ulx3s-85f, icebreaker"):
        flash_command("icebreaker-v2", "top.bin")


def test_cli_rejects_an_unknown_board(capsys):
    assert main(["build", "--board", "arty"]) == 2
    assert capsys.readouterr().err == ("tpugen: error: argument --board: invalid choice: 'arty' "
                                       "(choose from 'icebreaker', 'ulx3s-85f')\n")


@pytest.mark.parametrize("board", BOARDS.values(), ids=BOARDS)
def test_default_configs_leave_dsps_for_the_rest_of_the_core(board):
    for rows, cols in [(1, 1), (4, 4), board.default_array, (16, 16)]:
        config = board.default_config(rows, cols)
        assert (config.rows, config.cols) == (rows, cols)
        dsp_pes = config.macs - config.lut_multipliers
        reserved = board.reserved_dsps
        free_pes = board.pes_per_dsp * max(0, board.total("dsps") - reserved)
        assert dsp_pes == min(config.macs, free_pes)
    assert board.default_config() == board.default_config(*board.default_array)


# -- PLL and reset ------------------------------------------------------------------------------

def _vendor_pll(board, freq_mhz):
    if board.family == "ecp5":
        out = subprocess.run([TOOLS / "yowasp-ecppll", "-i", "25", "-o", str(freq_mhz)],
                             capture_output=True, text=True, check=True).stdout
        return [int(n) for n in re.findall(r"(?:Refclk|Feedback|clkout0) divisor: (\d+)", out)]
    out = subprocess.run([TOOLS / "yowasp-icepll", "-i", "12", "-o", str(freq_mhz)],
                         capture_output=True, text=True, check=True).stdout
    return [int(n) for n in re.findall(r"(?:DIVR|DIVF|DIVQ|FILTER_RANGE):\s+(\d+)", out)]


@pytest.mark.parametrize("board, freq_mhz", [(ULX3S, 50), (ULX3S, 133), (ULX3S, 33.3),
                                             (ICEBREAKER, 24), (ICEBREAKER, 25)])
def test_pll_settings_match_ecppll_and_icepll(board, freq_mhz):
    pll = pll_settings(board, freq_mhz)
    if board.family == "ecp5":
        ours = [pll.clki_div, pll.clkfb_div, pll.clkop_div]
        assert 400 <= pll.vco_mhz <= 800
    else:
        ours = [pll.divr, pll.divf, pll.divq, pll.filter_range]
        assert 533 <= pll.vco_mhz <= 1066
    assert ours == _vendor_pll(board, freq_mhz)
    assert abs(pll.output_mhz - freq_mhz) < 0.5


@pytest.mark.parametrize("board, freq_mhz", [(ULX3S, 9), (ULX3S, 401), (ICEBREAKER, 15),
                                             (ICEBREAKER, 300), (ICEBREAKER, "24")])
def test_pll_rejects_frequencies_out_of_range(board, freq_mhz):
    with pytest.raises(ValueError, match="freq_mhz="):
        pll_settings(board, freq_mhz)


def test_pll_reset_holds_until_locked_then_hold_cycles():
    hold = 5
    dut = PllReset(hold)
    rng = random.Random(7)
    # Long locked and unlocked stretches, and glitches shorter than the hold.
    locked = []
    while len(locked) < 400:
        locked += [rng.random() < 0.6] * rng.choice([1, 2, 3, hold, 2 * hold, 30])
    released = []

    async def testbench(ctx):
        sync1 = sync2 = count = 0
        reset = 1
        assert ctx.get(dut.reset) == 1
        for value in locked:
            ctx.set(dut.locked, value)
            await ctx.tick()
            reset = int(not sync2 or count != hold)
            count = 0 if not sync2 else min(count + 1, hold)
            sync1, sync2 = int(value), sync1
            assert ctx.get(dut.reset) == reset
            released.append(not reset)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert any(released) and not all(released)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("hold_cycles", [0, -1, 2.5, True])
def test_pll_reset_rejects_bad_hold(hold_cycles):
    with pytest.raises(ValueError, match="hold_cycles="):
        PllReset(hold_cycles)
    gc.collect()  # the rejected component warns when collected: here, where that is filtered


@pytest.mark.parametrize("device, bel", [(ULX3S.device, "X3/Y46/LDCC0"), ("LFE5U-25F", None)])
def test_the_datapath_reset_is_a_register_on_a_placed_dcca(device, bel):
    """On an ECP5 the datapath's reset is a flip-flop (1 at power-up) into a DCCA, placed at a
    DCC where the device is known: unplaced, nextpnr put the DCCA at the top edge's TDCC0,
    whose input router2 failed to reach in 3 of 4 placements of the ULX3S 8x8."""
    text = verilog.convert(TpuCore(PRESETS["tiny"]), name="top", emit_src=False,
                           platform=types.SimpleNamespace(family="ecp5", device=device))
    dcca = re.search(r"(\(\* BEL = \"(\S+)\" \*\)\s+)?DCCA \w+ \(([^;]*)\);", text)
    assert dcca and dcca[2] == bel
    driver = re.search(r"\.CLKI\((\w+)\)", dcca[3])[1]
    assert re.search(rf"reg {driver} = 1'h1;", text)
    assert re.search(rf"{driver} <= ", text)


# -- flash ------------------------------------------------------------------------------------

def test_flash_commands():
    assert flash_command("ulx3s-85f", "out/top.bit") == ["openFPGALoader", "-b", "ulx3s",
                                                         "out/top.bit"]
    assert flash_command(ICEBREAKER, Path("top.bin")) == ["openFPGALoader", "-b", "icebreaker",
                                                          "top.bin"]
    with pytest.raises(ValueError, match=r"bitstream='top.bin'.*\.bit file"):
        flash_command("ulx3s-85f", "top.bin")


def _fake_build(cache, board, config, age_seconds):
    """A cached build as `build_system` leaves it, its .built stamped ``age_seconds`` ago."""
    build_dir = cache / "builds" / f"{board.name}-{age_seconds:016x}"
    build_dir.mkdir(parents=True)
    bitstream = build_dir / f"top{board.bitstream_suffix}"
    bitstream.write_bytes(b"bitstream")
    report = {"config": json.loads(config.to_json()), "bitstream": bitstream.name}
    (build_dir / "report.json").write_text(json.dumps(report))
    done = build_dir / ".built"
    done.write_text("1.0\n")
    stamp = time.time() - age_seconds
    os.utime(done, (stamp, stamp))
    return bitstream


def test_flash_defaults_to_the_last_build_of_board_and_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPUGEN_CACHE", str(tmp_path))
    small, large = ICEBREAKER.default_config(2, 2), ICEBREAKER.default_config(4, 4)
    with pytest.raises(FlashError, match="no cached build of a 2x2 core on the icebreaker"):
        flash("icebreaker", config=small, dry_run=True)
    older_small = _fake_build(tmp_path, ICEBREAKER, small, 300)
    newer_small = _fake_build(tmp_path, ICEBREAKER, small, 100)
    newest_large = _fake_build(tmp_path, ICEBREAKER, large, 10)
    _fake_build(tmp_path, ULX3S, ULX3S.default_config(2, 2), 1)
    assert last_build(ICEBREAKER, small) == newer_small != older_small
    assert flash("icebreaker", config=small, dry_run=True)[-1] == str(newer_small)
    assert flash("icebreaker", dry_run=True)[-1] == str(newest_large)
    assert capsys.readouterr().out.splitlines() == [
        f"openFPGALoader -b icebreaker {newer_small}",
        f"openFPGALoader -b icebreaker {newest_large}"]
    with pytest.raises(FlashError, match="no cached build of a 2x2 core on the ulx3s-85f"):
        flash(ULX3S, config=CoreConfig(rows=2, cols=2), dry_run=True)


def test_flash_without_openfpgaloader_names_the_debian_package(tmp_path, monkeypatch, capsys):
    bitstream = tmp_path / "top.bit"
    bitstream.write_bytes(b"bitstream")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert flash("ulx3s-85f", bitstream, dry_run=True) == [
        "openFPGALoader", "-b", "ulx3s", str(bitstream)]
    with pytest.raises(FlashError, match=r"openfpgaloader \(apt install openfpgaloader\)"):
        flash("ulx3s-85f", bitstream)
    assert main(["flash", "--board", "ulx3s-85f", str(bitstream)]) == 3
    assert "apt install openfpgaloader" in capsys.readouterr().err
    with pytest.raises(FlashError, match="does not exist"):
        flash("ulx3s-85f", tmp_path / "missing.bit", dry_run=True)
    assert main(["flash", "--board", "ulx3s-85f", str(tmp_path / "missing.bit")]) == 2
    assert "bitstream" in capsys.readouterr().err


def test_flash_runs_the_programmer(tmp_path, monkeypatch, capsys):
    calls = tmp_path / "calls"
    programmer = tmp_path / "openFPGALoader"
    programmer.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$2" = icebreaker ]\n')
    programmer.chmod(0o755)
    monkeypatch.setenv("OPENFPGALOADER", str(programmer))
    bitstream, other = tmp_path / "top.bin", tmp_path / "top.bit"
    bitstream.write_bytes(b"bitstream")
    other.write_bytes(b"bitstream")
    assert main(["flash", "--board", "icebreaker", str(bitstream)]) == 0
    assert calls.read_text() == f"-b icebreaker {bitstream}\n"
    with pytest.raises(FlashError, match="failed"):
        flash("ulx3s-85f", other)


# -- builds -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ecp5_build():
    return build_system(ULX3S, StandIn(), pll_settings(ULX3S, 50))


def _check_report(board, result, pll, dsps):
    report = result.report
    assert result.bitstream.is_file() and result.bitstream.suffix == board.bitstream_suffix
    assert result.bitstream.stat().st_size > 10_000
    assert report["board"] == board.name and report["device"] == board.device
    assert report["target_mhz"] == pytest.approx(float(pll.output_mhz), abs=1e-3)
    [clock] = report["clocks"].values()
    assert clock["target_mhz"] == pytest.approx(report["target_mhz"], abs=0.02)
    assert clock["fmax_mhz"] == report["fmax_mhz"]
    assert report["timing_met"] == clock["met"] == (clock["fmax_mhz"] >= clock["target_mhz"])
    resources = report["resources"]
    assert 30 < resources["luts"]["used"] < 600, resources
    assert 40 <= resources["ffs"]["used"] < 200, resources  # counter, shift registers, reset
    assert resources["dsps"]["used"] == dsps and resources["block_rams"]["used"] == 0
    for numbers in resources.values():
        assert numbers["percent"] == round(100 * numbers["used"] / numbers["total"], 1)
    # The board's device totals are nextpnr's.
    nextpnr = json.loads((result.build_dir / "nextpnr.json").read_text())["utilization"]
    for resource in board.resources:
        assert nextpnr[resource.cell]["available"] == resource.total, resource
    assert report["overflow"] == [] and report["build_seconds"] > 0
    # nextpnr's critical paths (one per pair of clock edges) lead back to StandIn's lines.
    paths = report["critical_paths"]
    assert all(path["delay_ns"] > 0 and path["nets"] for path in paths)
    assert any(source.startswith("tests/test_fpga_build.py:")
               for path in paths for source in path["python_sources"]), paths
    text = format_report(report)
    assert text.count("critical path ") == len(paths)
    return text


def test_ecp5_build_report(ecp5_build):
    text = _check_report(ULX3S, ecp5_build, pll_settings(ULX3S, 50), dsps=1)
    assert ecp5_build.report["fmax_mhz"] > 100 and "fits, timing met" in text
    assert f"{ecp5_build.report['fmax_mhz']:9.2f}" in text


def test_ice40_build_that_misses_timing_gives_a_bitstream_and_says_so():
    # yosys maps multipliers to SB_MAC16 only with -dsp, which the board does not ask for; an
    # 8x8 multiplier of LUTs in one cycle cannot make 200 MHz.
    pll = pll_settings(ICEBREAKER, 200)
    result = build_system(ICEBREAKER, StandIn(), pll)
    text = _check_report(ICEBREAKER, result, pll, dsps=0)
    assert result.report["fmax_mhz"] < 100 and not result.report["timing_met"]
    assert "TIMING MISSED" in text and "MISSED" in text.splitlines()[3]


def test_a_critical_path_through_mapped_logic_names_its_end_cells_lines(tmp_path):
    # The routed nets of a path through LUTs yosys named carry only its techmap's sources: the
    # Python lines are those of the cells it starts and ends at (yosys' netlist).
    root = str(Path(build_module.__file__).resolve().parents[1])
    netlist = tmp_path / "top.json"
    netlist.write_text(json.dumps({"modules": {"top": {"cells": {
        "word_FF": {"attributes": {"src": f"{root}/hdl/csr.py:191|{root}/hdl/axi.py:45|"
                                          f"{sysconfig.get_paths()['stdlib']}/contextlib.py:144"}},
        "rdata_FF": {"attributes": {"src": f"{root}/hdl/csr.py:210"}},
        "other": {"attributes": {}}}}}}))
    techmap = ["/share/lattice/cells_map_trellis.v:108.23-108.24"]
    report = {"critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
        {"type": "clk-to-q", "from": {"cell": "word_FF"}, "to": {"cell": "word_FF"},
         "delay": 0.5, "net": "", "sources": []},
        {"type": "routing", "from": {"cell": "word_FF"}, "to": {"cell": "lut"}, "delay": 1.0,
         "net": "word_LUT4_Z", "sources": techmap},
        {"type": "routing", "from": {"cell": "lut"}, "to": {"cell": "rdata_FF"}, "delay": 2.0,
         "net": "rdata_FF_DI", "sources": techmap}]}]}
    [path] = critical_paths(report, cell_sources(netlist))
    assert (path["start"], path["end"], path["delay_ns"]) == ("word_FF", "rdata_FF", 3.5)
    assert path["python_sources"] == ["hdl/csr.py:191", "hdl/axi.py:45", "hdl/csr.py:210"]
    assert critical_paths(report)[0]["python_sources"] == []


def test_a_cell_without_a_design_line_is_named_by_its_nearest_instance():
    # A block RAM mapped from a FIFO keeps its techmap's source only; an FSM register inside a
    # walker has Amaranth's contextlib line only: both take their enclosing instance's line.
    root = str(Path(build_module.__file__).resolve().parents[1])
    contextlib = f"{sysconfig.get_paths()['stdlib']}/contextlib.py:144"
    design = {"modules": {
        "load": {"cells": {
            "queue": {"type": "fifo", "attributes": {"src": f"{root}/hdl/load.py:80"}},
            "walker": {"type": "walker", "attributes": {"src": f"{root}/hdl/load.py:90"}}}},
        "fifo": {"cells": {}}, "walker": {"cells": {}}}}
    instances = timing_module._instance_sources(design, "load")
    cells = {"queue.mem_DP16KD": ["/share/ecp5/brams_map.v:3"],
             "walker.fsm_state_FF": [contextlib],
             "walker.i3_FF": [f"{root}/hdl/walker.py:288"], "lone_FF": []}
    named = timing_module._with_instance_sources(cells, instances)
    assert named["queue.mem_DP16KD"][-1].endswith("hdl/load.py:80")
    assert named["walker.fsm_state_FF"] == [contextlib, f"{root}/hdl/load.py:90"]
    assert named["walker.i3_FF"] == cells["walker.i3_FF"] and named["lone_FF"] == []


def test_a_placement_that_does_not_route_suggests_another_seed(tmp_path):
    # nextpnr's error as the ULX3S 8x8 gave it at one seed (another routed); any other failure
    # in place and route gets no such hint.
    (tmp_path / "top.json").write_text("{}")
    (tmp_path / "unrouted.sh").write_text(
        "echo \"ERROR: Failed to route arc 0.0 of net 'reset_dcca_CLKI'.\" > top.tim; exit 1\n")
    (tmp_path / "other.sh").write_text("echo 'ERROR: no such bel' > top.tim; exit 1\n")
    config, pll = ULX3S.default_config(2, 2), pll_settings(ULX3S, ULX3S.default_mhz)
    with pytest.raises(BuildError, match=r"(?s)Failed to route arc.*try --seed"):
        _run_build(ULX3S, pll, config, tmp_path, "unrouted")
    with pytest.raises(BuildError, match="no such bel") as failure:
        _run_build(ULX3S, pll, config, tmp_path, "other")
    assert "--seed" not in str(failure.value)


def _router_log(overused):
    """router2's iteration lines for these overused wire counts, from iteration 1."""
    return [f"Info:     iter={k} wires=1072000 overused={v} overuse={v} archfail=NA"
            for k, v in enumerate(overused, 1)]


def _first_verdict(watch, lines):
    """(iteration, reason) of the first line ``watch`` stops at, else None."""
    for k, line in enumerate(lines, 1):
        reason = watch.see(line)
        if reason is not None:
            return k, reason
    return None


def test_router_watch_lets_converging_routing_run():
    # Like the routed builds: halving at first, then 42 iterations between bests, bouncing to
    # six times the best of 1 (the ULX3S 8x8 at stop 43 that converged at iteration 145).
    lines = _router_log([70000, 30000, 9000, 3000, 900, 200, 40, 9, 1] + [6, 2, 1, 3] * 10
                        + [5, 4] + [0])
    assert _first_verdict(RouterWatch(), ["Info: Routing..", *lines]) is None


def test_router_watch_stops_routing_that_stalls_or_rises():
    stalled = _router_log([5000, 400, 25] + [26, 60, 99] * 20)
    assert _first_verdict(RouterWatch(), stalled) == (
        53, "router2 found no fewer than 25 overused wires (iteration 3) in 50 iterations")
    # A rise to more than twice the best plus 50 stops it, from iteration 30 on.
    rising = _router_log([5000, 1000, 145] + [341] * 26 + [340, 341])
    assert _first_verdict(RouterWatch(), rising) == (
        31, "router2's overused wires rose to 341 at iteration 31, from 145 at iteration 3")
    assert _first_verdict(RouterWatch(patience=5), _router_log([9, 9, 9, 9, 9, 9]))[0] == 6


def test_a_diverging_router_is_stopped_as_an_unrouted_placement(tmp_path):
    # nextpnr's router2 does not give up on its own: the build stops it (and the command line
    # places again at another seed, as when nextpnr fails to route).
    (tmp_path / "top.json").write_text("{}")
    lines = "\n".join(_router_log([900, 100] + [99] * 28 + [300]))
    (tmp_path / "diverging.sh").write_text(f"printf '{lines}\\n' > top.tim; sleep 60\n")
    config, pll = ULX3S.default_config(2, 2), pll_settings(ULX3S, ULX3S.default_mhz)
    start = time.perf_counter()
    reason = "router2's overused wires rose to 300 at iteration 31, from 99 at iteration 3"
    with pytest.raises(BuildError, match=rf"(?s)in routing: {reason}.*try --seed") as failure:
        _run_build(ULX3S, pll, config, tmp_path, "diverging")
    assert failure.value.unrouted
    assert time.perf_counter() - start < 30  # the tool was stopped, not waited for


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_an_unrouted_placement_is_a_cached_verdict(tmp_path, monkeypatch):
    """A placement that did not route fails again from the cache without running the tools (the
    retry at another seed then starts at once); a seed is another build, any other failure is
    not kept, and the cache's reports skip the verdict."""
    from tpugen.fpga import build as build_module

    monkeypatch.setenv("TPUGEN_CACHE", str(tmp_path))
    runs = []

    def fake_run(board, pll, config, build_dir, script, timeout=None, progress=None):
        runs.append(build_dir)
        unrouted = "--seed 2" not in (build_dir / "build_top.sh").read_text()
        raise BuildError("ERROR: Failed to route arc 0.0 of net 'reset'" if unrouted else
                         "build stopped after 1 s (--timeout)", unrouted=unrouted)

    monkeypatch.setattr(build_module, "_run_build", fake_run)
    pll = pll_settings(ICEBREAKER, 24)
    for attempt in range(2):
        with pytest.raises(BuildError, match="Failed to route arc") as failure:
            build_system(ICEBREAKER, StandIn(), pll)
        assert failure.value.unrouted
        assert ("a cached verdict" in str(failure.value)) == (attempt == 1)
    assert len(runs) == 1
    with pytest.raises(BuildError, match="Failed to route arc"):
        build_system(ICEBREAKER, StandIn(), pll, seed=1)
    assert len(runs) == 2 and runs[1] != runs[0]
    for _ in range(2):  # not a verdict on the placement: the tools run again
        with pytest.raises(BuildError, match="--timeout") as failure:
            build_system(ICEBREAKER, StandIn(), pll, seed=2)
        assert not failure.value.unrouted
    assert len(runs) == 4
    assert last_build(ICEBREAKER) is None and cached_report(ICEBREAKER, None) is None


@pytest.mark.parametrize("outcomes, seeds, status", [
    (["unrouted", "built"], [None, 1], 0),     # the default seed's placement did not route
    (["unrouted", "unrouted", "built"], [None, 1, 2], 0),  # nor seed 1's
    (["unrouted"] * 4, [None, 1, 2, 3], 1),    # nor seeds 2 and 3: the error, once
    (["unrouted", "failed"], [None, 1], 1),    # any other failure: no further placement
    (["failed"], [None], 1),
    ([17.5, "built"], [None, 1], 0),           # the default seed's missed the clock
    # None met it: the fastest placement, built again (cached) for its files.
    ([17.5, 19.5, "unrouted", 18.5], [None, 1, 2, 3, 1], 0),
    ([17.5, "unrouted", "unrouted", "unrouted"], [None, 1, 2, 3], 0),  # its files are there
], ids=["retried", "retried-twice", "unrouted-at-every-seed", "retried-then-failed",
        "other-failure", "slow-then-met", "slow-at-every-seed", "slow-then-unrouted"])
def test_build_without_a_seed_places_again_when_routing_fails_or_is_slow(
        monkeypatch, tmp_path, capsys, outcomes, seeds, status):
    from tpugen.fpga import build as build_module

    calls = []

    def fake_build(board, config, **options):
        calls.append(options["seed"])
        if len(calls) <= len(outcomes):
            outcome = outcomes[len(calls) - 1]
        else:  # the fastest again
            outcome = max(o for o in outcomes if isinstance(o, float))
        if outcome == "built" or isinstance(outcome, float):
            bitstream = tmp_path / "top.bit"
            bitstream.write_bytes(b"bits")
            met = outcome == "built"
            report = {"config": None, "timing_met": met, "target_mhz": 18.0,
                      "fmax_mhz": 20.0 if met else outcome}
            return types.SimpleNamespace(bitstream=bitstream, report=report, cached=False)
        raise BuildError(f"{outcome} at seed {options['seed']}", unrouted=outcome == "unrouted")

    monkeypatch.setattr(build_module, "build", fake_build)
    monkeypatch.setattr(build_module, "format_report", lambda report: "the report")
    assert main(["build", "--board", "ulx3s-85f", "--rows", "2", "--cols", "2",
                 "-o", str(tmp_path)]) == status
    assert calls == seeds
    err = capsys.readouterr().err
    assert ("default seed did not route; placing again with --seed 1" in err) == (
        outcomes[0] == "unrouted")
    assert ("seed 1 did not route; placing again with --seed 2" in err) == (
        outcomes[1:2] == ["unrouted"])
    if status:
        assert err.strip().splitlines()[-1].endswith(f"{outcomes[-1]} at seed {seeds[-1]}")
    assert ("default seed misses the 18 MHz clock (17.5 MHz); placing again with --seed 1"
            in err) == (outcomes[0] == 17.5)
    # A seed the user gives is the only one tried.
    calls.clear()
    outcomes = ["unrouted"]
    assert main(["build", "--board", "ulx3s-85f", "--rows", "2", "--cols", "2", "--seed", "7",
                 "-o", str(tmp_path)]) == 1
    assert calls == [7]


def test_second_build_is_a_cache_hit(ecp5_build, tmp_path):
    start = time.perf_counter()
    again = build_system(ULX3S, StandIn(), pll_settings(ULX3S, 50), out_dir=tmp_path)
    assert again.cached and time.perf_counter() - start < 20
    assert again.report == ecp5_build.report and again.bitstream == ecp5_build.bitstream
    assert (tmp_path / "top.bit").read_bytes() == ecp5_build.bitstream.read_bytes()
    assert json.loads((tmp_path / "report.json").read_text()) == ecp5_build.report
    assert (tmp_path / "report.txt").read_text() == format_report(ecp5_build.report)
    assert last_build(ULX3S) == ecp5_build.bitstream


def test_design_that_does_not_fit_names_the_resource():
    message = (r"the icebreaker \(iCE40UP5K\): "
               r"block RAMs \(ICESTORM_RAM\) 32 of 30 \(107%\), 2 over")
    for _ in range(2):  # the verdict is cached
        with pytest.raises(BuildError, match="the design does not fit " + message) as error:
            build_system(ICEBREAKER, TooManyBlockRams(), pll_settings(ICEBREAKER, 24))
        report = error.value.report
        assert report["overflow"] == ["block_rams"] and report["bitstream"] is None
        assert "DOES NOT FIT " + message.replace("\\", "") in format_report(report)


class RecordingSystem(StandIn):
    """Stands in for tpugen.hdl.board.BoardSystem and keeps the arguments it was made with."""
    made = []

    def __init__(self, config, **options):
        self.made.append((config, options))
        super().__init__()


def test_build_makes_board_system_for_the_board_and_config(tmp_path, monkeypatch, capsys):
    fake = types.ModuleType("tpugen.hdl.board")
    fake.BoardSystem = RecordingSystem
    monkeypatch.setitem(sys.modules, "tpugen.hdl.board", fake)
    config = ICEBREAKER.default_config(2, 2)
    result = build("icebreaker", config)
    assert RecordingSystem.made[-1] == (config, {
        "clk_freq": 18e6, "baud": 1_000_000, "memory_bytes": 128 * 1024, "memory_kind": "spram",
        "register_slice": False})
    assert result.report["config"] == json.loads(config.to_json())
    assert last_build(ICEBREAKER, config) == result.bitstream
    assert flash("icebreaker", config=config, dry_run=True)[-1] == str(result.bitstream)
    capsys.readouterr()
    assert main(["build", "--board", "icebreaker", "--rows", "2", "--cols", "2",
                 "-o", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out == format_report(result.report) + "\n" and "(cached build)" in out.err
    assert (tmp_path / "top.bin").read_bytes() == result.bitstream.read_bytes()
    assert main(["flash", "--board", "icebreaker", "--rows", "2", "--cols", "2",
                 "--dry-run"]) == 0
    assert capsys.readouterr().out == f"openFPGALoader -b icebreaker {result.bitstream}\n"

    def refuse(config, **options):
        RecordingSystem.made.append((config, options))
        raise NotImplementedError

    fake.BoardSystem = refuse
    with pytest.raises(NotImplementedError):
        build("ulx3s-85f", ULX3S.default_config(2, 2), freq_mhz=65)
    assert RecordingSystem.made[-1][1] == {
        "clk_freq": 65e6, "baud": 1_000_000, "memory_bytes": 128 * 1024, "memory_kind": "bram",
        "register_slice": True}


@pytest.mark.skipif(not os.environ.get("TPUGEN_BOARD_BUILDS"),
                    reason="the whole core: set TPUGEN_BOARD_BUILDS=1 (many minutes per board)")
@pytest.mark.parametrize("board", BOARDS.values(), ids=BOARDS)
def test_2x2_core_fits_and_meets_timing(board):
    try:
        result = build(board, board.default_config(2, 2))
    except BuildError as error:
        pytest.fail(f"{error}\n{format_report(error.report) if error.report else ''}")
    assert result.report["timing_met"], format_report(result.report)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_build_reports_its_stages_and_honours_seed_and_timeout(tmp_path, monkeypatch):
    """`tpugen build` shows where a build is: each stage begins once, in order; --seed reaches
    nextpnr; --timeout stops the tools and says in which stage."""
    monkeypatch.setenv("TPUGEN_CACHE", str(tmp_path / "cache"))
    events = []
    result = build_system(ICEBREAKER, StandIn(), pll_settings(ICEBREAKER, 24), seed=7,
                          progress=events.append)
    assert [e.stage for e in events if e.started] == ["synthesis", "placement", "routing",
                                                      "packing"]
    seconds = [e.seconds for e in events]
    assert seconds == sorted(seconds) and result.bitstream.exists()
    assert "--seed 7" in (result.build_dir / "build_top.sh").read_text()
    with pytest.raises(BuildError, match=r"build stopped after 0.5 s \(--timeout\) in synthesis"):
        build_system(ICEBREAKER, StandIn(), pll_settings(ICEBREAKER, 24), seed=8, timeout=0.5)
    with pytest.raises(ValueError, match="seed=-1 is invalid"):
        build_system(ICEBREAKER, StandIn(), pll_settings(ICEBREAKER, 24), seed=-1)
