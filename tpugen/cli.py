"""The `tpugen` command line."""
import argparse
import json
import sys
import time
from pathlib import Path

from .config import PRESETS, CoreConfig


def _add_config_options(parser):
    group = parser.add_argument_group("core configuration (preset, then file, then overrides)")
    group.add_argument("--preset", choices=sorted(PRESETS), default="default")
    group.add_argument("--config", type=Path, metavar="FILE.json", help="CoreConfig as JSON")
    group.add_argument("--rows", type=int, help="array rows (1..64)")
    group.add_argument("--cols", type=int, help="array columns (1..64)")


def _config(args):
    config = CoreConfig.from_json(args.config.read_text()) if args.config else PRESETS[args.preset]
    overrides = {name: getattr(args, name) for name in ("rows", "cols")
                 if getattr(args, name) is not None}
    return CoreConfig(**{**json.loads(config.to_json()), **overrides})


def _generate(args):
    from .hdl.generate import generate_verilog

    config = _config(args)
    start = time.perf_counter()
    text = generate_verilog(config, args.design)
    args.output.write_text(text)
    print(f"wrote {args.output} ({args.design}, {config.rows}x{config.cols}) "
          f"in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    if args.header:
        from .firmware.c_header import c_header

        args.header.write_text(c_header(config))
        print(f"wrote {args.header}", file=sys.stderr)


def _demo(args):
    from .demo import run_demo

    return run_demo(_config(args))


def _run(args):
    from .demo import run_workloads

    if args.op == "matmul":
        shape = {"m": args.m, "k": args.k, "n": args.n}
    elif args.op == "conv2d":
        shape = {"n": args.batch, "c": args.channels, "h": args.height, "w": args.width,
                 "k": args.filters, "r": args.kernel, "s": args.kernel, "stride": args.stride,
                 "padding": args.padding, "dilation": args.dilation}
    else:
        shape = {"heads": args.heads, "seq": args.seq, "kv": args.kv, "dim": args.dim}
    for name, value in shape.items():
        if value < (0 if name == "padding" else 1):
            raise ValueError(f"{name}={value} is invalid: must be >= {0 if name == 'padding' else 1}")
    if args.op == "attention":
        shape["causal"] = args.causal
    else:
        shape.update({name: getattr(args, name) for name in ("bias", "requant", "relu")})
        if args.op == "conv2d":
            shape["pool"] = args.pool
    status = run_workloads(_config(args), [(args.op, shape)], seed=args.seed, waves=args.waves)
    if args.waves:
        print(f"wrote {args.waves} (VCD: open with GTKWave or Surfer)", file=sys.stderr)
    return status


def _bench(args):
    from .bench import BenchCheckError, plot_bench, run_bench
    from .demo import format_table

    try:
        results = run_bench(quick=args.quick, builds=args.builds)
    except BenchCheckError as error:
        # A number for a wrong answer is worthless: say so, keep what was measured, fail.
        args.out.write_text(json.dumps(error.results, indent=2) + "\n")
        print(f"tpugen bench: FAILED: {error}\nwrote {args.out} (the workloads so far)",
              file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(results, indent=2) + "\n")
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
    print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        plot_bench(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)


def _board_config(args, board):
    """The config named by --config or --preset, else the board's default for --rows/--cols."""
    if args.config or args.preset:
        return _config(args)
    return board.default_config(args.rows, args.cols)


def _synthesize(args, board, config):
    """`build --synth-only`: the core's cells from yosys alone, per block with --per-block."""
    from .fpga.synth import format_synth_report, synth_report

    kept = "hierarchy kept" if args.per_block else "flat"
    print(f"synthesizing a {config.rows}x{config.cols} core for {board.family} ({board.name}) "
          f"with yosys, {kept}, no place and route (minutes)", file=sys.stderr)
    try:
        report = synth_report(config, board.family, per_block=args.per_block)
    except RuntimeError as error:  # yosys missing or failing
        print(f"tpugen: error: {error}", file=sys.stderr)
        return 1
    print(f"synthesized in {report['seconds']:.0f} s", file=sys.stderr)
    fields = json.loads(config.to_json())
    print(f"{board.name} ({board.device}), `{report['command']}` in {report['seconds']:.0f} s; "
          "config " + ", ".join(f"{name}={value}" for name, value in fields.items()) + "\n")
    print(format_synth_report(report))
    if args.json:
        report = {"board": board.name, "device": board.device, "config": fields, **report}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


def _build(args):
    from .fpga.boards import board_named
    from .fpga.build import BuildError, build, format_report

    board = board_named(args.board)
    config = _board_config(args, board)
    if args.synth_only and (args.freq is not None or args.out_dir):
        raise ValueError("--freq and --out-dir are for place and route: leave out --synth-only")
    if not args.synth_only and (args.per_block or args.json):
        raise ValueError("--per-block and --json need --synth-only")
    if args.synth_only:
        return _synthesize(args, board, config)
    out_dir = args.out_dir or Path("build") / board.name
    print(f"building a {config.rows}x{config.cols} core for the {board.name} with yosys and "
          "nextpnr (minutes unless cached)", file=sys.stderr)
    try:
        result = build(board, config, freq_mhz=args.freq, out_dir=out_dir)
    except BuildError as error:
        if error.report:
            print(format_report(error.report))
        print(f"tpugen: error: {error}", file=sys.stderr)
        return 1
    print(format_report(result.report))
    print(f"wrote {out_dir / result.bitstream.name}, {out_dir / 'report.json'}, "
          f"{out_dir / 'report.txt'}" + (" (cached build)" if result.cached else ""),
          file=sys.stderr)


def _flash(args):
    from .fpga.boards import board_named
    from .fpga.flash import FlashError, flash

    board = board_named(args.board)
    chosen = args.config or args.preset or args.rows or args.cols
    try:
        flash(board, args.bitstream, config=_board_config(args, board) if chosen else None,
              dry_run=args.dry_run)
    except FlashError as error:
        print(f"tpugen: error: {error}", file=sys.stderr)
        return 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tpugen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="write Verilog for a configured core")
    _add_config_options(generate)
    generate.add_argument("-o", "--output", type=Path, default=Path("tpu.v"))
    generate.add_argument("--header", type=Path, metavar="FILE.h",
                          help="also write a C header: register map, config, ISA codes")
    generate.add_argument("--design", default="tpu_core", choices=["tpu_core", "systolic_array"],
                          help="top module: the whole core (default) or the bare array")
    generate.set_defaults(run=_generate)

    demo = commands.add_parser("demo", help="verify a core on Verilator against numpy")
    _add_config_options(demo)
    demo.set_defaults(run=_demo)

    run = commands.add_parser("run", help="run one workload on the simulated core, checked")
    run.add_argument("op", choices=["matmul", "conv2d", "attention"])
    _add_config_options(run)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--waves", type=Path, metavar="FILE.vcd", help="trace the run to a VCD file")
    shapes = run.add_argument_group("matmul shape (int8 A: M x K, B: K x N)")
    shapes.add_argument("--m", type=int, default=64)
    shapes.add_argument("--k", type=int, default=64)
    shapes.add_argument("--n", type=int, default=64)
    conv = run.add_argument_group("conv2d shape (NCHW int8 x, KCRS int8 w)")
    conv.add_argument("--batch", type=int, default=1)
    conv.add_argument("--channels", type=int, default=8)
    conv.add_argument("--height", type=int, default=16)
    conv.add_argument("--width", type=int, default=16)
    conv.add_argument("--filters", type=int, default=8)
    conv.add_argument("--kernel", type=int, default=3)
    conv.add_argument("--stride", type=int, default=1)
    conv.add_argument("--padding", type=int, default=1)
    conv.add_argument("--dilation", type=int, default=1)
    fused = run.add_argument_group("fused epilogue (random per-channel parameters)")
    fused.add_argument("--bias", action="store_true", help="add a bias")
    fused.add_argument("--requant", action="store_true", help="requantize to int8")
    fused.add_argument("--relu", action="store_true")
    fused.add_argument("--pool", action="store_true", help="2x2 max pooling (conv2d)")
    attention = run.add_argument_group("attention shape (float32 q: L x d, k, v: S x d)")
    attention.add_argument("--seq", type=int, default=64, help="L, queries")
    attention.add_argument("--kv", type=int, default=64, help="S, keys and values")
    attention.add_argument("--dim", type=int, default=64, help="d, head dimension")
    attention.add_argument("--heads", type=int, default=1)
    attention.add_argument("--causal", action="store_true")
    run.set_defaults(run=_run)

    bench = commands.add_parser("bench", help="measure generate/build/simulation speed")
    bench.add_argument("--out", type=Path, default=Path("bench.json"))
    bench.add_argument("--plot", type=Path, help="PNG of utilization against the ideal")
    bench.add_argument("--quick", action="store_true",
                       help="leave out the large workloads of the targets (512-cube matmul, "
                            "56x56 conv, L=512 attention on 16x16)")
    bench.add_argument("--builds", action="store_true",
                       help="run the board builds of the targets that are not cached (hours)")
    bench.set_defaults(run=_bench)

    build = commands.add_parser("build", help="bitstream and report (Fmax, resources) for a board")
    build.add_argument("--board", required=True, help="ulx3s-85f, icebreaker, ...")
    _add_config_options(build)
    build.set_defaults(preset=None)
    build.add_argument("--freq", type=float, metavar="MHZ",
                       help="core clock target (default: the board's)")
    build.add_argument("-o", "--out-dir", type=Path,
                       help="where to copy the bitstream and report (default: build/BOARD)")
    build.add_argument("--synth-only", action="store_true",
                       help="only synthesize the core (yosys, no place and route) and print "
                            "its cells")
    build.add_argument("--per-block", action="store_true",
                       help="with --synth-only: cells per block of the core (array, softmax, "
                            "DMAs, ...)")
    build.add_argument("--json", type=Path, metavar="FILE.json",
                       help="with --synth-only: also write the report as JSON")
    build.set_defaults(run=_build)

    flash = commands.add_parser("flash", help="program a board with openFPGALoader")
    flash.add_argument("--board", required=True, help="ulx3s-85f, icebreaker, ...")
    flash.add_argument("bitstream", nargs="?", type=Path,
                       help="default: the last cached build for the board (and config, if given)")
    _add_config_options(flash)
    flash.set_defaults(preset=None)
    flash.add_argument("--dry-run", action="store_true", help="only print the command")
    flash.set_defaults(run=_flash)

    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except ValueError as error:
        parser.exit(2, f"tpugen: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
