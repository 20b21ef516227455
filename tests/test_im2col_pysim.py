"""amaranth.sim tests of im2col LOADs (implicit GEMM tiles) against sim.golden.im2col."""
import numpy as np
import pytest

from tpugen import CoreConfig
from tpugen.firmware.program import Program
from tpugen.isa import ErrorCode, Opcode, encode, encode_im2col
from tpugen.sim.golden import im2col
from tpugen.sim.pysim_axi import AxiMemory

from tpugen.hdl.walker import Im2colWalker

from test_dma_pysim import ERROR_ALLOWED, ERROR_WINDOWS, MEM_SIZE, run, walked, windows

CONFIG = CoreConfig(rows=8, cols=8, scratchpad_kib=1, accumulator_kib=1)  # 8 lanes, 128 rows


def strides(shape, layout, gap=0):
    """Byte strides (n, c, h, w) of an int8 tensor of ``shape`` (N, C, H, W) stored as
    ``layout`` ("nchw" or "nhwc"), with ``gap`` spare bytes after each innermost run."""
    n, c, h, w = shape
    if layout == "nchw":
        sh = w + gap
        return {"n": c * h * sh, "c": h * sh, "h": sh, "w": 1}
    sw = c + gap
    return {"n": h * w * sw, "c": 1, "h": w * sw, "w": sw}


def im2col_fields(conv, tile, **fields):
    """The Im2colDescriptor fields of the tile ``(m0, k0, rows, lanes)`` of ``conv``;
    ``fields`` (``sram_row`` at least) set or overridden."""
    (n, c, h, w), (kh, kw), stride, dilation, padding, base, st, (p, q) = conv
    m0, k0, rows, lanes = tile
    n0, p0, q0 = np.unravel_index(m0, (1 << 16, p, q))
    c0, r0, s0 = np.unravel_index(k0, (1 << 16, kh, kw))
    desc = {"base": base, "rows": rows, "lanes": lanes, "batch": n,
            "channels": c, "height": h, "width": w, "out_height": p, "out_width": q,
            "kernel_h": kh, "kernel_w": kw, "conv_stride": stride, "dilation": dilation,
            "padding": padding, "n0": n0, "p0": p0, "q0": q0, "c0": c0, "r0": r0, "s0": s0,
            **{f"stride_{k}": v for k, v in st.items()}}
    return {k: int(v) for k, v in {**desc, **fields}.items()}


def instruction(conv, tile, **fields):
    """An encoded im2col LOAD of `im2col_fields` (not checked by `isa.encode_im2col`)."""
    return encode(Opcode.LOAD, header={"im2col": 1}, im2col=im2col_fields(conv, tile, **fields))


