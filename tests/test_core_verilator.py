"""The whole tpu_core on Verilator: programs from the firmware, cocotbext-axi memory."""
import pytest

from tpugen import CoreConfig

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)


@pytest.mark.parametrize("backpressure", [False, True], ids=["fast-memory", "backpressure"])
def test_tiled_matmul_is_exact(run_tb, backpressure):
    shapes = [[1, 1, 1], [5, 9, 7], [37, 13, 6], [4, 4, 4]]
    stats = run_tb(SMALL, "tpugen.sim.tb_core",
                   {"seed": 3, "shapes": shapes, "backpressure": backpressure},
                   design="tpu_core", testcase="matmul")
    for entry, (m, k, n) in zip(stats["runs"], shapes):
        assert entry["macs"] > 0 and entry["cycles"] > 0
        assert entry["bytes_written"] == 4 * m * n


@pytest.mark.parametrize("backpressure", [False, True], ids=["fast-memory", "backpressure"])
def test_padded_tiles_load_like_numpy(run_tb, backpressure):
    run_tb(SMALL, "tpugen.sim.tb_core", {"seed": 11, "cases": 12, "backpressure": backpressure},
           design="tpu_core", testcase="tiles")


def test_every_error_stops_cleanly_and_soft_reset_recovers(run_tb):
    from tpugen.isa import ErrorCode

    stats = run_tb(SMALL, "tpugen.sim.tb_core", {"seed": 5, "backpressure": True},
                   design="tpu_core", testcase="errors")
    provoked = set(stats["errors"])
    untested = {code.name for code in ErrorCode} - provoked - {"NONE", "BUS_ERROR"}
    assert not untested, f"error codes never provoked on the core: {untested}"
