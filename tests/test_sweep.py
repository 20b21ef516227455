"""tpugen sweep: grids, the cost model's numbers, failed and timed-out points, the results cache,
a scheduler and workers started as separate processes, and the CLI's errors. The point's job
(synthesis) is replaced by `fake_measure`, given to `run_sweep` as its ``measure``."""
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tpugen.fpga.boards import board_named
from tpugen.sweep import (WORKLOADS, Point, best_configurations, grid, parse_sizes, parse_vary,
                          run_sweep, write_results)

LOG = "TPUGEN_SWEEP_TEST_LOG"
"""The directory where `fake_measure` records each call (the environment reaches the workers
and their job processes)."""
SLEEP_ROWS = 3
"""`fake_measure` sleeps on a point of this many rows (to be timed out) ..."""
FAIL_ROWS = 5
"""... and raises on one of this many."""
TIMEOUT = 3
"""Seconds a job may take (once its process has started and loaded it)."""


def fake_measure(board_name, config, place_and_route):
    """Resources in proportion to the array (100 LUTs a PE), recording the call (pid, parent)."""
    log = Path(os.environ[LOG])
    (log / f"{board_name}-{config.rows}x{config.cols}-{os.getpid()}-{os.getppid()}").touch()
    if config.rows == SLEEP_ROWS:
        time.sleep(600)
    if config.rows == FAIL_ROWS:
        raise ValueError(f"no synthesis for {config.rows} rows")
    return {"resources": {"luts": 100 * config.macs, "ffs": 30 * config.macs,
                          "dsps": config.macs // 4, "block_rams": 2, "sprams": 0},
            "fmax_mhz": None, "source": "fake"}


def calls(log):
    """How many times `fake_measure` ran."""
    return len(list(log.iterdir()))


@pytest.fixture
def log(tmp_path, monkeypatch):
    path = tmp_path / "calls"
    path.mkdir()
    monkeypatch.setenv(LOG, str(path))
    return path


def test_grid_and_specs():
    points = grid(["icebreaker", "ulx3s-85f"], parse_sizes("2x2, 16x16"),
                  parse_vary(["axi_data_width=32,64", "softmax=true,false"]))
    assert len(points) == 2 * 2 * 4
    assert {(p.config.axi_data_width, p.config.softmax) for p in points} == {
        (32, True), (32, False), (64, True), (64, False)}
    # Unvaried, a point is the board's own configuration at that size.
    for name in ("icebreaker", "ulx3s-85f"):
        board = board_named(name)
        for rows, cols in ((2, 2), (4, 8), (16, 16)):
            assert grid([name], [(rows, cols)])[0].config == board.default_config(rows, cols)
    # The ULX3S's DSPs left beside the epilogue's hold PEs; the softmax unit takes none.
    board = board_named("ulx3s-85f")
    big = [p.config for p in points if p.board == "ulx3s-85f" and p.config.rows == 16]
    for config in big:
        assert config.lut_multipliers == config.macs - board.dsp_pes(config)
    assert {c.lut_multipliers for c in big} == {256 - (156 - board.reserved_dsps)}
    assert len({p.label for p in points}) == len(points)
    # Its own: 32-bit AXI, no softmax, no epilogue multiplier (which the softmax unit needs).
    assert points[0].label == "icebreaker 2x2 softmax=True epilogue_multiplier=True"
    assert points[0].config.epilogue_multiplier
    assert points[-1].label == "ulx3s-85f 16x16 softmax=False"  # its own: 64-bit AXI
    for bad, match in (("4by4", "--sizes '4by4'"), ("4x", "--sizes '4x'"), ("", "--sizes ''")):
        with pytest.raises(ValueError, match=match):
            parse_sizes(bad)
    for bad, match in (("rows=2", "FIELD one of"), ("axi_data_width=wide", "not a int"),
                       ("softmax", "--vary 'softmax'"), ("im2col=maybe", "not a bool")):
        with pytest.raises(ValueError, match=match):
            parse_vary([bad])
    with pytest.raises(ValueError, match="scratchpad_kib=3"):
        grid(["ulx3s-85f"], [(2, 2)], {"scratchpad_kib": [3]})
    with pytest.raises(ValueError, match="rows=65"):
        grid(["ulx3s-85f"], [(65, 2)])


def _check_ok_row(row, point):
    """Derived numbers of a measured row from the cost model itself and the fake resources."""
    from tpugen.firmware.gemm_cost import gemm_cycles
    from tpugen.firmware.gemm_plan import plan_gemm

    board = board_named(point.board)
    luts = 100 * point.config.macs
    assert row["status"] == "ok" and row["error"] == "" and row["source"] == "fake"
    assert row["resources"]["luts"] == {"used": luts, "total": board.total("luts"),
                                        "percent": round(100 * luts / board.total("luts"), 1)}
    assert row["fits"] == all(
        numbers["used"] <= numbers["total"] for numbers in row["resources"].values())
    assert row["clock_mhz"] == board.default_mhz and row["fmax_mhz"] is None
    entry = next(e for e in row["workloads"] if e["op"] == "matmul" and e["shape"] == [64] * 3)
    cycles = math.ceil(gemm_cycles(point.config, plan_gemm(point.config, 64, 64, 64)))
    assert entry["cycles"] == cycles
    assert entry["seconds"] == pytest.approx(cycles / (board.default_mhz * 1e6), rel=1e-12)
    assert entry["macs_per_second"] == pytest.approx(64 ** 3 / entry["seconds"], rel=1e-12)
    assert entry["macs_per_second_per_lut"] == pytest.approx(entry["macs_per_second"] / luts,
                                                             rel=1e-12)
    assert len(row["workloads"]) == len(WORKLOADS)


@pytest.mark.dask
def test_failures_timeouts_and_cache(log, tmp_path):
    """On the default LocalCluster: a point that raises and one that times out are reported,
    the others measured; the timed-out job's process is killed; a rerun reuses the cache."""
    points = grid(["icebreaker", "ulx3s-85f"], [(2, 2)]) + grid(["icebreaker"], [(FAIL_ROWS, 2)])
    points += grid(["ulx3s-85f"], [(SLEEP_ROWS, 2)])
    points.append(Point("icebreaker", replace(points[0].config, rows=16, cols=16,
                                              lut_multipliers=240)))  # 25,600 LUTs: too many
    start = time.monotonic()
    rows = run_sweep(points, measure=fake_measure, workers=2, timeout=TIMEOUT,
                     cache=tmp_path / "c", quiet=True)
    assert time.monotonic() - start < 300  # the sleeper (600 s) was not waited for
    assert calls(log) == len(points), [(row["status"], row["error"]) for row in rows]
    for point, row in zip(points, rows):
        assert row["label"] == point.label and row["cached"] is False
        if point.config.rows == FAIL_ROWS:
            assert (row["status"], row["error"]) == ("failed",
                                                     "ValueError: no synthesis for 5 rows")
            assert row["fits"] is None and row["resources"]["luts"]["used"] is None
        elif point.config.rows == SLEEP_ROWS:
            assert (row["status"], row["error"]) == ("timeout", f"timed out after {TIMEOUT} s")
            assert TIMEOUT <= row["job_seconds"] < TIMEOUT + 10
        else:
            _check_ok_row(row, point)
    assert [row["fits"] for row in rows] == [True, True, None, None, False]
    # The timed-out job's process is gone.
    for name in os.listdir(log):
        if name.startswith(f"ulx3s-85f-{SLEEP_ROWS}x2"):
            with pytest.raises(ProcessLookupError):
                os.kill(int(name.split("-")[-2]), 0)
    # Only the measured points are cached; a restart measures nothing of them again.
    assert len(list((tmp_path / "c").iterdir())) == len(points) - 2
    done = [p for p in points if p.config.rows not in (FAIL_ROWS, SLEEP_ROWS)]
    again = run_sweep(done, measure=fake_measure, cache=tmp_path / "c", quiet=True)
    assert calls(log) == len(points)
    assert all(row["cached"] for row in again)
    assert [row["workloads"] for row in again] == [row["workloads"] for row in rows
                                                   if row["status"] == "ok"]
    # The outputs: the fastest fitting point per board and workload, each file written.
    written = write_results(rows, tmp_path / "out", "tpugen sweep (test)")
    assert sorted(p.name for p in written) == ["pareto.png", "resources.png", "summary.md",
                                               "sweep.csv", "sweep.json"]
    assert json.loads((tmp_path / "out" / "sweep.json").read_text()) == rows
    best = best_configurations(rows)
    assert {board: {row["label"] for row in chosen.values()}
            for board, chosen in best.items()} == {"icebreaker": {"icebreaker 2x2"},
                                                   "ulx3s-85f": {"ulx3s-85f 2x2"}}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Best configuration on the icebreaker: **icebreaker 2x2**" in summary
    assert f"timeout: timed out after {TIMEOUT} s" in summary
    header, *lines = (tmp_path / "out" / "sweep.csv").read_text().splitlines()
    assert len(lines) == len(points) and "matmul 64x64x64 cycles" in header


@pytest.mark.dask
def test_separate_scheduler_and_workers(log, tmp_path):
    """A scheduler and two workers started as processes of their own (as on other machines)
    run a small grid: every job runs under one of those workers. Before the workers start, the
    sweep stops: the scheduler has none."""
    import dask
    from distributed import Client

    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    dask_cli = [sys.executable, "-m", "dask"]
    common = ["--scheduler-file", str(scheduler_file), "--no-dashboard"]
    processes = [subprocess.Popen(dask_cli + ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                          *common], env=env, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                address = json.loads(scheduler_file.read_text())["address"]
                break
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                assert time.monotonic() < deadline, "the scheduler did not start"
                time.sleep(0.2)
        points = grid(["ulx3s-85f"], [(2, 2), (4, 4)]) + grid(["icebreaker"], [(2, 4)])
        with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
            with pytest.raises(ConnectionError, match=f"the dask scheduler at {address} has no "
                                                      "workers"):
                run_sweep(points, measure=fake_measure, scheduler=address, cache=tmp_path / "c")
        for _ in range(2):
            processes.append(subprocess.Popen(
                dask_cli + ["worker", "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                        "--death-timeout", "60", *common], env=env, stderr=subprocess.DEVNULL))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=60)
        rows = run_sweep(points, measure=fake_measure, scheduler=address, timeout=60,
                         cache=tmp_path / "c", quiet=True)
        for row, point in zip(rows, points):
            _check_ok_row(row, point)
        parents = {int(name.split("-")[-1]) for name in os.listdir(log)}
        assert len(os.listdir(log)) == len(points)
        assert parents <= {worker.pid for worker in processes[1:]}
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.parametrize("argv, code, message", [
    (["--sizes", "4by4"], 2, "--sizes '4by4' is invalid"),
    (["--vary", "rows=2"], 2, "--vary 'rows=2' is invalid"),
    (["--boards", "de10"], 2, "unknown board 'de10'"),
    (["--timeout", "0"], 2, "timeout=0.0 is invalid"),
    (["--scheduler", "tcp://127.0.0.1:9"], 3, "cannot reach the dask scheduler at "
                                              "tcp://127.0.0.1:9"),
])
def test_cli_errors(argv, code, message, tmp_path, capsys):
    import dask

    from tpugen.cli import main

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        assert main(["sweep", "--boards", "icebreaker", "--sizes", "2x2", "--cache",
                     str(tmp_path / "c"), "-o", str(tmp_path / "out"), *argv]) == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.fpga
@pytest.mark.skipif(not os.environ.get("TPUGEN_SWEEP_SYNTH"),
                    reason="a real synthesis (minutes): TPUGEN_SWEEP_SYNTH=1")
def test_synthesis_point(tmp_path):
    """The default job on one point: a flat yosys synthesis of the core, its LUT equivalents,
    and the CLI's files from the cache it filled (a second run synthesizes nothing)."""
    from tpugen.cli import main
    from tpugen.fpga.synth import synth_cells
    from tpugen.sweep import lut_equivalents

    point = grid(["ulx3s-85f"], [(2, 2)])[0]
    row, = run_sweep([point], workers=1, cache=tmp_path / "c", quiet=True)
    assert row["status"] == "ok", row["error"]
    assert row["fits"] is True and row["source"] == "yosys (core alone)"
    cells = synth_cells(point.config, "ecp5")
    counts = {"luts": sum(n for c, n in cells.items() if c == "LUT4"),
              "carry": cells.get("CCU2C", 0), "lut_rams": cells.get("TRELLIS_DPR16X4", 0)}
    assert row["resources"]["luts"]["used"] == lut_equivalents("ecp5", counts)
    assert row["resources"]["dsps"]["used"] == cells.get("MULT18X18D", 0)
    start = time.monotonic()
    assert main(["sweep", "--boards", "ulx3s-85f", "--sizes", "2x2", "--cache",
                 str(tmp_path / "c"), "-o", str(tmp_path / "out"), "-q"]) == 0
    assert time.monotonic() - start < 60
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())[0]["resources"] == \
        row["resources"]
