"""The whole tpu_core on Verilator: programs from the firmware, on cocotbext-axi's AxiRam and
on `HostileAxiRam` (every freedom an AXI4 slave has: AWREADY after WVALID, random stalls, long
latencies, responses reordered between IDs)."""
import pytest

from tpugen import CoreConfig

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
MEMORIES = pytest.mark.parametrize("hostile", [False, True], ids=["fast-memory", "hostile"])


@MEMORIES
def test_tiled_matmul_is_exact(run_tb, hostile):
    shapes = [[1, 1, 1], [5, 9, 7], [37, 13, 6], [4, 4, 4]]
    stats = run_tb(SMALL, "tpugen.sim.tb_core",
                   {"seed": 3, "shapes": shapes, "hostile": hostile},
                   design="tpu_core", testcase="matmul")
    for entry, (m, k, n) in zip(stats["runs"], shapes):
        assert entry["macs"] > 0 and entry["cycles"] > 0
        assert entry["bytes_written"] == 4 * m * n


@MEMORIES
def test_padded_tiles_load_like_numpy(run_tb, hostile):
    run_tb(SMALL, "tpugen.sim.tb_core", {"seed": 11, "cases": 12, "hostile": hostile},
           design="tpu_core", testcase="tiles")


def test_every_error_stops_cleanly_and_soft_reset_recovers(run_tb):
    from tpugen.isa import ErrorCode

    stats = run_tb(SMALL, "tpugen.sim.tb_core", {"seed": 5, "hostile": True},
                   design="tpu_core", testcase="errors")
    provoked = set(stats["errors"])
    # BUS_ERROR: tests/test_faults_verilator.py; ADDRESS_OVERFLOW is retired (addresses wrap)
    untested = {code.name for code in ErrorCode} - provoked - {"NONE", "BUS_ERROR",
                                                               "ADDRESS_OVERFLOW"}
    assert not untested, f"error codes never provoked on the core: {untested}"


CONV_CASES = [
    {"x": [1, 3, 7, 6], "w": [5, 3, 3, 3], "stride": 1, "padding": 1, "dilation": 1},
    {"x": [2, 5, 9, 8], "w": [3, 5, 3, 3], "stride": 2, "padding": 0, "dilation": 1},
    {"x": [1, 6, 5, 5], "w": [7, 6, 1, 1], "stride": 1, "padding": 0, "dilation": 1},
    {"x": [1, 2, 9, 9], "w": [4, 2, 5, 5], "stride": 1, "padding": 2, "dilation": 1},
    {"x": [1, 3, 9, 7], "w": [2, 3, 3, 3], "stride": 2, "padding": 2, "dilation": 2},
    {"x": [1, 1, 3, 11], "w": [1, 1, 3, 3], "stride": 3, "padding": 4, "dilation": 1},
]
"""Padding everywhere (even whole rows and kernel columns outside the image), strides, dilation,
1x1 / 3x3 / 5x5 kernels, channel counts that are not multiples of the array."""


@pytest.mark.parametrize("lowering", ["pixels", "im2col"])
@MEMORIES
def test_conv2d_lowerings_are_exact(run_tb, hostile, lowering):
    # The pixels lowering both with tiles of one output row and with tiles that span rows
    # (several rows a tile where Q < 4, two where Q is not a multiple of 4; batch 2).
    cases = ([{**case, "lowering": lowering, "span": span} for case in CONV_CASES
              for span in (False, True)] if lowering == "pixels"
             else [{**case, "lowering": lowering} for case in CONV_CASES])
    run_tb(SMALL, "tpugen.sim.tb_core", {"seed": 9, "cases": cases, "hostile": hostile},
           design="tpu_core", testcase="conv2d")


def test_a_narrow_core_ignores_the_address_bits_above_it(run_tb):
    """`CoreConfig.address_width` 20, the 1 MiB memory of the testbench (sim/tb_core.py)."""
    config = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        address_width=20)
    stats = run_tb(config, "tpugen.sim.tb_core", {"seed": 13, "shape": [19, 11, 6],
                                                   "hostile": True},
                   design="tpu_core", testcase="narrow_addresses")
    assert stats["base"] >> 20, "PROGRAM_BASE had no bits above the core's"


@pytest.mark.parametrize("width", [32, 128])
def test_other_bus_widths(run_tb, width):
    config = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=width)
    run_tb(config, "tpugen.sim.tb_core", {"seed": width, "shapes": [[9, 7, 5], [33, 12, 10]],
                                           "hostile": True},
           design="tpu_core", testcase="matmul")
