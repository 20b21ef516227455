"""SimDevice: the Python API on the Verilator model, bit-exact against numpy."""
import numpy as np
import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.sim import SimDevice
from tpugen.firmware.conv2d import (POOLED_PIXELS, compile_conv2d, conv2d_lowering,
                                    conv2d_scratch_bytes, conv2d_weights)
from tpugen.firmware.device import (Device, access_windows, fit_windows, operand_layout,
                                    program_placement)
from tpugen.isa import NUM_WINDOWS
from tpugen.firmware.epilogue import Epilogue
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32

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


def _inside(window, windows, permission):
    """``window`` (base, size) lies inside one of ``windows`` that grants ``permission`` (2:
    read, 3: write): what the core checks an access against."""
    base, size = window[:2]
    return any(w[permission] and w[0] <= base and base + size <= w[0] + w[1] for w in windows)


def test_fit_windows_grants_what_was_asked_and_widens_only_by_merging():
    rng = np.random.default_rng(16)
    for _ in range(300):
        asked = [(64 * int(rng.integers(0, 1024)), 64 * int(rng.integers(1, 64)), *flags)
                 for flags in rng.permutation([(1, 0), (0, 1), (1, 1)] * 2)[
                     :rng.integers(1, NUM_WINDOWS + 1)].astype(bool).tolist()]
        writable = [w for w in asked if w[3]]
        read_only = [w for w in asked if not w[3]]
        for count in range(1, NUM_WINDOWS + 1):
            fitted = fit_windows(asked, count)
            assert len(fitted) <= count
            for window in asked:  # every grant asked for
                for permission in (2, 3):
                    assert not window[permission] or _inside(window, fitted, permission)
            if len(asked) <= count:
                assert fitted == asked
            elif count > len(writable) and read_only:  # only the read-only ones merge
                assert [w for w in fitted if w[3]] == writable
                assert [w for w in fitted if not w[3]] == [
                    (min(w[0] for w in read_only),
                     max(w[0] + w[1] for w in read_only) - min(w[0] for w in read_only),
                     True, False)]
            elif count > 1:  # writes only where the writable ones' cover is
                first = min(w[0] for w in writable)
                assert all(_inside(w, [(first, max(v[0] + v[1] for v in writable) - first,
                                        True, True)], 3) for w in fitted if w[3])
    with pytest.raises(ValueError, match="count=0"):
        fit_windows(asked, 0)


def test_two_windows_read_the_run_and_write_exactly_its_outputs():
    """A run laid out as `Device` does, on a core with two windows: one readable window from 0
    to the program's end (the outputs readable too), the outputs writable, exactly."""
    (inputs, (output,)), _ = operand_layout([700, 5000], [300])
    program = program_placement([(output, 300)])
    asked = access_windows(list(zip(inputs, [700, 5000])), [(output, 300)], program, 640)
    assert asked == [(program, 640, True, False), (0, 9152, True, False),
                     (output, 320, False, True)]
    assert access_windows(list(zip(inputs, [700, 5000])), [(output, 300)], program, 640,
                          count=2) == [(0, program + 640, True, False), (output, 320, False, True)]


def test_matmul_and_conv2d_on_awkward_shapes():
    rng = np.random.default_rng(2026)
    matmuls = [(1, 1, 1), (7, 13, 5), (67, 41, 3), (3, 4, 97), (1, 29, 1)]
    convs = [((1, 3, 7, 6), (5, 3, 3, 3), 1, 1, 1), ((2, 5, 9, 8), (3, 5, 3, 3), 2, 0, 1),
             ((1, 6, 5, 5), (7, 6, 1, 1), 1, 0, 1), ((1, 2, 9, 9), (4, 2, 5, 5), 1, 2, 1),
             ((1, 1, 6, 6), (1, 1, 3, 3), 2, 2, 2)]
    with SimDevice(SMALL, memory="axiram", backpressure=True, seed=1) as dev:
        for m, k, n in matmuls:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            c = dev.matmul(a, b)
            assert c.dtype == np.int32 and c.shape == (m, n)
            assert np.array_equal(c, matmul_int32(a, b)), (m, k, n)
            stats = dev.stats
            assert stats.macs == m * k * n and stats.issued_macs >= stats.macs
            assert stats.mac_utilization == stats.macs / (stats.cycles * SMALL.macs)
            assert 0 < stats.mac_utilization <= stats.array_occupancy <= 1
            assert dev.stats.bytes_written == 4 * m * n
        for x_shape, w_shape, stride, padding, dilation in convs:
            x, w = _int8(rng, x_shape), _int8(rng, w_shape)
            y = dev.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
            assert np.array_equal(y, conv2d_int32(x, w, stride, padding, dilation)), x_shape
            p, q = y.shape[2:]
            assert dev.stats.macs == x_shape[0] * w_shape[0] * p * q * int(np.prod(w_shape[1:]))


