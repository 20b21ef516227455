"""Generated designs under Icarus Verilog and cocotb 2.x: a second simulator, for portability.

Icarus compiles the whole core in about a second, so nothing is cached; it simulates far slower
than Verilator, so it suits small configs and short runs.
"""
import json
import shutil
import time
from pathlib import Path

from cocotb_tools.runner import Icarus

from ..hdl.generate import generate_verilog
from .verilator import run_cocotb

__all__ = ["ICARUS_PACKAGE", "icarus_missing", "run_testbench_icarus"]

ICARUS_PACKAGE = "iverilog"
"""The Debian package that provides `iverilog` and `vvp`."""

TIMESCALE = ("1ns", "1ps")
"""Amaranth's Verilog has no `timescale; Icarus would otherwise count in seconds and cocotb's
10 ns clock could not be represented."""


class _Icarus(Icarus):
    """cocotb's Icarus runner, compiling as Verilog-2005 (what Yosys writes) instead of -g2012.

    Yosys makes each ``always @*`` block read a dummy ``reg ... = 0`` so that it runs once at
    time 0. Under Verilog-2005 that initializer is an event at time 0; under SystemVerilog
    (-g2012) it is not, so blocks whose inputs never change (the CSR decode, the AXI arbiter)
    keep X outputs forever.
    """

    def _build_command(self):
        commands = super()._build_command()
        for command in commands:
            command[command.index("-g2012")] = "-g2005"
        return commands


def icarus_missing():
    """Why Icarus cannot run here (a sentence naming the package), or None when it can."""
    missing = [tool for tool in ("iverilog", "vvp") if shutil.which(tool) is None]
    if not missing:
        return None
    return (f"Icarus Verilog is not installed ({' and '.join(missing)} not on PATH): "
            f"apt-get install {ICARUS_PACKAGE}")


def run_testbench_icarus(config, module, params, test_dir, *, design="tpu_core", testcase=None):
    """Run cocotb testbench ``module`` with ``params`` (plus the config) as TPUGEN_TB on Icarus.

    The design is compiled into ``test_dir/build``; the simulator's output goes to
    ``test_dir/sim.log``. Returns the stats.json the testbench wrote, with ``build_seconds`` and
    ``sim_seconds`` (wall time) added; a failing cocotb test raises AssertionError with the
    log's error lines.
    """
    reason = icarus_missing()
    if reason is not None:
        raise RuntimeError(reason)
    test_dir = Path(test_dir)
    build_dir = test_dir / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{design}.v"
    source.write_text(generate_verilog(config, design))
    runner = _Icarus()
    start = time.perf_counter()
    runner.build(sources=[source], hdl_toplevel=design, build_dir=build_dir, always=True,
                 timescale=TIMESCALE, log_file=build_dir / "build.log")
    build_seconds = time.perf_counter() - start
    start = time.perf_counter()
    run_cocotb(runner, module, design, test_dir, testcase=testcase,
               env={"TPUGEN_TB": json.dumps({"config": config.to_json(), **params})})
    sim_seconds = time.perf_counter() - start
    stats = json.loads((test_dir / "stats.json").read_text())
    return {**stats, "build_seconds": build_seconds, "sim_seconds": sim_seconds}
