"""tpugen: generate, verify, run and build TPU-like int8 systolic-array accelerator cores."""
import argparse
import ast
import functools
import inspect
import json
import os
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from . import __version__
from .config import PRESETS, CoreConfig

EXIT_CODES = {
    0: "success",
    1: "the work ran and failed: a result differs from numpy, a build does not fit or route, "
       "a bench check failed",
    2: "bad usage or input: an argument, a --config file, an output path",
    3: "a tool or device failed: yosys or openFPGALoader missing or failing, a board link error",
}
"""Exit status of every command (docs/bad-inputs.md lists the errors behind each)."""

EXAMPLES = """\
examples:
  tpugen generate --rows 16 --cols 16 -o tpu.v   Verilog of a 16x16 core
  tpugen generate --name my_tpu -o my_tpu.v       every module's name starts with my_tpu
  tpugen demo                                     verify the default core against numpy
  tpugen run matmul --m 100 --k 70 --n 33         one workload, checked, with its counters
  tpugen run conv2d --preset micro --json         the same on the UP5K core, as JSON
  tpugen sim --test-module my_tb.py --waves       your own cocotb testbench on the core
  tpugen compile matmul --m 30 --k 20 --n 9 -o job  a matmul as C for firmware/c's driver
  tpugen build --board ulx3s-85f                  bitstream and report (Fmax, LUTs, DSPs)
  tpugen build --board icebreaker --preset micro --synth-only --per-block
  tpugen bench -o bench.json --plot bench.png     utilization against the ideal
  tpugen run-model tpugen/examples/models/digits_cnn.qdq.onnx --samples 20

exit status:
""" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())


class CommandError(Exception):
    """A failure to report in one line with exit status ``code`` (see `EXIT_CODES`)."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default in its help (unless it has none), examples kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and "default" not in text
                and not any(action.default is nothing for nothing in (None, False))
                and action.default != argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2."""

    def error(self, message):
        self.exit(2, f"tpugen: error: {message}\n")


@functools.cache
def _field_docs():
    """First sentence of each `CoreConfig` field's docstring, by field name."""
    docs = {}
    body = ast.parse(inspect.getsource(CoreConfig)).body[0].body
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)):
            text = " ".join(following.value.value.split())
            docs[node.target.id] = text.split(". ")[0].rstrip(".")
    return docs


def _add_config_options(parser, preset_default="default"):
    group = parser.add_argument_group(
        "core configuration", "a preset, then the fields of a --config file, then these flags "
        "(each defaults to the preset's value)")
    group.add_argument("--preset", choices=sorted(PRESETS), default=preset_default,
                       help="named configuration" + ("" if preset_default else
                                                     " (default: the board's own)"))
    group.add_argument("--config", type=Path, metavar="FILE.json",
                       help="CoreConfig fields as a JSON object")
    docs = _field_docs()
    for field in fields(CoreConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction,
                               help=docs.get(field.name))
        else:
            group.add_argument(flag, type=field.type, metavar=field.name.upper(),
                               help=docs.get(field.name))


def _read_config_file(path):
    """The fields of ``--config`` as a dict, or CommandError naming the file."""
    try:
        text = path.read_text()
    except OSError as error:
        raise CommandError(f"cannot read --config {path}: {error.strerror or error}", 2) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(f"--config {path} is not valid JSON: {error}", 2) from None
    if not isinstance(data, dict):
        raise CommandError(f"--config {path} must hold a JSON object of CoreConfig fields", 2)
    try:
        CoreConfig.check_field_names(data)
    except ValueError as error:
        raise CommandError(f"--config {path}: {error}", 2) from None
    return data


def _flag_overrides(args):
    return {field.name: getattr(args, field.name) for field in fields(CoreConfig)
            if getattr(args, field.name) is not None}


def _config(args, base=None):
    """CoreConfig from ``base`` (default: the --preset), then --config, then the field flags."""
    base = PRESETS[args.preset] if base is None else base
    from_file = _read_config_file(args.config) if args.config else {}
    return CoreConfig(**{**asdict(base), **from_file, **_flag_overrides(args)})


