"""LatencyAxiRam under SimDevice: exact results, and a latency that shows and is pipelined."""
import numpy as np

from tpugen import CoreConfig
from tpugen.sim import SimDevice
from tpugen.sim.golden import conv2d_int32, matmul_int32

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
LATENCY = 20


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _cycles(latency, calls):
    """Results and cycles of ``calls`` (functions of a device) on SMALL with ``latency``."""
    out = []
    with SimDevice(SMALL, memory="axiram", read_latency=latency, backpressure=True,
                   seed=4) as dev:
        for call in calls:
            out.append((call(dev), dev.stats.cycles))
    return out


def test_results_are_exact_and_the_latency_shows_pipelined():
    rng = np.random.default_rng(20)
    a, b = _int8(rng, (37, 29)), _int8(rng, (29, 11))
    x, w = _int8(rng, (1, 3, 7, 6)), _int8(rng, (5, 3, 3, 3))
    one = np.ones((1, 1), np.int8)
    # Weight rows 16 bytes apart on a 64-bit bus: 1024 single-beat bursts.
    column = _int8(rng, (1, 256)), _int8(rng, (256, 16))
    calls = [lambda d: d.matmul(a, b), lambda d: d.conv2d(x, w, padding=1),
             lambda d: d.matmul(one, one), lambda d: d.matmul(*column)]
    fast, slow = _cycles(0, calls), _cycles(LATENCY, calls)
    expected = [matmul_int32(a, b), conv2d_int32(x, w, 1, 1, 1), matmul_int32(one, one),
                matmul_int32(*column)]
    for (got, _), want in zip(fast + slow, expected * 2):
        assert np.array_equal(got, want)
    # 1x1x1: five instructions, each fetched once the one before is decoded.
    assert slow[2][1] - fast[2][1] >= 3 * LATENCY
    # Serial bursts would add 1024 * LATENCY cycles; in flight together, a fraction of that.
    assert slow[3][1] - fast[3][1] < 1024 * LATENCY // 4
