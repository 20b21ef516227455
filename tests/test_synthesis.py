"""Yosys maps the scratchpad and accumulator to block RAM, not flip-flops; the per-block report
(`tpugen build --synth-only --per-block`) counts every cell of the core in one block."""
import json
import math
from collections import Counter
from dataclasses import replace

import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.cli import main
from tpugen.fpga import synth
from tpugen.fpga.synth import BLOCKS, RESOURCE_CELLS, synth_cells, synth_report


def test_memories_are_block_ram_on_ecp5():
    config = PRESETS["tiny"]
    cells = synth_cells(config, "ecp5")
    scratchpad_bits = config.scratchpad_kib * 8192
    accumulator_bits = config.accumulator_kib * 8192
    # Each memory has two read ports, which yosys implements as two copies.
    expected = 2 * (math.ceil(scratchpad_bits / (16 * 1024)) + math.ceil(accumulator_bits / (16 * 1024)))
    assert cells.get("DP16KD", 0) >= expected, cells
    # Were the memories flip-flops, there would be more flip-flops than memory bits.
    assert cells.get("TRELLIS_FF", 0) < scratchpad_bits + accumulator_bits, cells


# A 2x2 core without the softmax unit and the im2col walker, mapped to LUTs by yosys itself
# (-noabc) rather than abc9, synthesizes fastest; the attribution to blocks is the same.
SMALL = replace(PRESETS["tiny"], softmax=False, im2col=False)


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
    # Their only flip-flops: the bypass of the execute engine's transparent accumulator port (a
    # row and a hit); every other read port goes straight to block RAM (`SRAM_ATTRS`).
    assert blocks["memories"]["ffs"] <= SMALL.acc_width * SMALL.cols + 1
    # Elaborated for iCE40 as a board build is: the array's 4 PEs on 2 SB_MAC16, nothing else
    # on one (synth_ice40 without -dsp).
    assert blocks["array"]["by_type"].get("SB_MAC16") == total["dsps"] == 2
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
    (["--board", "icebreaker", "--per-block"], "--per-block and --json need --synth-only"),
    (["--board", "icebreaker", "--synth-only", "--freq", "30"],
     "--freq, --seed, --timeout and -o/--output are for place and route: leave out --synth-only"),
    (["--board", "icebreaker", "--synth-only", "--per-block", "--rows", "0"],
     "CoreConfig.rows=0 is invalid"),
])
def test_cli_refuses_bad_synth_only_options_in_one_line(capsys, options, message):
    assert main(["build", *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
