"""SimDevice: the Python API on the Verilator model, bit-exact against numpy."""
import numpy as np
import pytest

from tpugen import CoreConfig
from tpugen.firmware import SimDevice
from tpugen.sim.golden import conv2d_int32, matmul_int32

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
"""1 KiB buffers: 32-row output tiles, so modest shapes already need many tiles."""


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


@pytest.mark.parametrize("call,message,error", [
    (lambda d: d.matmul(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int8)), "dtype int8", TypeError),
    (lambda d: d.matmul([[1]], np.zeros((1, 1), np.int8)), "numpy array", TypeError),
    (lambda d: d.matmul(np.zeros((2, 3), np.int8), np.zeros((2, 3), np.int8)), "inner dimensions", ValueError),
    (lambda d: d.matmul(np.zeros((2,), np.int8), np.zeros((2, 3), np.int8)), "2 dimensions", ValueError),
    (lambda d: d.matmul(np.zeros((0, 3), np.int8), np.zeros((3, 3), np.int8)), "empty", ValueError),
    (lambda d: d.conv2d(np.zeros((1, 3, 4, 4), np.int8), np.zeros((2, 2, 3, 3), np.int8)), "channels", ValueError),
    (lambda d: d.conv2d(np.zeros((1, 3, 4, 4), np.int8), np.zeros((2, 3, 3, 3), np.int8), stride=0), "stride=0", ValueError),
    (lambda d: d.conv2d(np.zeros((1, 3, 2, 2), np.int8), np.zeros((2, 3, 3, 3), np.int8)), "does not fit", ValueError),
    (lambda d: d.conv2d(np.zeros((3, 4, 4), np.int8), np.zeros((2, 3, 3, 3), np.int8)), "4 dimensions", ValueError),
])
def test_bad_arguments_are_refused_before_running(call, message, error):
    with pytest.raises(error, match=message):
        call(SimDevice(SMALL))  # never entered: the checks come first


def test_matmul_and_conv2d_on_awkward_shapes():
    rng = np.random.default_rng(2026)
    matmuls = [(1, 1, 1), (7, 13, 5), (67, 41, 3), (3, 4, 97), (1, 29, 1)]
    convs = [((1, 3, 7, 6), (5, 3, 3, 3), 1, 1, 1), ((2, 5, 9, 8), (3, 5, 3, 3), 2, 0, 1),
             ((1, 6, 5, 5), (7, 6, 1, 1), 1, 0, 1), ((1, 2, 9, 9), (4, 2, 5, 5), 1, 2, 1),
             ((1, 1, 6, 6), (1, 1, 3, 3), 2, 2, 2)]
    with SimDevice(SMALL, backpressure=True, seed=1) as dev:
        for m, k, n in matmuls:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            c = dev.matmul(a, b)
            assert c.dtype == np.int32 and c.shape == (m, n)
            assert np.array_equal(c, matmul_int32(a, b)), (m, k, n)
            assert dev.stats.macs >= m * k * n and 0 < dev.stats.mac_utilization <= 1
            assert dev.stats.bytes_written == 4 * m * n
        for x_shape, w_shape, stride, padding, dilation in convs:
            x, w = _int8(rng, x_shape), _int8(rng, w_shape)
            y = dev.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
            assert np.array_equal(y, conv2d_int32(x, w, stride, padding, dilation)), x_shape


def test_long_reduction_of_extreme_values():
    k = 300  # 75 K tiles accumulated in place, every product at its largest
    a = np.full((2, k), -128, np.int8)
    b = np.full((k, 3), -128, np.int8)
    with SimDevice(SMALL) as dev:
        assert np.array_equal(dev.matmul(a, b), matmul_int32(a, b))
