"""Fused attention and row softmax on the Verilator model: bit-exact against the model of the
hardware, and within the stated tolerance of float softmax."""
import numpy as np
import pytest

from tpugen import CoreConfig
from tpugen.sim import SimDevice
from tpugen.firmware.attention import quantize_attention, quantize_softmax
from tpugen.sim.attention_model import attention_float, attention_int8_model, softmax_int8_model

SQUARE = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
"""Tiny buffers: query tiles of a few rows, so even short sequences take many blocks."""
TOLERANCE = 2e-2
"""Relative Frobenius error against float attention (docs/DESIGN.md, Targets)."""


def _check_attention(dev, rng, heads, seq, kv, dim, causal):
    q, k, v = (rng.standard_normal((heads, n, dim)).astype(np.float32) for n in (seq, kv, kv))
    (qi, ki, vi), (sq, sk, sv), frac = quantize_attention(q, k, v)
    got = dev.attention_int8(qi, ki, vi, frac, causal=causal)
    assert np.array_equal(got, attention_int8_model(dev.config, qi, ki, vi, frac, causal=causal))
    # The score matrix never leaves the core: the only writes are the outputs.
    assert dev.stats.bytes_written == 4 * heads * seq * dim
    out = dev.attention(q, k, v, causal=causal)
    assert out.dtype == np.float32 and out.shape == q.shape
    reference = attention_float(qi * sq, ki * sk, vi * sv, causal=causal)
    error = np.linalg.norm(out - reference) / np.linalg.norm(reference)
    assert error <= TOLERANCE, (heads, seq, kv, dim, causal, error)
    return error


def test_attention_awkward_shapes_and_softmax():
    rng = np.random.default_rng(11)
    with SimDevice(SQUARE, memory="axiram", backpressure=True, seed=5) as dev:
        for heads, seq, kv, dim, causal in [(1, 1, 1, 1, False), (1, 5, 7, 6, False),
                                            (2, 9, 13, 4, True), (1, 21, 40, 9, False),
                                            (1, 19, 19, 5, True)]:
            _check_attention(dev, rng, heads, seq, kv, dim, causal)
        x = (rng.standard_normal((7, 11)) * 3).astype(np.float32)
        xi, sx, frac = quantize_softmax(x)
        y = dev.softmax(x)
        assert np.array_equal(y * 256, softmax_int8_model(xi, frac))
        weights = np.exp(xi * sx - (xi * sx).max(axis=1, keepdims=True))
        assert np.abs(y - weights / weights.sum(axis=1, keepdims=True)).max() < 1e-2
        # A peak beyond a step of 1 in log2: rows shifted to their maximum (same softmax).
        wide = x * 40
        y = dev.softmax(wide)
        weights = np.exp(wide - wide.max(axis=1, keepdims=True))
        assert np.abs(y - weights / weights.sum(axis=1, keepdims=True)).max() < 2e-2


def test_attention_head_dim_128_causal():
    with SimDevice(CoreConfig(), memory_size=1 << 20) as dev:  # test_sim_speed's model
        _check_attention(dev, np.random.default_rng(12), 1, 37, 45, 128, True)


@pytest.mark.parametrize("call,message,error", [
    (lambda d: d.attention(np.zeros((4, 8), np.int8), np.zeros((4, 8)), np.zeros((4, 8))), "float", TypeError),
    (lambda d: d.attention(np.zeros((4, 8)), np.zeros((5, 7)), np.zeros((5, 7))), "same d", ValueError),
    (lambda d: d.attention(np.zeros((4, 8)), np.zeros((5, 8)), np.zeros((6, 8))), "same d", ValueError),
    (lambda d: d.attention(np.zeros((6, 8)), np.zeros((5, 8)), np.zeros((5, 8)), causal=True), "L <= S", ValueError),
    (lambda d: d.attention(np.zeros((4, 8)), np.zeros((5, 8)), np.zeros((5, 8)), causal=1), "bool", TypeError),
    (lambda d: d.attention(np.full((4, 8), np.nan), np.zeros((5, 8)), np.zeros((5, 8))), "non-finite", ValueError),
    (lambda d: d.softmax(np.zeros(5)), "2 dimensions", ValueError),
])
def test_bad_attention_arguments_are_refused_before_running(call, message, error):
    with pytest.raises(error, match=message):
        call(SimDevice(SQUARE))


def test_attention_needs_a_square_array():
    with pytest.raises(ValueError, match="square"):
        SimDevice(CoreConfig(rows=4, cols=8)).attention(*(np.ones((3, 4), np.float32),) * 3)
