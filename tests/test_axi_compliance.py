"""AXI4 compliance of the whole core on Verilator (`tpugen.sim.tb_compliance`): jobs on a slave
that holds AWREADY until WVALID and stalls every channel at random, and the configuration a
program runs with locked while it runs. The AXI checker watches both (conftest.py's run_tb)."""
import dataclasses

from tpugen import CoreConfig
from tpugen.config import PRESETS
from tpugen.isa import NUM_WINDOWS

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)


def test_jobs_are_exact_on_a_slave_that_waits_for_write_data(run_tb):
    stats = run_tb(SMALL, "tpugen.sim.tb_compliance", {
        "seed": 15, "matmul": [13, 10, 9],
        "conv2d": {"x": [1, 3, 6, 5], "w": [5, 3, 3, 3], "stride": 1, "padding": 1,
                   "dilation": 1},
        "attention": {"heads": 1, "seq": 6, "kv": 9, "dim": 5, "causal": True},
    }, design="tpu_core", testcase="replay")
    assert [run["name"].split()[0] for run in stats["runs"]] == ["matmul", "conv2d", "attention"]
    assert all(run["macs"] > 0 and run["bytes_written"] > 0 for run in stats["runs"])
    assert stats["slave"]["aw_held"] > 0, "AWVALID never waited for write data"
    assert stats["slave"]["overtaken"] > 0, "no response overtook an earlier request's"


def test_the_micro_core_is_exact_on_that_slave(run_tb):
    """The micro profile (one-deep queues, a store engine without prefetch, one DMA front for
    both engines: `CoreConfig.shared_dma`) on the same slave: the front changes hands between
    every LOAD and STORE while the slave stalls and reorders."""
    micro = dataclasses.replace(PRESETS["micro"], scratchpad_kib=1, accumulator_kib=1)
    stats = run_tb(micro, "tpugen.sim.tb_compliance", {
        "seed": 17, "matmul": [9, 7, 6],
        "conv2d": {"x": [1, 2, 5, 5], "w": [3, 2, 3, 3], "stride": 1, "padding": 1,
                   "dilation": 1},
    }, design="tpu_core", testcase="replay")
    assert [run["name"].split()[0] for run in stats["runs"]] == ["matmul", "conv2d"]
    assert all(run["macs"] > 0 and run["bytes_written"] > 0 for run in stats["runs"])
    assert stats["slave"]["aw_held"] > 0 and stats["slave"]["overtaken"] > 0


def test_configuration_is_locked_while_a_program_runs(run_tb):
    stats = run_tb(SMALL, "tpugen.sim.tb_compliance", {"seed": 16, "matmul": [32, 24, 16]},
                   design="tpu_core", testcase="locked_registers")
    windows = [f"WINDOW{i}_{field}" for i in range(NUM_WINDOWS)
               for field in ("BASE", "SIZE", "FLAGS")]
    assert stats["refused"] == sorted(["PROGRAM_BASE", "PROGRAM_LENGTH", "WATCHDOG", *windows])