def conv_case(shape, kernel, stride, dilation, padding, layout, tiles, seed, width=64, gap=0,
              config=CONFIG, **axi):
    """Loads ``tiles`` of the lowered matrix of a random tensor; compares with numpy. Memory and
    windows cover the tensor's bytes only (beat aligned), so a read of padding fails."""
    rng = np.random.default_rng(seed)
    config = CoreConfig(**{**config.__dict__, "axi_data_width": width})
    beat = width // 8
    st = strides(shape, layout, gap)
    span = sum((d - 1) * st[k] for d, k in zip(shape, "nchw")) + 1
    base = beat * int(rng.integers(1, (MEM_SIZE - span) // beat - 1))
    lo, hi = base, -(-(base + span) // beat) * beat
    axi_mem = AxiMemory(MEM_SIZE, width, allowed=[(lo, hi - lo)], seed=seed, **axi)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    grids = np.meshgrid(*[np.arange(d) for d in shape], indexing="ij")
    addrs = base + sum(g * st[k] for g, k in zip(grids, "nchw"))
    x = np.frombuffer(axi_mem.mem, dtype=np.int8)[addrs]
    lowered = im2col(x, *kernel, stride, dilation, padding)
    out = ((np.array(shape[2:]) + 2 * padding - dilation * (np.array(kernel) - 1) - 1)
           // stride + 1)
    assert lowered.shape[0] == shape[0] * out[0] * out[1]
    conv = (shape, kernel, stride, dilation, padding, base, st, tuple(out))
    init = rng.integers(-128, 128, (config.scratchpad_rows, config.lanes))
    instrs, expected, sram_row = [], init.copy(), 3
    padded = np.pad(lowered, ((0, config.scratchpad_rows), (0, config.lanes)))
    for m0, k0, rows, lanes in tiles:
        instrs.append(instruction(conv, (m0, k0, rows, lanes), sram_row=sram_row))
        expected[sram_row:sram_row + rows] = 0
        expected[sram_row:sram_row + rows, :lanes] = padded[m0:m0 + rows, k0:k0 + lanes]
        sram_row += rows
    outcomes, rows = run("load", config, instrs, axi_mem, windows((lo, hi - lo, "r")), init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE] * len(tiles)
    np.testing.assert_array_equal(rows, expected)
    return lowered.shape, [o[1] for o in outcomes]


# shape (N, C, H, W), kernel (R, S), stride, dilation, padding, layout, bus width, gap
CONVS = {
    "1x1": ((2, 5, 4, 5), (1, 1), 1, 1, 0, "nchw", 64, 0),
    "1x1_s2_pad1_nhwc": ((1, 5, 5, 4), (1, 1), 2, 1, 1, "nhwc", 32, 1),
    "3x3_pad1": ((1, 3, 6, 7), (3, 3), 1, 1, 1, "nchw", 32, 2),
    "3x3_s2_pad1_nhwc": ((2, 3, 7, 6), (3, 3), 2, 1, 1, "nhwc", 64, 0),
    "3x3_s2_pad0": ((2, 3, 7, 7), (3, 3), 2, 1, 0, "nchw", 64, 0),
    "3x3_dil2_pad2_nhwc": ((1, 3, 8, 8), (3, 3), 1, 2, 2, "nhwc", 32, 0),
    "5x5_pad2": ((1, 2, 7, 7), (5, 5), 1, 1, 2, "nchw", 64, 3),
    "5x5_s2_dil2_pad2": ((1, 2, 11, 10), (5, 5), 2, 2, 2, "nchw", 32, 0),
}


@pytest.mark.parametrize("name", CONVS)
def test_im2col_tiles(name):
    shape, kernel, stride, dilation, padding, layout, width, gap = CONVS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    m, k = im2col(np.zeros(shape), *kernel, stride, dilation, padding).shape
    q = (shape[3] + 2 * padding - dilation * (kernel[1] - 1) - 1) // stride + 1
    taps = kernel[0] * kernel[1]
    # The first tile; one starting mid-row of the output (q0 != 0) and, for kernels larger than
    # 1x1, mid-kernel (r0 or s0 != 0); one running past the last pixel and kernel position.
    mid_m = int(rng.integers(1, m - 6))
    mid_m += mid_m % q == 0
    mid_k = int(rng.integers(1, k - 1))
    mid_k += taps > 1 and mid_k % taps == 0
    tiles = [(0, 0, 5, 8), (mid_m, mid_k, 6, 8), (m - 3, max(0, k - 4), 6, 7)]
    conv_case(shape, kernel, stride, dilation, padding, layout, tiles, seed=len(name),
              width=width, gap=gap)


def test_im2col_whole_matrix():
    # Every tile of a small conv, back to back: rows and lanes of all tiles cover the matrix.
    shape, kernel = (1, 2, 4, 4), (3, 3)
    m, k = im2col(np.zeros(shape), *kernel, 1, 1, 1).shape
    tiles = [(m0, k0, 8, 8) for m0 in range(0, m, 8) for k0 in range(0, k, 8)]
    conv_case(shape, kernel, 1, 1, 1, "nchw", tiles, seed=9, width=64)


def test_im2col_tiles_wrap_past_4_gib():
    # Two images, image 1 at base + stride_n past 4 GiB, which wraps to 0x1800 bytes below
    # image 0; windows and memory over the two images only. Program refuses the tiles (the
    # tensor leaves the address space) unless wrap; the core reads image 1 at the wrapped
    # addresses: tiles across the images, bit-exact against sim.golden.im2col.
    shape, kernel, padding = (2, 3, 5, 5), (3, 3), 1
    rng = np.random.default_rng(21)
    config = CoreConfig(**{**CONFIG.__dict__, "axi_data_width": 32})
    beat, size = 4, shape[1] * shape[2] * shape[3]
    base, below = 0x2011, 0x1800
    st = {**strides(shape, "nhwc"), "n": (1 << 32) - below}
    spans = [(first - first % beat, -(-(first + size) // beat) * beat - first + first % beat)
             for first in (base, base - below)]
    axi_mem = AxiMemory(MEM_SIZE, 32, allowed=spans, seed=21)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    grids = np.meshgrid(*[np.arange(d) for d in shape], indexing="ij")
    addrs = base + sum(g * st[k] for g, k in zip(grids, "nchw"))
    assert addrs[0].max() < 1 << 32 <= addrs[1].min()
    x = np.frombuffer(axi_mem.mem, dtype=np.int8)[addrs % (1 << 32)]
    lowered = im2col(x, *kernel, 1, 1, padding)
    assert lowered.shape == (50, 27)
    conv = (shape, kernel, 1, 1, padding, base, st, (5, 5))
    init = rng.integers(-128, 128, (config.scratchpad_rows, config.lanes))
    program, expected, sram_row = Program(config, wrap=True), init.copy(), 3
    padded = np.pad(lowered, ((0, config.scratchpad_rows), (0, config.lanes)))
    # image 0 into image 1 (mid-row, mid-kernel); image 1 alone, past its last pixel and
    # kernel position
    for m0, k0, rows, lanes in [(19, 4, 8, 8), (23, 17, 7, 8), (30, 9, 8, 5), (46, 22, 6, 8)]:
        desc = im2col_fields(conv, (m0, k0, rows, lanes), sram_row=sram_row)
        with pytest.raises(ValueError, match="outside the 32-bit address space"):
            Program(config).load_im2col(desc)
        program.load_im2col(desc)
        expected[sram_row:sram_row + rows] = 0
        expected[sram_row:sram_row + rows, :lanes] = padded[m0:m0 + rows, k0:k0 + lanes]
        sram_row += rows
    outcomes, rows = run("load", config, program.instructions, axi_mem,
                         windows(*[(first, span, "r") for first, span in spans]), init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE] * len(program)
    np.testing.assert_array_equal(rows, expected)


def good_instruction(**fields):
    conv = ((1, 2, 4, 4), (3, 3), 1, 1, 1, 0x10, strides((1, 2, 4, 4), "nchw"), (4, 4))
    return instruction(conv, (5, 3, 4, 8), **{"sram_row": 9, **fields})


def im2col_steps(d, wrap=2**32):
    """Every element of an im2col walk of descriptor ``d`` (a dict) as ``Im2colWalker`` gives
    it, from the definition in ``Im2colDescriptor`` (exact integers; addresses modulo
    ``wrap``)."""
    steps, (n, p, q) = [], (d["n0"], d["p0"], d["q0"])
    for i in range(d["rows"]):
        c, r, s = d["c0"], d["r0"], d["s0"]
        for j in range(d["lanes"]):
            h = p * d["conv_stride"] + r * d["dilation"] - d["padding"]
            w = q * d["conv_stride"] + s * d["dilation"] - d["padding"]
            in_bounds = (n < d["batch"] and c < d["channels"] and 0 <= h < d["height"] and
                         0 <= w < d["width"])
            addr = (d["base"] + n * d["stride_n"] + c * d["stride_c"] + h * d["stride_h"] +
                    w * d["stride_w"])
            last_in_row = j == d["lanes"] - 1
            steps.append({"in_bounds": int(in_bounds),
                          "addr": addr % wrap if wrap else addr, "lane": j, "count": 1,
                          "row": d["sram_row"] + i, "last_in_row": int(last_in_row),
                          "last": int(last_in_row and i == d["rows"] - 1)})
            s, r, c = ((s + 1, r, c) if s + 1 < d["kernel_w"] else
                       (0, r + 1, c) if r + 1 < d["kernel_h"] else (0, 0, c + 1))
        q, p, n = ((q + 1, p, n) if q + 1 < d["out_width"] else
                   (0, p + 1, n) if p + 1 < d["out_height"] else (0, 0, n + 1))
    return steps


def in_bounds_addresses(d):
    """The exact (not wrapped) addresses of the in-bounds elements of descriptor ``d``."""
    return [e["addr"] for e in im2col_steps(d, wrap=None) if e["in_bounds"]]


@pytest.mark.parametrize("seed", range(3))
def test_im2col_walker_offsets(seed):
    # Large strides, steps and padding (offsets far below 0 and past 2**32) with the base
    # placed so that the in-bounds addresses straddle 2**32: encode_im2col refuses the
    # descriptor (unless wrap), and every element's address is im2col_steps' modulo 2**32.
    rng = np.random.default_rng(200 + seed)
    cs, dil, pad = (1, 1, 255) if seed == 2 else (int(v) for v in rng.integers(1, 256, 3))
    hw_bits = 32 if seed == 2 else 20  # seed 2: padding offsets down to -2**41
    d = {"sram_row": 1, "rows": 7, "lanes": 5, "batch": 2, "channels": 3,
         "height": 65535, "width": 65535, "out_height": 2, "out_width": 3,
         "kernel_h": 2, "kernel_w": 3, "conv_stride": cs, "dilation": dil, "padding": pad,
         "n0": int(rng.integers(0, 2)), "p0": -(-pad // cs) - 1, "q0": -(-pad // cs) - 1,
         "c0": int(rng.integers(0, 3)), "r0": int(rng.integers(0, 2)),
         "s0": int(rng.integers(0, 3)), "base": 0,
         **{f"stride_{k}": int(rng.integers(1, 1 << bits))
            for k, bits in (("n", 30), ("c", 29), ("h", hw_bits), ("w", hw_bits))}}
    offsets = sorted({e["addr"] for e in im2col_steps(d, wrap=None)
                      if e["in_bounds"] and 0 < e["addr"] < 1 << 32})
    d["base"] = (1 << 32) - offsets[len(offsets) // 2]
    assert {a >= 1 << 32 for a in in_bounds_addresses(d)} == {False, True}
    with pytest.raises(ValueError, match="outside the 32-bit address space"):
        encode_im2col(d)
    assert encode_im2col(d, wrap=True) == d
    expected = im2col_steps(d)
    assert walked(Im2colWalker(lanes=5, rows=16), d, ready_seed=seed, cycles=300) == expected


def test_im2col_walker_far_offsets():
    # Offsets far past 2**42 (n0 * stride_n, c0 * stride_c): every element's address, in
    # bounds or not, is im2col_steps' modulo 2**32.
    d = {"sram_row": 0, "rows": 3, "lanes": 4, "batch": 65535, "channels": 65535,
         "height": 3, "width": 3, "out_height": 3, "out_width": 3, "kernel_h": 1,
         "kernel_w": 2, "conv_stride": 1, "dilation": 1, "padding": 1, "n0": 20000, "p0": 0,
         "q0": 1, "c0": 20000, "r0": 0, "s0": 0, "base": 0xFFFF_FFFF,
         "stride_n": 0xFFFF_FFFF, "stride_c": 0xFFFF_FFF0, "stride_h": 3, "stride_w": 1}
    assert min(in_bounds_addresses(d)) >= 1 << 42
    with pytest.raises(ValueError, match="outside the 32-bit address space"):
        Program(CONFIG).load_im2col(d)
    assert walked(Im2colWalker(lanes=4, rows=8), d) == im2col_steps(d)


IM2COL_ERRORS = {
    "zero_rows": ({"rows": 0}, ErrorCode.BAD_EXTENT),
    "zero_lanes": ({"lanes": 0}, ErrorCode.BAD_EXTENT),
    "lanes_gt_lanes": ({"lanes": 9}, ErrorCode.BAD_EXTENT),
    "zero_kernel_h": ({"kernel_h": 0}, ErrorCode.BAD_EXTENT),
    "zero_kernel_w": ({"kernel_w": 0}, ErrorCode.BAD_EXTENT),
    "zero_stride": ({"conv_stride": 0}, ErrorCode.BAD_EXTENT),
    "sram_range": ({"sram_row": 125}, ErrorCode.SRAM_RANGE),
    "sram_range_wide": ({"sram_row": 65535, "rows": 65535}, ErrorCode.SRAM_RANGE),
    # Rows of the image 0x100 apart from 0x800: the fourth, at 0xB00, is outside the window.
    "window": ({"base": 0x800, "stride_h": 0x100, "stride_c": 0x400, "rows": 16},
               ErrorCode.LOAD_WINDOW),
    # Image 0 at 0x2100, read-only, loads; image 1 at 0x2100 + stride_n, past 4 GiB, wraps to
    # 0xC00, which is write-only.
    "wrap": ({"base": 0x2100, "batch": 2, "stride_n": (1 << 32) - 0x1500, "rows": 24},
             ErrorCode.LOAD_WINDOW),
    "bus_error": ({"base": 0x6F0, "stride_h": 4, "stride_c": 16}, ErrorCode.BUS_ERROR),
}


@pytest.mark.parametrize("case", IM2COL_ERRORS)
def test_im2col_errors(case):
    fields, code = IM2COL_ERRORS[case]
    rng = np.random.default_rng(7)
    axi_mem = AxiMemory(MEM_SIZE, 64, allowed=ERROR_ALLOWED, error_ranges=[(0x700, 8)], seed=7)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    init = rng.integers(-100, 100, (CONFIG.scratchpad_rows, CONFIG.lanes))
    good = good_instruction()
    outcomes, rows = run("load", CONFIG, [good, good_instruction(**fields), good], axi_mem,
                         ERROR_WINDOWS, init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE, code]
    assert axi_mem.in_flight() == 0
    if code in (ErrorCode.BAD_EXTENT, ErrorCode.SRAM_RANGE):  # checked before touching memory
        alone = AxiMemory(MEM_SIZE, 64, allowed=ERROR_ALLOWED, seed=7)
        assert run("load", CONFIG, [good], alone, ERROR_WINDOWS, init)[0][0][0] == ErrorCode.NONE
        assert axi_mem.ar == alone.ar > 0

def test_im2col_throughput(capsys):
    """Elements per cycle of 16 x 16 tiles with an always-ready, zero-latency memory."""
    fast = {"ready": 1.0, "valid": 1.0, "latency": 0}
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1)
    report = {}
    for name, shape, layout in [("3x3 nchw", (1, 4, 8, 8), "nchw"),
                                ("3x3 nhwc", (1, 16, 6, 6), "nhwc")]:
        _, cycles = conv_case(shape, (3, 3), 1, 1, 1, layout, [(9, 16, 16, 16)], seed=1,
                              config=config, **fast)
        report[name] = 256 / cycles[0]
    with capsys.disabled():
        print("\nim2col elements/cycle:", {k: round(v, 2) for k, v in report.items()})
    assert report["3x3 nhwc"] > 0.7 and report["3x3 nchw"] > 0.3
