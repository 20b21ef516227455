"""The whole core on Verilator under faults: resets in the middle of a program, programs back to
back, the interrupt, and SLVERR / DECERR from memory (`tpugen.sim.tb_faults`)."""
import pytest

from tpugen import CoreConfig

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
DELAYS = [3, 17, 60, 200, 600, 1200]
"""Cycles from the start of a long matmul to the reset: during the first fetches, loads,
MATMULs and STOREs."""


def _run(run_tb, testcase, **params):
    return run_tb(SMALL, "tpugen.sim.tb_faults", {"seed": 21, "backpressure": True, **params},
                  design="tpu_core", testcase=testcase)


def test_soft_reset_mid_program_then_a_good_program(run_tb):
    assert _run(run_tb, "soft_reset_mid_program", delays=DELAYS)["resets"] == len(DELAYS)


def test_hard_reset_mid_program_then_a_good_program(run_tb):
    assert _run(run_tb, "hard_reset_mid_program", delays=DELAYS)["resets"] == len(DELAYS)


def test_programs_back_to_back_without_reset(run_tb):
    jobs = [[5, 9, 7, {}], [1, 1, 1, {}], [23, 6, 11, {"relu": True}],
            [8, 17, 4, {"bias": 100, "requant": [300, 10]}], [12, 4, 9, {}],
            [3, 30, 6, {"requant": [1, 0]}], [16, 16, 16, {}]]
    assert _run(run_tb, "back_to_back", jobs=jobs)["programs"] == len(jobs)


def test_interrupt_once_per_program_and_cleared_by_the_acknowledge(run_tb):
    runs = _run(run_tb, "interrupt")["runs"]
    rises = [(r["enabled"], r["rises"]) for r in runs]
    assert rises == [(True, 1), (True, 1), (False, 0), (False, 0)]


def test_bus_errors_stop_the_core_and_soft_reset_recovers(run_tb):
    faults = [[kind, response] for kind in ("read", "fetch", "fetch-middle", "fetch-last", "write")
              for response in ("SLVERR", "DECERR")]
    assert [f[:2] for f in _run(run_tb, "bus_errors", faults=faults)["faults"]] == faults


def test_an_error_after_end_is_reported(run_tb):
    assert _run(run_tb, "errors_after_end")["failures"] == []


def test_a_memory_that_never_answers_trips_the_watchdog(run_tb):
    assert _run(run_tb, "silent_memory", kinds=["read", "fetch", "write"])["failures"] == []