def test_long_reduction_of_extreme_values():
    k = 300  # 75 K tiles accumulated in place, every product at its largest
    a = np.full((2, k), -128, np.int8)
    b = np.full((k, 3), -128, np.int8)
    with SimDevice(SMALL, memory="axiram") as dev:  # the model of the tests above
        assert np.array_equal(dev.matmul(a, b), matmul_int32(a, b))


@pytest.mark.parametrize("call,message,error", [
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), bias=[1, 2]), r"shape \(3,\)", ValueError),
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), requant=(70000, 3)), "multiplier is out of range", ValueError),
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), requant=(1, 64)), "shift is out of range", ValueError),
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), requant=5), "tuple", TypeError),
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), relu=1), "bool", TypeError),
    (lambda d: d.matmul(np.zeros((2, 2), np.int8), np.zeros((2, 3), np.int8), bias=0.5), "integer", TypeError),
    (lambda d: d.conv2d(np.zeros((1, 1, 3, 3), np.int8), np.zeros((1, 1, 3, 3), np.int8), padding=0, pool=True), "at least 2x2", ValueError),
])
def test_bad_epilogue_options_are_refused_before_running(call, message, error):
    with pytest.raises(error, match=message):
        call(SimDevice(SMALL))


def test_fused_epilogue_matches_numpy():
    """bias, requant (per tensor and per channel), ReLU and 2x2 max pooling, alone and fused,
    against the numpy model of the same formula."""
    rng = np.random.default_rng(77)

    def requant(channels, per_channel):
        multiplier = rng.integers(1 << 12, 1 << 16, channels if per_channel else None)
        return multiplier, rng.integers(12, 20, channels) if per_channel else 16

    with SimDevice(SMALL, memory="axiram", backpressure=True, seed=3) as dev:
        for m, k, n, options in [
                (7, 13, 5, {"bias": rng.integers(-2**31, 2**31, 5)}),
                (9, 6, 3, {"requant": requant(3, False)}),
                (33, 21, 6, {"bias": rng.integers(-5000, 5000, 6), "requant": requant(6, True),
                             "relu": True}),
                (5, 40, 1, {"relu": True}),
        ]:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            expected = apply_epilogue(matmul_int32(a, b), channel_axis=1, **options)
            got = dev.matmul(a, b, **options)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), (m, k, n)
            assert dev.stats.bytes_written == got.nbytes
        for x_shape, w_shape, stride, padding, options in [
                ((1, 3, 9, 7), (5, 3, 3, 3), 1, 1,
                 {"bias": rng.integers(-3000, 3000, 5), "requant": requant(5, True),
                  "relu": True, "pool": True}),
                ((2, 2, 6, 6), (3, 2, 3, 3), 1, 1, {"pool": True}),
                ((1, 4, 11, 11), (6, 4, 3, 3), 2, 0, {"requant": requant(6, False), "pool": True}),
                ((1, 2, 5, 5), (7, 2, 1, 1), 1, 0, {"bias": 100, "requant": requant(7, True)}),
                ((1, 3, 8, 6), (4, 3, 3, 3), 1, 1, {"bias": -700, "requant": requant(4, False),
                                                    "relu": True}),  # per tensor: pixels lowering
                # Per channel on the pixels lowering (per-row parameters, groups of 4 filters):
                # K not a multiple of 4, padding everywhere, stride 2, 1-wide, one group.
                ((1, 3, 8, 6), (7, 3, 3, 3), 1, 1,
                 {"bias": rng.integers(-3000, 3000, 7), "requant": requant(7, True),
                  "relu": True}),
                ((1, 5, 9, 7), (6, 5, 3, 3), 2, 2, {"requant": requant(6, True)}),
                ((2, 3, 5, 1), (5, 3, 3, 1), 1, 1, {"bias": rng.integers(-2**31, 2**31, 5)}),
                ((1, 2, 6, 5), (4, 2, 1, 1), 1, 0,
                 {"bias": rng.integers(-50, 50, 4), "requant": requant(4, True), "relu": True}),
        ]:
            x, w = _int8(rng, x_shape), _int8(rng, w_shape)
            if not options.get("pool"):  # every conv without pooling fits the pixels lowering
                assert conv2d_lowering(SMALL, x_shape, w_shape, Epilogue.from_options(
                    w_shape[0], **options)) == "pixels", x_shape
            acc = conv2d_int32(x, w, stride, padding)
            expected = apply_epilogue(acc, channel_axis=1, spatial_axes=(2, 3), **options)
            got = dev.conv2d(x, w, stride=stride, padding=padding, **options)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), x_shape
        # Pooled pixels (the runtime takes im2col for these small convs on this core): odd P
        # and Q, Q not a multiple of the lanes, one channel in and out, K not a multiple of the
        # array and over two channel groups of the second pass, stride 2, dilation 2.
        check_pooled_pixels(dev, rng, [
            ((1, 3, 9, 7), (5, 3, 3, 3), 1, 1, 1), ((2, 1, 7, 11), (1, 1, 3, 3), 1, 1, 1),
            ((1, 2, 13, 10), (9, 2, 3, 3), 2, 1, 1), ((1, 2, 10, 11), (3, 2, 3, 3), 1, 2, 2),
            ((1, 3, 11, 19), (7, 3, 3, 3), 1, 0, 1)])
        # The pixels lowering with tiles that span output rows (the runtime keeps one-row tiles
        # on this core): Q < 4 (several rows a tile, batch 2), Q not a multiple of 4, stride
        # 2, dilation 2, padding on every side; per-channel, per-tensor and no epilogue.
        for x_shape, w_shape, conv, options in [
                ((2, 3, 5, 6), (6, 3, 3, 3), (2, 1, 1),
                 {"bias": rng.integers(-3000, 3000, 6), "requant": requant(6, True),
                  "relu": True}),
                ((1, 2, 9, 7), (5, 2, 3, 3), (1, 2, 2), {"bias": rng.integers(-2**31, 2**31, 5)}),
                ((1, 3, 6, 10), (4, 3, 3, 3), (1, 1, 1),
                 {"bias": -700, "requant": requant(4, False), "relu": True}),
                ((2, 2, 7, 5), (3, 2, 3, 3), (1, 0, 1), {})]:
            check_spanning_pixels(dev, rng, x_shape, w_shape, conv, options)
        # A resident call on it: the scratch region after the weights, their window read-write.
        x, w = _int8(rng, (1, 3, 9, 7)), _int8(rng, (5, 3, 3, 3))
        options = {"bias": rng.integers(-3000, 3000, 5), "requant": requant(5, True),
                   "relu": True, "pool": True}
        call = dev.prepare_conv2d(x.shape, w, padding=1, **options)
        assert [(r, w) for base, _, r, w in call.windows if base == call.weights.address] == [
            (True, True)]
        dev.launch(call, x)
        assert np.array_equal(dev.download(call.output, call.dtype, call.shape), apply_epilogue(
            conv2d_int32(x, w, 1, 1), channel_axis=1, spatial_axes=(2, 3), **options))