def _board_config(args, board):
    """As `_config`, starting from the board's default for --rows/--cols unless --preset names
    one, which then takes the board's address width (`Board.address_width`)."""
    if args.preset:
        return _config(args, base=replace(PRESETS[args.preset], address_width=board.address_width))
    return _config(args, base=board.default_config(args.rows, args.cols))


def _check_writable(path, option="-o/--output", directory=False):
    """CommandError before any work if ``path`` cannot be written."""
    target = path if directory and path.exists() else path.parent
    if directory and path.exists() and not path.is_dir():
        raise CommandError(f"{option} {path} is not a directory", 2)
    if not directory and path.is_dir():
        raise CommandError(f"{option} {path} is a directory", 2)
    while not target.exists():
        target = target.parent
    if not target.is_dir() or not os.access(target, os.W_OK):
        raise CommandError(f"{option} {path} cannot be written ({target} is not writable)", 2)


def _generate(args):
    from .hdl.generate import generate_verilog

    _check_writable(args.output)
    if args.header:
        _check_writable(args.header, "--header")
    config = _config(args)
    start = time.perf_counter()
    text = generate_verilog(config, args.design, name=args.name)
    args.output.write_text(text)
    print(f"wrote {args.output} ({args.design} as {args.name or args.design}, "
          f"{config.rows}x{config.cols}) in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    if args.header:
        from .firmware.c_header import c_header

        args.header.write_text(c_header(config))
        print(f"wrote {args.header}", file=sys.stderr)


def _waves_window(args):
    """(--waves-from, --waves-until), checked before any simulation."""
    from .sim.vcd_window import check_window

    window = (args.waves_from, args.waves_until)
    if window != (None, None) and not args.waves:
        raise CommandError("--waves-from and --waves-until need --waves", 2)
    check_window(*window)
    return window


def _simulation_options(args):
    if args.waves:
        _check_writable(args.waves, "--waves")
    return {"waves": args.waves, "waves_window": _waves_window(args), "memory": args.memory,
            "as_json": args.json}


def _demo(args):
    from .demo import run_demo

    return run_demo(_config(args), **_simulation_options(args))


SHAPE_OPTIONS = {
    "matmul": {"m": 64, "k": 64, "n": 64, "bias": False, "requant": False, "relu": False},
    "conv2d": {"batch": 1, "channels": 8, "height": 16, "width": 16, "filters": 8, "kernel": 3,
               "stride": 1, "padding": 1, "dilation": 1, "bias": False, "requant": False,
               "relu": False, "pool": False},
    "attention": {"heads": 1, "seq": 64, "kv": 64, "dim": 64, "causal": False},
}
"""The shape and epilogue flags of each `run` operation, with their defaults."""


def _workload(args):
    """(op, shape) from the flags; CommandError for a flag of another operation or a bad size."""
    options = SHAPE_OPTIONS[args.op]
    for name in sorted(set().union(*SHAPE_OPTIONS.values()) - set(options)):
        if getattr(args, name) not in (None, False):
            raise CommandError(f"--{name} does not apply to {args.op}", 2)
    values = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in options.items()}
    for name, value in values.items():
        if not isinstance(value, bool) and value < (0 if name == "padding" else 1):
            raise CommandError(f"--{name}={value} is invalid: allowed an integer >= "
                               f"{0 if name == 'padding' else 1}", 2)
    if args.op == "conv2d":
        from .firmware.conv2d import conv2d_output_shape

        shape = {"n": values["batch"], "c": values["channels"], "h": values["height"],
                 "w": values["width"], "k": values["filters"], "r": values["kernel"],
                 "s": values["kernel"], **{name: values[name] for name in (
                     "stride", "padding", "dilation", "bias", "requant", "relu", "pool")}}
        try:
            conv2d_output_shape((shape["n"], shape["c"], shape["h"], shape["w"]),
                                (shape["k"], shape["c"], shape["r"], shape["s"]),
                                shape["stride"], shape["padding"], shape["dilation"])
        except ValueError:
            raise CommandError("--kernel with --dilation is larger than the padded input",
                               2) from None
        return args.op, shape
    return args.op, values


