"""The whole board end to end without a board: `BoardSystem` (UART bridge, core, on-chip memory)
on Verilator, driven by `BoardDevice` through the link protocol over a simulated UART."""
import os

import numpy as np
import pytest

from tpugen import CoreConfig
from tpugen.config import PRESETS
from tpugen.firmware.board import BoardDevice, config_from_registers
from tpugen.firmware.device import DeviceError
from tpugen.sim.board_sim import simulated_board
from tpugen.registers import CSR_VERSION, constant_registers
from tpugen.sim.golden import conv2d_int32, matmul_int32

BOARD_CORE = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32)


def _board_defaults():
    """The configurations `tpugen build` makes for each board, as the board builds use them."""
    from tpugen.fpga.boards import BOARDS

    slow = pytest.mark.skipif(os.environ.get("TPUGEN_BOARD_SIMS") != "1",
                              reason="an 8x8 or 16x16 board system: set TPUGEN_BOARD_SIMS=1 "
                                     "(minutes each)")
    ulx3s, icebreaker = BOARDS["ulx3s-85f"], BOARDS["icebreaker"]
    return [pytest.param(icebreaker.default_config(), id="icebreaker-micro"),
            pytest.param(ulx3s.default_config(8, 8), id="ulx3s-85f-8x8", marks=slow),
            pytest.param(ulx3s.default_config(16, 16), id="ulx3s-85f-16x16", marks=slow)]


@pytest.mark.parametrize("config", _board_defaults())
def test_each_board_build_runs_matmul_and_conv2d_bit_exact(config):
    """The board builds' own configurations (the micro core of the UP5K, the ULX3S cores with
    their LUT multipliers), end to end over the simulated UART."""
    rng = np.random.default_rng(config.rows)
    a = rng.integers(-128, 128, (2 * config.rows + 3, config.rows + 1), dtype=np.int8)
    b = rng.integers(-128, 128, (config.rows + 1, config.cols + 2), dtype=np.int8)
    x = rng.integers(-128, 128, (1, 2, 6, 5), dtype=np.int8)
    w = rng.integers(-128, 128, (3, 2, 3, 3), dtype=np.int8)
    with simulated_board(config) as dev:
        assert dev.config == config
        np.testing.assert_array_equal(dev.matmul(a, b), matmul_int32(a, b))
        assert dev.stats.macs > 0 and dev.stats.bytes_written == 4 * a.shape[0] * b.shape[1]
        np.testing.assert_array_equal(dev.conv2d(x, w, padding=1), conv2d_int32(x, w, 1, 1, 1))


@pytest.mark.parametrize("config", [BOARD_CORE, CoreConfig(), PRESETS["large"],
                                    CoreConfig(rows=3, cols=7, axi_data_width=128)])
def test_board_device_reads_the_config_from_the_core(config):
    values = constant_registers(config)
    assert config_from_registers(values.__getitem__) == config


@pytest.mark.parametrize("name,value,message", [
    ("ID", 0x12345678, "no tpugen core answers"),
    ("VERSION", (CSR_VERSION[0] + 1) << 16, "this runtime speaks"),
])
def test_board_device_refuses_what_is_not_a_tpugen_core(name, value, message):
    values = {**constant_registers(BOARD_CORE), name: value}
    with pytest.raises(DeviceError, match=message):
        config_from_registers(values.__getitem__)


def test_board_device_arguments_are_checked():
    with pytest.raises(ValueError, match="exactly one of port"):
        BoardDevice(board="ulx3s-85f")
    with pytest.raises(ValueError, match="unknown board"):
        BoardDevice("/dev/null", board="de10-nano")