def check_spanning_pixels(dev, rng, x_shape, w_shape, conv, options):
    """A conv2d (``conv``: stride, padding, dilation) with epilogue ``options`` compiled for the
    pixels lowering with tiles that span output rows, bit-exact against numpy."""
    stride, padding, dilation = conv
    x, w = _int8(rng, x_shape), _int8(rng, w_shape)
    expected = apply_epilogue(conv2d_int32(x, w, stride, padding, dilation), channel_axis=1,
                              spatial_axes=(2, 3), **options)
    weights = conv2d_weights(w, "pixels")
    (x_addr, w_addr), (y_addr,) = operand_layout([x.nbytes, weights.nbytes],
                                                 [expected.nbytes])[0]
    epilogue = Epilogue.from_options(w_shape[0], **options) if options else None
    program = compile_conv2d(dev.config, x_shape, w_shape, stride=stride, padding=padding,
                             dilation=dilation, x_addr=x_addr, w_addr=w_addr, y_addr=y_addr,
                             epilogue=epilogue, lowering="pixels", span=True)
    (y,) = dev._run(program, [(x_addr, x), (w_addr, weights)], [(y_addr, expected.nbytes)])
    got = np.frombuffer(y, expected.dtype).reshape(expected.shape)
    assert np.array_equal(got, expected), (x_shape, w_shape, conv, options)


