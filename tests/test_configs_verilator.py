"""Bit-exact matmul, conv2d and attention on the Verilator model of cores other than the square
4x4 and 8x8 most tests use: non-square arrays (3x7: lanes = cols; 8x4: lanes = rows > cols),
LUT multipliers (some PEs and all), and the large preset (16x16, 128-bit AXI) in the bench's own
model, where an accumulation also wraps int32. Shapes are awkward: 1 wide, not multiples of the
array, many tiles in small buffers."""
import numpy as np
import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.bench import MEMORY_SIZE, READ_LATENCY, measure_workloads
from tpugen.sim import SimDevice
from tpugen.firmware.device import operand_layout
from tpugen.firmware.program import Deps, Dim, Program, tensor
from tpugen.sim.attention_model import attention_int8_model
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32, wrap_int32

NON_SQUARE = {
    "3x7-lut10-axi32": CoreConfig(rows=3, cols=7, scratchpad_kib=1, accumulator_kib=1,
                                  axi_data_width=32, lut_multipliers=10),
    "8x4-axi128": CoreConfig(rows=8, cols=4, scratchpad_kib=1, accumulator_kib=1,
                             axi_data_width=128),
}
LUT_SQUARE = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64,
                        lut_multipliers=16)
"""Every PE a LUT multiplier; square, so attention runs (its P V GEMM streams unsigned 8-bit
probabilities through the 9-bit activation path of the PEs)."""
LARGE = PRESETS["large"]

MATMULS = [(1, 1, 1), (1, 29, 1), (13, 1, 9), (23, 17, 11)]
CONVS = [((1, 3, 7, 6), (5, 3, 3, 3), 1, 1, 1), ((1, 1, 5, 5), (1, 1, 1, 1), 1, 0, 1),
         ((2, 2, 7, 6), (9, 2, 3, 3), 2, 2, 2)]
"""(x shape, w shape, stride, padding, dilation)."""
ATTENTIONS = [(1, 1, 1, 1, False), (2, 9, 13, 4, True), (1, 21, 40, 9, False)]
"""(heads, L, S, d, causal)."""


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _requant(rng, channels):
    return rng.integers(1 << 12, 1 << 16, channels), rng.integers(12, 20, channels)


def _check_gemms(dev, rng):
    """MATMULS and CONVS bit-exact, and each with the whole fused epilogue once."""
    for m, k, n in MATMULS:
        a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
        assert np.array_equal(dev.matmul(a, b), matmul_int32(a, b)), (m, k, n)
    for x_shape, w_shape, stride, padding, dilation in CONVS:
        x, w = _int8(rng, x_shape), _int8(rng, w_shape)
        assert np.array_equal(dev.conv2d(x, w, stride=stride, padding=padding, dilation=dilation),
                              conv2d_int32(x, w, stride, padding, dilation)), (x_shape, w_shape)
    a, b = _int8(rng, (19, 10)), _int8(rng, (10, 9))
    options = {"bias": rng.integers(-3000, 3000, 9), "requant": _requant(rng, 9), "relu": True}
    assert np.array_equal(dev.matmul(a, b, **options),
                          apply_epilogue(matmul_int32(a, b), channel_axis=1, **options))
    x, w = _int8(rng, (1, 3, 9, 7)), _int8(rng, (6, 3, 3, 3))
    options = {"bias": rng.integers(-3000, 3000, 6), "requant": _requant(rng, 6), "relu": True,
               "pool": True}
    assert np.array_equal(dev.conv2d(x, w, padding=1, **options),
                          apply_epilogue(conv2d_int32(x, w, 1, 1), channel_axis=1,
                                         spatial_axes=(2, 3), **options))


def _check_attention(dev, rng):
    for heads, seq, kv, dim, causal in ATTENTIONS:
        q = _int8(rng, (heads, seq, dim))
        k, v = _int8(rng, (heads, kv, dim)), _int8(rng, (heads, kv, dim))
        assert np.array_equal(dev.attention_int8(q, k, v, 12, causal=causal),
                              attention_int8_model(dev.config, q, k, v, 12,
                                                   causal=causal)), (heads, seq, kv, dim)


@pytest.mark.parametrize("name", NON_SQUARE)
def test_non_square_arrays_are_exact(name):
    config = NON_SQUARE[name]
    with SimDevice(config, memory="axiram", backpressure=config.axi_data_width == 128,
                   seed=31) as dev:
        _check_gemms(dev, np.random.default_rng(31))  # attention needs a square array