def _check_attention_core(op, config):
    if op == "attention" and not config.softmax:
        raise CommandError("attention needs the softmax unit: this core has --no-softmax", 2)
    if op == "attention" and config.rows != config.cols:
        raise CommandError(f"attention needs a square array, not {config.rows}x{config.cols}", 2)


def _run(args):
    from .demo import run_workloads

    workload = _workload(args)
    config = _config(args)
    _check_attention_core(args.op, config)
    return run_workloads(config, [workload], seed=args.seed, **_simulation_options(args))


def _run_model(args):
    """A quantized ONNX model on the digits test set: the simulated core beside onnxruntime."""
    try:
        import onnx
        from google.protobuf.message import DecodeError

        from .examples.digits_onnx import describe, digits_feeds, evaluate, float_model_path
    except ImportError as error:
        raise CommandError(f"run-model needs the onnx and examples extras ({error.name} is "
                           "missing): pip install 'tpugen[onnx,examples]'", 2) from None
    from .sim import SimDevice

    for path, option in ((args.json, "--json"), (args.plot, "--plot")):
        if path:
            _check_writable(path, option)
    config = _config(args)
    try:
        model = onnx.load(str(args.model))
        onnx.checker.check_model(model)
    except OSError as error:
        raise CommandError(f"cannot read MODEL {args.model}: {error.strerror or error}",
                           2) from None
    except (DecodeError, onnx.checker.ValidationError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "no detail"
        raise CommandError(f"MODEL {args.model} is not a valid ONNX model: {first_line}",
                           2) from None
    digits_feeds(model, args.samples)  # a bad input shape or --samples before the simulator
    with SimDevice(config, memory=args.memory) as device:
        result = evaluate(model, device, args.samples, float_model_path(args.model))
    print(describe(result, f"{args.model.name} on the simulated {config.rows}x{config.cols} "
                           "core"))
    if args.json:
        args.json.write_text(result.report.to_json())
    if args.plot:
        result.report.plot(args.plot)


def _compile(args):
    """Write one workload's program, operands and C files for the bare-metal driver."""
    import numpy as np

    from .demo import prepare_workload
    from .firmware.export import ProgramExport, write_export

    _check_writable(args.output, directory=True)
    op, shape = _workload(args)
    config = _config(args)
    _check_attention_core(op, config)
    workload = prepare_workload(config, np.random.default_rng(args.seed), op, shape)
    exporter = ProgramExport(config, memory_size=args.memory_size)
    workload.call(exporter)
    description = f"{op} {workload.label} on a {config.rows}x{config.cols} core, seed {args.seed}"
    written = write_export(args.output, config, exporter.images[-1], [workload.expected],
                           description)
    print(f"wrote {', '.join(path.name for path in written)} to {args.output} ({description}); "
          f"build with -I{args.output} -I<tpugen>/firmware/c {args.output / 'tpu_job.c'} tpu.c",
          file=sys.stderr)


def _sim(args):
    """Build the generated core with Verilator (cached) and run the user's cocotb module."""
    import importlib.util

    from .sim.verilator import build_model

    path = Path(args.test_module)
    folder, module = (path.parent, path.stem) if path.suffix == ".py" else (Path.cwd(), str(path))
    sys.path.insert(0, str(folder.resolve()))
    if importlib.util.find_spec(module) is None:
        raise CommandError(f"cannot find the cocotb test module {args.test_module!r} "
                           f"(looked in {folder.resolve()} and on the Python path)", 2)
    config = _config(args)
    window = _waves_window(args)
    print(f"building the {config.rows}x{config.cols} {args.design} with Verilator (cached after "
          "the first build)", file=sys.stderr)
    model = build_model(config, args.design, waves=args.waves)
    try:
        model.run(module, args.test_dir, waves=args.waves, testcase=args.testcase,
                  env={"TPUGEN_CONFIG": config.to_json()})
    except AssertionError as error:
        raise CommandError(str(error).splitlines()[0], 1) from None
    if window != (None, None):
        from .sim.vcd_window import window_vcd

        trace = args.test_dir / "dump.vcd"
        whole = trace.rename(args.test_dir / "whole.vcd")
        window_vcd(whole, trace, *window)
        whole.unlink()
    waves = ""
    if args.waves and args.design == "tpu_core":
        from .sim.gtkw import write_gtkw

        write_gtkw(args.test_dir / "dump.vcd", args.test_dir / "dump.gtkw")
        waves = f", waves: {args.test_dir / 'dump.vcd'} (gtkwave {args.test_dir / 'dump.gtkw'})"
    print(f"{module}: passed (log: {args.test_dir / 'sim.log'}{waves})", file=sys.stderr)


def _bench(args):
    from .bench import BenchCheckError, bench_markdown, plot_bench, readme_with_targets, run_bench
    from .demo import format_table

    _check_writable(args.output)
    if args.plot:
        _check_writable(args.plot, "--plot")
    if args.markdown:
        _check_writable(args.markdown, "--markdown")
    if args.readme:
        _check_writable(args.readme, "--readme")
        if not args.readme.is_file():
            raise CommandError(f"--readme {args.readme} is not a file", 2)
        readme_with_targets(args.readme.read_text(), {"targets": []})  # before hours of work
    try:
        results = run_bench(quick=args.quick, builds=args.builds)
    except BenchCheckError as error:
        # A number for a wrong answer is worthless: say so, keep what was measured, fail.
        args.output.write_text(json.dumps(error.results, indent=2) + "\n")
        raise CommandError(f"bench FAILED: {error} (wrote {args.output}: the workloads so far)",
                           1) from None
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        if key.endswith("_seconds"):
            print(f"{key:40} {value}")
    print(format_table(
        ("core", "op", "shape", "check", "cycles", "MAC util", "ideal", "roofline", "bytes read",
         "limit"),
        [(w["config"], w["op"], "x".join(map(str, w["shape"])), w["check"], w["cycles"],
          f"{w['mac_utilization']:.1%}", f"{w['ideal_utilization']:.1%}",
          f"{w['roofline_utilization']:.1%}", w["bytes_read"], w["limit"])
         for w in results["workloads"]]))
    print()
    print(format_table(
        ("target", "wanted", "measured", "met", "limit"),
        [(t["what"], t["target"], t["measured"] or "-",
          {True: "yes", False: "NO", None: "-"}[t["met"]], t["limit"])
         for t in results["targets"]]))
    print(f"wrote {args.output}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(bench_markdown(results))
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        plot_bench(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.readme:
        args.readme.write_text(readme_with_targets(args.readme.read_text(), results))
        print(f"updated the targets table of {args.readme}", file=sys.stderr)


def _synthesize(args, board, config):
    """`build --synth-only`: the core's cells from yosys alone, per block with --per-block."""
    from .fpga.synth import format_synth_report, synth_report

    kept = "hierarchy kept" if args.per_block else "flat"
    print(f"synthesizing a {config.rows}x{config.cols} core for {board.family} ({board.name}) "
          f"with yosys, {kept}, no place and route (minutes)", file=sys.stderr)
    try:
        report = synth_report(config, board.family, per_block=args.per_block)
    except RuntimeError as error:  # yosys missing or failing
        raise CommandError(str(error), 3) from None
    print(f"synthesized in {report['seconds']:.0f} s", file=sys.stderr)
    values = asdict(config)
    print(f"{board.name} ({board.device}), `{report['command']}` in {report['seconds']:.0f} s; "
          "config " + ", ".join(f"{name}={value}" for name, value in values.items()) + "\n")
    print(format_synth_report(report))
    if args.timing:
        report["timing"] = _time_blocks(board, config)
    if args.json:
        report = {"board": board.name, "device": board.device, "config": values, **report}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


def _time_blocks(board, config):
    """`build --synth-only --per-block --timing`: each block placed and routed alone; prints
    the table and returns the report."""
    from .fpga.timing import block_timing, format_block_timing

    def progress(block, index, count):
        print(f"placing and routing block {index + 1} of {count} alone: {block}",
              file=sys.stderr)

    try:
        timing = block_timing(config, board, progress=progress)
    except RuntimeError as error:  # a tool missing or failing
        raise CommandError(str(error), 3) from None
    print(f"Fmax per block ({board.device}, each block placed and routed alone by nextpnr "
          f"({timing['alone']}) at {timing['target_mhz']:g} MHz, in {timing['seconds']:.0f} s)\n")
    print(format_block_timing(timing))
    return timing


RETRY_SEEDS = (1, 2, 3)
"""`tpugen build` without --seed places again at these seeds, one after another, while nextpnr's
placement does not route (the ULX3S 8x8 until its DCCA was placed, `hdl.core.GLOBAL_DCC_BELS`:
the datapath reset's DCCA input, at both the default seed and seed 1 of stop 42's last
netlist) or its router diverges (`fpga.build.RouterWatch`: the ULX3S 16x16 at stop 44), or it
misses the board's clock (the UP5K at 97% of its logic cells: 17.6 to 23.3 MHz over seeds and
spellings of the same logic, at an 18 MHz clock); then it keeps the fastest placement."""


def _build(args):
    from .fpga.boards import board_named
    from .fpga.build import BuildError, build, format_report

    board = board_named(args.board)
    if args.synth_only and (args.freq is not None or args.output or args.seed is not None
                            or args.timeout is not None):
        raise CommandError("--freq, --seed, --timeout and -o/--output are for place and route: "
                           "leave out --synth-only", 2)
    if not args.synth_only and (args.per_block or args.json or args.timing):
        raise CommandError("--per-block, --timing and --json need --synth-only", 2)
    if args.timing and not args.per_block:
        raise CommandError("--timing needs --per-block", 2)
    if args.json:
        _check_writable(args.json, "--json")
    config = _board_config(args, board)
    if args.synth_only:
        return _synthesize(args, board, config)
    out_dir = args.output or Path("build") / board.name
    _check_writable(out_dir, directory=True)
    print(f"building a {config.rows}x{config.cols} core for the {board.name} with yosys and "
          "nextpnr (minutes unless cached)", file=sys.stderr)
    seeds = [args.seed] if args.seed is not None else [None, *RETRY_SEEDS]
    routed = {}  # seed: the build of each placement that routed
    for index, seed in enumerate(seeds):
        tried = "its default seed" if seed is None else f"seed {seed}"
        try:
            routed[seed] = build(board, config, freq_mhz=args.freq, out_dir=out_dir, seed=seed,
                                 timeout=args.timeout, progress=_BuildProgress(args.verbose))
        except BuildError as error:
            if not error.unrouted or (seed == seeds[-1] and not routed):
                if error.report:
                    print(format_report(error.report))
                raise CommandError(str(error), 1) from None
            if seed != seeds[-1]:
                print(f"nextpnr's placement at {tried} did not route; placing again with "
                      f"--seed {seeds[index + 1]}", file=sys.stderr)
            continue
        report = routed[seed].report
        if report["timing_met"] or seed == seeds[-1]:
            break
        print(f"nextpnr's placement at {tried} misses the {report['target_mhz']:g} MHz clock "
              f"({report['fmax_mhz']} MHz); placing again with --seed {seeds[index + 1]}",
              file=sys.stderr)
    best = max(routed, key=lambda seed: (routed[seed].report["timing_met"],
                                         routed[seed].report["fmax_mhz"] or 0))
    result = routed[best]
    if best != [*routed][-1]:  # its files in out_dir again (a cached build)
        result = build(board, config, freq_mhz=args.freq, out_dir=out_dir, seed=best,
                       timeout=args.timeout, progress=_BuildProgress(args.verbose))
    print(format_report(result.report))
    print(f"wrote {out_dir / result.bitstream.name}, {out_dir / 'report.json'}, "
          f"{out_dir / 'report.txt'}" + (" (cached build)" if result.cached else ""),
          file=sys.stderr)


class _BuildProgress:
    """Prints each stage of a board build as it begins, and every ``every`` seconds the tool's
    latest line (all of them with ``verbose``)."""

    TOOLS = {"synthesis": "yosys", "placement": "nextpnr", "routing": "nextpnr",
             "packing": "ecppack / icepack"}

    def __init__(self, verbose, every=20.0):
        self.verbose = verbose
        self.every = every
        self.shown = 0.0

    def __call__(self, event):
        if self.verbose and event.line:
            print(event.line, file=sys.stderr)
        elif event.started:
            print(f"[{event.seconds:6.0f} s] {event.stage} ({self.TOOLS[event.stage]})",
                  file=sys.stderr)
            self.shown = event.seconds
        elif event.seconds - self.shown >= self.every and event.line.strip():
            print(f"[{event.seconds:6.0f} s]   {event.line.strip()[:100]}", file=sys.stderr)
            self.shown = event.seconds


def _flash(args):
    from .fpga.boards import board_named
    from .fpga.flash import FlashError, flash

    board = board_named(args.board)
    if args.bitstream is not None and not args.bitstream.is_file():
        raise CommandError(f"bitstream {args.bitstream} does not exist", 2)
    chosen = args.preset or args.config or _flag_overrides(args)
    try:
        flash(board, args.bitstream, config=_board_config(args, board) if chosen else None,
              dry_run=args.dry_run)
    except FlashError as error:
        raise CommandError(str(error), 3) from None


def _sweep(args):
    from .sweep import grid, parse_sizes, parse_vary, run_sweep, write_results

    points = grid([name.strip() for name in args.boards.split(",")], parse_sizes(args.sizes),
                  parse_vary(args.vary or []), place_and_route=args.place_and_route)
    _check_writable(args.output, directory=True)
    try:
        rows = run_sweep(points, scheduler=args.scheduler, workers=args.workers,
                         timeout=args.timeout, cache=args.cache, quiet=args.quiet)
    except ConnectionError as error:
        raise CommandError(str(error), 3) from None
    command = " ".join(["tpugen sweep", f"--boards {args.boards}", f"--sizes {args.sizes}",
                        *(f"--vary {item}" for item in args.vary or []),
                        *(["--place-and-route"] if args.place_and_route else [])])
    for path in write_results(rows, args.output, command):
        print(f"wrote {path}", file=sys.stderr)
    failed = [row["label"] for row in rows if row["status"] != "ok"]
    if failed:
        raise CommandError(f"{len(failed)} of {len(rows)} points failed or timed out: "
                           f"{', '.join(failed)} (see {args.output / 'summary.md'})", 1)


def _add_simulation_options(parser):
    group = parser.add_argument_group("simulation")
    group.add_argument("--memory", choices=["rtl", "axiram"], default="rtl",
                       help="the core's memory: inside the Verilator model (fast) or "
                            "cocotbext-axi's AxiRam (bus-level, about 6x slower)")
    group.add_argument("--waves", type=Path, metavar="FILE.vcd",
                       help="trace the whole session to a VCD file (GTKWave, Surfer)")
    _add_waves_window(group)
    group.add_argument("--json", action="store_true", help="print the results as JSON")


def _add_waves_window(parser):
    parser.add_argument("--waves-from", type=int, metavar="CYCLE",
                        help="with --waves: the first clock cycle to keep (0: the clock's "
                             "start)")
    parser.add_argument("--waves-until", type=int, metavar="CYCLE",
                        help="with --waves: the last clock cycle to keep (the whole run is "
                             "traced, then cut to the window)")


def _add_run_options(run):
    run.add_argument("op", choices=sorted(SHAPE_OPTIONS))
    run.add_argument("--seed", type=int, default=0, help="random operands")
    groups = {
        "matmul": run.add_argument_group("matmul shape (int8 A: M x K, B: K x N)"),
        "conv2d": run.add_argument_group("conv2d shape (NCHW int8 x, KCRS int8 w)"),
        "attention": run.add_argument_group("attention shape (float32 q: L x d, k, v: S x d)"),
        "epilogue": run.add_argument_group("fused epilogue (random per-channel parameters)"),
    }
    meaning = {"m": "M", "k": "K", "n": "N", "seq": "L, queries", "kv": "S, keys and values",
               "dim": "d, head dimension", "bias": "add a bias", "requant": "requantize to int8",
               "relu": "ReLU", "pool": "2x2 max pooling (conv2d)", "causal": "causal mask",
               "kernel": "R = S"}
    added = set()
    for op, options in SHAPE_OPTIONS.items():
        for name, default in options.items():
            if name in added:
                continue
            added.add(name)
            group = groups["epilogue" if name in ("bias", "requant", "relu", "pool") else op]
            help_text = meaning.get(name, name)
            if isinstance(default, bool):
                group.add_argument(f"--{name}", action="store_true", default=None, help=help_text)
            else:
                group.add_argument(f"--{name}", type=int, default=None,
                                   help=f"{help_text} (default: {default})")


def parser():
    """The argument parser of `tpugen`."""
    top = _Parser(prog="tpugen", description=__doc__, epilog=EXAMPLES,
                                  formatter_class=_Formatter)
    top.add_argument("--version", action="version", version=f"tpugen {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help_text, run):
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  formatter_class=_Formatter)
        sub.set_defaults(run=run)
        return sub

    generate = command("generate", "write Verilog for a configured core", _generate)
    _add_config_options(generate)
    generate.add_argument("-o", "--output", type=Path, default=Path("tpu.v"), help="Verilog file")
    generate.add_argument("--name", metavar="PREFIX",
                          help="name of the top module and prefix of every other module "
                               "(default: the design's), so two cores can share one design")
    generate.add_argument("--header", type=Path, metavar="FILE.h",
                          help="also write a C header: register map, config, ISA codes")
    generate.add_argument("--design", default="tpu_core", choices=["tpu_core", "systolic_array"],
                          help="top module: the whole core or the bare array")

    demo = command("demo", "verify a core on Verilator against numpy", _demo)
    _add_config_options(demo)
    _add_simulation_options(demo)

    run = command("run", "run one workload on the simulated core, checked against numpy", _run)
    _add_run_options(run)
    _add_config_options(run)
    _add_simulation_options(run)

    run_model = command("run-model", "run a quantized ONNX model (QDQ or QOperator) on the "
                                     "digits test set on the simulated core: per-node report "
                                     "and top-1 accuracy beside onnxruntime's", _run_model)
    run_model.add_argument("model", type=Path, metavar="MODEL.onnx",
                           help="input: one digits image a sample (64 values in any shape), "
                                "output: the 10 class scores; e.g. tpugen/examples/models/*")
    run_model.add_argument("--samples", type=int, metavar="N",
                           help="the first N test images (default: all 360)")
    run_model.add_argument("--memory", choices=["rtl", "axiram"], default="rtl",
                           help="the core's memory: inside the Verilator model or AxiRam")
    run_model.add_argument("--json", type=Path, metavar="FILE.json",
                           help="also write the per-node report as JSON")
    run_model.add_argument("--plot", type=Path, metavar="FILE.png",
                           help="also plot the time per node")
    _add_config_options(run_model)

    compile_ = command("compile", "write one workload for the bare-metal C driver "
                                  "(firmware/c): program, operands, expected results, C files",
                       _compile)
    _add_run_options(compile_)
    _add_config_options(compile_)
    compile_.add_argument("-o", "--output", type=Path, default=Path("tpu_job"), metavar="DIR",
                          help="directory for tpu_job.c/.h, tpu_params.h, job.json and the "
                               ".bin files")
    compile_.add_argument("--memory-size", type=int, default=64 << 20, metavar="BYTES",
                          help="the core's memory from address 0 that the layout may use")

    sim = command("sim", "run your own cocotb test module against the generated core "
                         "(Verilator, with the project's waivers and fixes)", _sim)
    sim.add_argument("--test-module", required=True, metavar="MODULE",
                     help="a cocotb module: a name importable from here, or a .py file; it "
                          "reads the core's CoreConfig as JSON from $TPUGEN_CONFIG")
    sim.add_argument("--testcase", help="run only this cocotb test of the module")
    sim.add_argument("--design", default="tpu_core", choices=["tpu_core", "systolic_array"],
                     help="top module")
    sim.add_argument("--test-dir", type=Path, default=Path("sim_build"),
                     help="where the log (sim.log), results and waves (dump.vcd) go")
    sim.add_argument("--waves", action="store_true", help="trace to test-dir/dump.vcd")
    _add_waves_window(sim)
    _add_config_options(sim)

    bench = command("bench", "measure utilization, simulation speed and generate time", _bench)
    bench.add_argument("-o", "--output", type=Path, default=Path("bench.json"),
                       help="results as JSON")
    bench.add_argument("--plot", type=Path, metavar="FILE.png",
                       help="utilization against the ideal")
    bench.add_argument("--markdown", type=Path, metavar="FILE.md",
                       help="the targets and workloads as markdown tables (docs/bench/bench.md)")
    bench.add_argument("--readme", type=Path, metavar="README.md",
                       help="replace the targets table between the bench markers of this file")
    bench.add_argument("--quick", action="store_true",
                       help="leave out the large workloads of the targets (512-cube matmul, "
                            "56x56 conv, L=512 attention on 16x16)")
    bench.add_argument("--builds", action="store_true",
                       help="run the board builds of the targets that are not cached (hours)")

    from .fpga.boards import BOARDS  # board data only: no HDL

    build = command("build", "bitstream and report (Fmax, resources) for a board", _build)
    build.add_argument("--board", required=True, choices=sorted(BOARDS))
    _add_config_options(build, preset_default=None)
    build.add_argument("--freq", type=float, metavar="MHZ",
                       help="core clock target (default: the board's)")
    build.add_argument("-o", "--output", type=Path, metavar="DIR",
                       help="where to copy the bitstream and report (default: build/BOARD)")
    build.add_argument("--seed", type=int, help="nextpnr's placement seed (default: its own)")
    build.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="stop the tools after this long (exit status 1)")
    build.add_argument("--verbose", action="store_true", help="stream the tools' output")
    build.add_argument("--synth-only", action="store_true",
                       help="only synthesize the core (yosys, no place and route) and print "
                            "its cells")
    build.add_argument("--per-block", action="store_true",
                       help="with --synth-only: cells per block of the core (array, softmax, "
                            "DMAs, ...)")
    build.add_argument("--timing", action="store_true",
                       help="with --synth-only --per-block: also place and route each block "
                            "alone (minutes): its Fmax and critical path")
    build.add_argument("--json", type=Path, metavar="FILE.json",
                       help="with --synth-only: also write the report as JSON")

    from .sweep import DEFAULT_TIMEOUT

    sweep = command("sweep", "design-space sweep on dask: resources, fit and the cost model's "
                             "time of the bench workloads for configurations x boards", _sweep)
    sweep.add_argument("--boards", default=",".join(BOARDS), metavar="B1,B2",
                       help=f"boards, of {', '.join(BOARDS)}")
    sweep.add_argument("--sizes", default="2x2,4x4,8x8,16x16", metavar="RxC,...",
                       help="array sizes; each board's own configuration at each size")
    sweep.add_argument("--vary", action="append", metavar="FIELD=V1,V2",
                       help="also sweep a CoreConfig field (repeatable), e.g. "
                            "axi_data_width=32,64 or softmax=true,false")
    sweep.add_argument("--place-and-route", action="store_true",
                       help="also place and route each point for its Fmax (10-60 min a point)")
    sweep.add_argument("--scheduler", metavar="tcp://HOST:8786",
                       help="a running dask scheduler (default: a local cluster)")
    sweep.add_argument("--workers", type=int, metavar="N",
                       help="processes of the local cluster (default: one per CPU)")
    sweep.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help="stop a point's job after this long and report it as timed out")
    sweep.add_argument("--cache", type=Path, metavar="DIR",
                       help="finished points, reused by a rerun (default: $TPUGEN_CACHE/sweep)")
    sweep.add_argument("-o", "--output", type=Path, default=Path("sweep"), metavar="DIR",
                       help="where sweep.csv, sweep.json, summary.md and the plots go")
    sweep.add_argument("-q", "--quiet", action="store_true", help="no progress lines")

    flash = command("flash", "program a board with openFPGALoader", _flash)
    flash.add_argument("--board", required=True, choices=sorted(BOARDS))
    flash.add_argument("bitstream", nargs="?", type=Path,
                       help="default: the last cached build for the board (and config, if given)")
    _add_config_options(flash, preset_default=None)
    flash.add_argument("--dry-run", action="store_true", help="only print the command")
    return top


def main(argv=None):
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, --version, or a usage error already printed
        return done.code
    try:
        return args.run(args) or 0
    except CommandError as error:
        message, code = str(error), error.code
    except ValueError as error:
        message, code = str(error), 2
    print(f"tpugen: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