def check_pooled_pixels(dev, rng, cases):
    """Requantized 2x2-pooled convs ``cases`` [(x_shape, w_shape, stride, padding, dilation)]
    compiled for `POOLED_PIXELS` (per-channel bias, multipliers with a 0, ReLU on every other
    case), bit-exact against numpy; its int8 intermediate is written once."""
    for i, (x_shape, w_shape, stride, padding, dilation) in enumerate(cases):
        k = w_shape[0]
        multiplier = rng.integers(1 << 14, 1 << 16, k)
        multiplier[k // 2] = 0 if k > 2 else multiplier[k // 2]
        shift = 21 + int(np.prod(w_shape[1:])).bit_length() // 2  # most outputs inside int8
        options = {"bias": rng.integers(-4000, 4000, k),
                   "requant": (multiplier, rng.integers(shift, shift + 3, k)),
                   "relu": i % 2 == 1, "pool": True}
        conv = {"stride": stride, "padding": padding, "dilation": dilation}
        x, w = _int8(rng, x_shape), _int8(rng, w_shape)
        expected = apply_epilogue(conv2d_int32(x, w, stride, padding, dilation), channel_axis=1,
                                  spatial_axes=(2, 3), **options)
        weights = conv2d_weights(w, POOLED_PIXELS, dev.config)
        scratch = conv2d_scratch_bytes(dev.config, x_shape, w_shape, POOLED_PIXELS, **conv)
        (x_addr, w_addr), (y_addr, scratch_addr) = operand_layout(
            [x.nbytes, weights.nbytes], [expected.nbytes, scratch])[0]
        program = compile_conv2d(dev.config, x_shape, w_shape, **conv, x_addr=x_addr,
                                 w_addr=w_addr, y_addr=y_addr, scratch_addr=scratch_addr,
                                 epilogue=Epilogue.from_options(k, **options),
                                 lowering=POOLED_PIXELS)
        (y,) = dev._run(program, [(x_addr, x), (w_addr, weights)], [(y_addr, expected.nbytes)],
                        (scratch_addr, scratch))
        got = np.frombuffer(y, np.int8).reshape(expected.shape)
        assert np.array_equal(got, expected), x_shape
        assert len(np.unique(got)) > 5, x_shape  # not all saturated or zero
        assert dev.stats.bytes_written == got.nbytes + scratch - dev.config.rows, x_shape


def test_pooled_conv_takes_a_scratch_region_only_where_it_fits():
    # 64x56x56 pooled: x, weights, output and the 200 KB intermediate need 492 KiB of pages;
    # in 400 KiB the runtime stays on im2col (no scratch region), as before.
    w = np.zeros((64, 64, 3, 3), np.int8)
    for memory_size, scratch in [(1 << 20, 64 * 56 * 56 + 16), (400 << 10, 0)]:
        call = Device(PRESETS["large"], memory_size)._conv2d(
            (1, 64, 56, 56), w, 1, 1, 1, None, (3, 9), False, True)
        assert call[-1] == scratch, memory_size
        assert call[0].nbytes == w.nbytes + 2 * 16 * 16 * (scratch > 0), memory_size