def test_lut_multipliers_are_exact():
    with SimDevice(LUT_SQUARE, memory="axiram", seed=32) as dev:
        rng = np.random.default_rng(32)
        _check_gemms(dev, rng)
        _check_attention(dev, rng)


WRAP_MATMULS = 8200
"""MATMULs accumulating into one accumulator row: 8200 * 16 * (-128 * -128) = 2**31 + 2**21,
past INT32_MAX (8193 would do)."""


def _wrapping_program(config, count, a_addr, w_addr, c_addr):
    """LOAD a weight tile and two activation vectors, then ``count`` MATMULs into the same two
    accumulator rows (the first overwrites, the rest accumulate), STORE them as int32."""
    rows, cols = config.rows, config.cols
    program = Program()
    program.load(tensor(w_addr, 1, 0, [Dim(cols, 0, cols, 1), Dim(rows, 0, rows, cols)]))
    program.load(tensor(a_addr, 1, rows, [Dim(rows, 0, rows, 1), Dim(2, 0, 2, rows)]),
                 Deps(push_next=True))
    for i in range(count):
        program.matmul(0, rows, 0, 2, accumulate=i > 0,
                       deps=Deps(pop_prev=i == 0, push_next=i == count - 1))
    program.store(tensor(c_addr, 4, 0, [Dim(cols, 0, cols, 4), Dim(2, 0, 2, 4 * cols)]),
                  deps=Deps(pop_prev=True))
    return program.end()


def test_large_preset_is_exact_and_accumulators_wrap():
    """On the bench's model of the large preset: awkward GEMMs (tile-packed weights, one with
    split ends, one run transposed) and attention bit-exact through the bench's own checks
    (`measure_workloads`), and 8200 accumulating MATMULs whose sums pass INT32_MAX, bit-exact
    against the int64 sums wrapped to int32."""
    rng = np.random.default_rng(33)
    workloads = [("matmul", (1, 1, 1)), ("matmul", (17, 33, 15)), ("matmul", (40, 300, 47)),
                 ("matmul", (96, 100, 40)), ("matmul", (16, 96, 70)),  # split ends; transposed
                 ("matmul", (65, 40, 47)),  # split ends, one K chunk: the first tile by pieces
                 ("conv2d", (1, 19, 9, 7, 21, 3, 3, 1, 1)),  # (N, C, H, W, K, R, S, stride, pad)
                 ("conv2d", (2, 3, 8, 8, 5, 1, 1, 2, 0)),
                 # Pooled pixels: odd P and Q, K over two groups of 16 filters, stride 2.
                 ("conv2d_pool", (1, 5, 9, 37, 19, 3, 3, 1, 1)),
                 ("conv2d_pool", (1, 16, 12, 40, 33, 3, 3, 2, 1)),
                 ("attention", (1, 1, 1, False)), ("attention", (37, 45, 24, False)),
                 ("attention", (37, 45, 24, True))]  # (L, S, d, causal)
    rows, cols = LARGE.rows, LARGE.cols
    a = np.full((2, rows), -128, np.int8)
    a[1] = _int8(rng, rows)
    w = np.full((rows, cols), -128, np.int8)
    w[:, cols // 2:] = _int8(rng, (rows, cols - cols // 2))
    (a_addr, w_addr), (c_addr,) = operand_layout([a.nbytes, w.nbytes], [4 * 2 * cols])[0]
    program = _wrapping_program(LARGE, WRAP_MATMULS, a_addr, w_addr, c_addr)
    sums = WRAP_MATMULS * (a.astype(np.int64) @ w.astype(np.int64))
    assert (sums >= 2 ** 31).any()
    expected = wrap_int32(sums)
    with SimDevice(LARGE, memory="rtl", memory_size=MEMORY_SIZE,
                   read_latency=READ_LATENCY) as dev:
        entries = measure_workloads(dev, "16x16", workloads, rng)
        assert [(e["op"], e["shape"], e["check"]) for e in entries if not e["check_passed"]] == []
        # The pooled convs wrote their int8 intermediate (N x K x 2(P//2) x 2(Q//2)) and output.
        assert [e["bytes_written"] for e in entries if e["op"] == "conv2d_pool"] == [
            19 * 8 * 36 + 19 * 4 * 18, 33 * 6 * 20 + 33 * 3 * 10]
        (c,) = dev._run(program, [(a_addr, a), (w_addr, w)], [(c_addr, 4 * 2 * cols)])
        assert dev.stats.issued_macs == WRAP_MATMULS * 2 * rows * cols
    got = np.frombuffer(c, "<i4").reshape(2, cols)
    assert np.array_equal(got, expected), (got, expected)
