"""Portability of the generated Verilog (Icarus Verilog, `verilator -Wall`) and the bad-input table."""
import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from tpugen import CoreConfig, toolchain
from tpugen.hdl.generate import generate_verilog
from tpugen.isa import ErrorCode
from tpugen.sim.icarus import icarus_missing, run_testbench_icarus
from tpugen.sim.verilator import run_testbench

ROOT = Path(__file__).parent.parent
SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
SINGLE_LANE = CoreConfig(rows=1, cols=1, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32)
"""lanes == 1: the config whose Verilog has zero-width struct fields (ASCRANGE)."""


@pytest.mark.skipif(icarus_missing() is not None and os.environ.get("TPUGEN_REQUIRE_ICARUS") != "1",
                    reason=f"{icarus_missing()} (CI sets TPUGEN_REQUIRE_ICARUS=1: it fails there)")
def test_icarus_runs_the_core_like_verilator(tmp_path):
    """The whole-core matmul testbench (bit-exact against numpy inside) passes on Icarus, and
    every counter, cycles included, equals Verilator's for the same inputs and memory stalls."""
    params = {"seed": 3, "shapes": [[1, 1, 1], [5, 9, 7]], "backpressure": True}
    icarus = run_testbench_icarus(SMALL, "tpugen.sim.tb_core", params, tmp_path / "icarus",
                                  testcase="matmul")
    verilator = run_testbench(SMALL, "tpugen.sim.tb_core", params, tmp_path / "verilator",
                              design="tpu_core", testcase="matmul")
    assert [run["shape"] for run in icarus["runs"]] == params["shapes"]
    assert icarus["runs"] == verilator["runs"]


def test_icarus_absence_names_the_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "apt-get install iverilog" in icarus_missing()
    with pytest.raises(RuntimeError, match="apt-get install iverilog"):
        run_testbench_icarus(SMALL, "tpugen.sim.tb_core", {}, "/nonexistent")


def _write_verilog(config, directory):
    path = directory / "tpu_core.v"
    path.write_text(generate_verilog(config, "tpu_core"))
    return path


@pytest.mark.parametrize("config", [SMALL, CoreConfig()], ids=["small", "default"])
def test_wall_lint_passes_with_the_documented_waivers(config, tmp_path):
    assert toolchain.lint_verilog(_write_verilog(config, tmp_path), "tpu_core") == []


def _warning_codes(path, *flags):
    result = subprocess.run([str(toolchain.use_verilator()), "--lint-only", "-Wno-fatal", *flags,
                             "--top-module", "tpu_core", str(path)], capture_output=True, text=True)
    return set(re.findall(r"%Warning-([A-Z_]+)", result.stderr))


def _codes(waivers):
    return {waiver.removeprefix("-Wno-") for waiver in waivers}


def test_every_waiver_is_needed_and_in_the_right_list(tmp_path):
    """Without waivers, Verilator's default warnings on a single-lane core are exactly
    VERILATOR_WAIVERS, and -Wall adds exactly VERILATOR_WALL_WAIVERS."""
    path = _write_verilog(SINGLE_LANE, tmp_path)
    default = _warning_codes(path)
    assert default == _codes(toolchain.VERILATOR_WAIVERS)
    assert _warning_codes(path, "-Wall") - default == _codes(toolchain.VERILATOR_WALL_WAIVERS)


BAD_INPUTS = ROOT / "docs" / "bad-inputs.md"
NOT_BAD_INPUTS = {
    ("tests/test_fpga_build.py", "test_build_makes_board_system_for_the_board_and_config"):
        "a fake BoardSystem raises to stop the build once it has recorded its arguments",
}
"""Tests that expect an exception for another reason than a bad input."""


def _test_functions(path):
    return {node.name: node for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test")}


def _expects_an_exception(function):
    """It calls ``pytest.raises`` or takes the ``refuses`` fixture (conftest.py)."""
    return any(arg.arg == "refuses" for arg in function.args.args) or any(
        isinstance(node, ast.Attribute) and node.attr == "raises"
        and isinstance(node.value, ast.Name) and node.value.id == "pytest"
        for node in ast.walk(function))


def _tests_named_in_the_table():
    return set(re.findall(r"`(tests/test_\w+\.py)::(\w+)`", BAD_INPUTS.read_text()))


def test_bad_inputs_table_has_every_error_code():
    text = BAD_INPUTS.read_text()
    assert [code.name for code in ErrorCode
            if code != ErrorCode.NONE and f"`{code.name}`" not in text] == []


def test_bad_inputs_table_names_only_tests_that_exist():
    named = _tests_named_in_the_table()
    assert len(named) > 40
    assert sorted(f"{file}::{test}" for file, test in named
                  if not (ROOT / file).exists() or test not in _test_functions(ROOT / file)) == []


def test_every_test_expecting_an_exception_is_in_the_bad_inputs_table():
    named = _tests_named_in_the_table()
    expecting = {(f"tests/{path.name}", name)
                 for path in sorted((ROOT / "tests").glob("test_*.py"))
                 for name, node in _test_functions(path).items()
                 if _expects_an_exception(node)}
    assert len(expecting) > 30
    assert set(NOT_BAD_INPUTS) <= expecting, "an exemption names a test that expects no exception"
    assert sorted(f"{file}::{test}" for file, test in expecting - named - set(NOT_BAD_INPUTS)) == []


GENERATED_FILES = {"tpu_params.h", "dump.gtkw", "tpu_job.c", "tpu_job.h", "job.json", "top.json",
                   "unrouted.txt"}
"""Files the documents name that the tools write (not kept in the repository)."""


def test_documents_cite_only_files_in_the_repository():
    cited = re.compile(r"`([\w./-]+\.(?:py|md|h|c|json|png|v|gtkw|toml|txt|svg))`")
    missing = []
    for document in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in cited.findall(document.read_text()):
            places = (ROOT / name, document.parent / name, ROOT / "tpugen" / name)
            if name not in GENERATED_FILES and not any(place.exists() for place in places):
                missing.append(f"{document.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_every_dependency_is_pinned_once_with_a_reason():
    """pyproject.toml declares ranges; constraints.txt pins each one exactly, under a comment."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"],
                *(d for extra in project["optional-dependencies"].values() for d in extra)]
    names = {re.match(r"[A-Za-z0-9_.-]+", d)[0].lower() for d in declared}
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = {}
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            name, version = line.split("==")
            assert lines[index - 1].startswith("#") or "==" in lines[index - 1], line
            pins[name.lower()] = version
    assert names <= set(pins), names - set(pins)
