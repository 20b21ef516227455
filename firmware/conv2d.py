"""conv2d on the core, lowered to implicit GEMMs: "im2col" (the load engine generates A) and
"pixels" (the filter bank stays in the scratchpad)."""
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ..arch import Engine, tile_cycles
from ..isa import DIMS, PARAMS_RESET
from .epilogue import output_dtype
from .gemm_cost import load_cycles
from .gemm_plan import plan_gemm
from .matmul import compile_gemm
from .program import LEAD, Dim, Op, Program, schedule, tensor

__all__ = ["POOLED_PIXELS", "compile_conv2d", "conv2d_lowering", "conv2d_macs",
           "conv2d_output_shape", "conv2d_scratch_bytes", "conv2d_weights", "pool_selection"]

POOLED_PIXELS = "pooled pixels"
"""The lowering of a requantized, pooled conv2d in two passes (`_compile_conv2d_pooled`)."""


def conv2d_macs(x_shape, w_shape, stride, padding, dilation):
    """The convolution's own multiply-accumulates, N*K*P*Q*C*R*S (before any pooling)."""
    n, k, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    return n * k * p * q * w_shape[1] * w_shape[2] * w_shape[3]


def conv2d_output_shape(x_shape, w_shape, stride, padding, dilation, pool=False):
    """(N, K, P, Q) of the convolution, halved (floor) in P and Q by 2x2 pooling."""
    n, c, h, w = x_shape
    k, c_w, r, s = w_shape
    if c_w != c:
        raise ValueError(f"weight channels {c_w} do not match input channels {c}")
    p = (h + 2 * padding - dilation * (r - 1) - 1) // stride + 1
    q = (w + 2 * padding - dilation * (s - 1) - 1) // stride + 1
    if p < 1 or q < 1:
        raise ValueError(f"the kernel {r}x{s} (dilation {dilation}) does not fit the padded "
                         f"input {h}x{w} (padding {padding})")
    if pool:
        if p < 2 or q < 2:
            raise ValueError(f"pool needs an output of at least 2x2, not {p}x{q}")
        return n, k, p // 2, q // 2
    return n, k, p, q


def _pixels_fit(config, w_shape):
    """Whether the whole filter bank stays in the scratchpad beside two pixel tiles."""
    k_out, c, r, s = w_shape
    chunks = -(-(c * r * s) // config.rows)
    return (k_out <= min(config.accumulator_rows // 2, 0xFFFF)
            and 2 * chunks * config.rows + chunks * k_out <= config.scratchpad_rows)


@dataclass(frozen=True)
class _PoolPass:
    """The geometry of `POOLED_PIXELS`' second pass: activation vectors of ``rows`` int8
    outputs of one row (``half`` pooled outputs each), ``segments`` of them a row
    (``segment_rows`` apart in the scratchpad: a power of two), ``group`` channels a step,
    loaded ``channels`` a LOAD (a 4-D tile; one, 3-D, on a core that walks fewer dims)."""
    half: int
    segments: int
    segment_rows: int
    group: int
    channels: int

    @classmethod
    def of(cls, config, k_out, pooled_q):
        half = config.rows // 2
        segments = -(-pooled_q // half)
        group = min(k_out, (config.accumulator_rows // 2 - k_out - 1) // 4)
        return cls(half=half, segments=segments, segment_rows=1 << (segments - 1).bit_length(),
                   group=group, channels=group if config.descriptor_dims == DIMS else 1)

    def scratchpad_rows(self, k_out):
        """Scratchpad rows of its two buffers of an output-row pair."""
        return 2 * 2 * self.segment_rows * k_out


def _pooled_fit(config, x_shape, w_shape, stride, padding, dilation):
    """Whether `POOLED_PIXELS` fits this core and convolution (beside `_pixels_fit`)."""
    k_out, c, r, s = w_shape
    _, _, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    if p < 2 or q < 2 or config.rows % 2 or config.rows // 2 > config.cols:
        return False
    second = _PoolPass.of(config, k_out, q // 2)
    chunks = -(-(c * r * s) // config.rows)
    return (second.group >= 1 and second.segment_rows <= 1 << 15
            and 2 * chunks * config.rows + chunks * k_out + 2 * config.rows
            + second.scratchpad_rows(k_out) <= config.scratchpad_rows)


def _pooled_cycles(config, x_shape, w_shape, stride, padding, dilation):
    """Estimated cycles of a pooled conv2d as (`POOLED_PIXELS`, im2col). `POOLED_PIXELS`: its
    MATMULs' activation vectors, and ``rows + cols`` cycles an instruction that small tiles do
    not hide (twice for a LOAD); im2col: its walker's elements, one a cycle, for every ``cols``
    filters (its measured cycles grow so). Measured on 8x8 with reads 20 cycles late
    (docs/bench/issue20.md), this picks the faster one but where the two are within 20%."""
    n, c, _, _ = x_shape
    k_out, _, r, s = w_shape
    _, _, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    chunks = -(-(c * r * s) // config.rows)
    second = _PoolPass.of(config, k_out, q // 2)
    tiles = n * (p // 2 * 2) * -(-(q // 2 * 2) // config.cols)
    pairs, groups = n * (p // 2), -(-k_out // second.group)
    vectors = tiles * chunks * k_out + pairs * second.segments * 4 * k_out
    matmuls = tiles * chunks + pairs * (1 + 2 * groups * second.segments)
    loads = tiles * s + pairs * -(-k_out // second.channels)
    pixels = vectors + (config.rows + config.cols) * (matmuls + 2 * loads)
    im2col = n * (p // 2 * 2) * q * chunks * config.rows * -(-k_out // config.cols)
    return pixels, im2col


def conv2d_lowering(config, x_shape, w_shape, epilogue=None, *, stride=1, padding=0,
                    dilation=1, scratch=False):
    """"pixels" when the whole filter bank stays in the scratchpad and the epilogue does not
    pool (see `_compile_conv2d_pixels`; it wants the weights as (K, S, C, R)). With a
    requantizing, pooling epilogue and ``scratch`` (a read-write region for an int8
    intermediate: `conv2d_scratch_bytes`), `POOLED_PIXELS` where it fits and its estimated
    cycles are fewer than im2col's (or the core has no im2col walker). Else "im2col" (weights
    as given, (K, C, R, S)): a pooled conv with int32 outputs (no requant) stays there."""
    fits = _pixels_fit(config, w_shape)
    if epilogue is None or not epilogue.pool:
        return "pixels" if fits else "im2col"
    conv = (stride, padding, dilation)
    if fits and scratch and epilogue.requant and _pooled_fit(config, x_shape, w_shape, *conv):
        pixels, im2col = _pooled_cycles(config, x_shape, w_shape, *conv)
        if pixels < im2col or not config.im2col:
            return POOLED_PIXELS
    return "im2col"


def conv2d_scratch_bytes(config, x_shape, w_shape, lowering, *, stride=1, padding=0,
                         dilation=1):
    """Bytes of the read-write region `POOLED_PIXELS` keeps its int8 intermediate in (N x K x
    2(P//2) x 2(Q//2), and a vector past its end the second pass may read); 0 for the others."""
    if lowering != POOLED_PIXELS:
        return 0
    n, k_out, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation, pool=True)
    return n * k_out * 4 * p * q + config.rows


def pool_selection(config):
    """The second pass's weight tiles (2, rows, cols) int8: tile e moves lane 2j + e of an
    activation vector to lane j (j < rows / 2)."""
    tiles = np.zeros((2, config.rows, config.cols), dtype=np.int8)
    for parity in range(2):
        for j in range(config.rows // 2):
            tiles[parity, 2 * j + parity, j] = 1
    return tiles


def conv2d_weights(w, lowering, config=None):
    """The filter bank ``w`` (K, C, R, S) in the layout ``lowering`` reads; `POOLED_PIXELS`
    appends `pool_selection` (of ``config``)."""
    if lowering == "im2col":
        return w
    bank = np.ascontiguousarray(w.transpose(0, 3, 1, 2))
    if lowering == POOLED_PIXELS:
        return np.concatenate([bank.ravel(), pool_selection(config).ravel()])
    return bank


def compile_conv2d(config, x_shape, w_shape, *, stride=1, padding=0, dilation=1, x_addr,
                   w_addr, y_addr, epilogue=None, lowering=None, scratch_addr=None, span=None):
    """y (int32, N x K x P x Q) = conv2d(x (int8, N x C x H x W), w (int8, K x C x R x S)),
    NCHW. With an `Epilogue` y is its output (int8 when requantized, P and Q halved when
    pooled). ``lowering``: "pixels", "im2col" or `POOLED_PIXELS`, by default
    `conv2d_lowering`'s choice (`POOLED_PIXELS` only with ``scratch_addr``: a read-write region
    of `conv2d_scratch_bytes`); the weights at ``w_addr`` must be in its layout
    (`conv2d_weights`). ``span``: whether the "pixels" lowering's tiles span output rows (by
    default where its estimate says that is faster)."""
    for name, value in (("stride", stride), ("dilation", dilation)):
        if not 1 <= value <= 255:
            raise ValueError(f"{name}={value!r} is invalid: allowed 1..255")
    if not 0 <= padding <= 255:
        raise ValueError(f"padding={padding!r} is invalid: allowed 0..255")
    if epilogue is not None and epilogue.pool and not config.epilogue_pool:
        raise ValueError("pool needs the epilogue's pooling, and the core was generated without "
                         "it (CoreConfig.epilogue_pool=False): Device.conv2d pools on the host")
    conv = {"stride": stride, "padding": padding, "dilation": dilation}
    chosen = conv2d_lowering(config, x_shape, w_shape, epilogue, **conv,
                             scratch=scratch_addr is not None)
    if lowering not in (None, "pixels", "im2col", POOLED_PIXELS):
        raise ValueError(f'lowering={lowering!r} is invalid: allowed "pixels", "im2col" or '
                         f'"{POOLED_PIXELS}"')
    if lowering == "pixels" and chosen != "pixels":
        raise ValueError("this convolution does not fit the pixels lowering")
    if lowering == POOLED_PIXELS and not (
            scratch_addr is not None and epilogue is not None and epilogue.pool
            and epilogue.requant and _pixels_fit(config, w_shape)
            and _pooled_fit(config, x_shape, w_shape, **conv)):
        raise ValueError(f"this convolution does not fit the {POOLED_PIXELS} lowering (a "
                         "requantized, pooled conv2d, its filter bank in the scratchpad, and a "
                         "scratch_addr)")
    lowering = lowering or chosen
    if lowering == "im2col" and not config.im2col:
        raise ValueError("this convolution needs the im2col walker, and the core was generated "
                         "without it (CoreConfig.im2col=False): only an epilogue without "
                         "pooling (or a requantized one with a scratch region) and a filter "
                         "bank that fits the scratchpad run on it")
    if span is not None and (not isinstance(span, bool) or lowering != "pixels"):
        raise ValueError(f'span={span!r} is invalid: allowed None, or True / False for the '
                         f'"pixels" lowering')
    compile_ = {"pixels": partial(_compile_conv2d_pixels, span=span),
                "im2col": _compile_conv2d_im2col,
                POOLED_PIXELS: partial(_compile_conv2d_pooled, scratch_addr=scratch_addr)}
    return compile_[lowering](config, x_shape, w_shape, **conv, x_addr=x_addr, w_addr=w_addr,
                              y_addr=y_addr, epilogue=epilogue)


def _compile_conv2d_im2col(config, x_shape, w_shape, *, stride, padding, dilation, x_addr,
                           w_addr, y_addr, epilogue):
    """Implicit GEMM with output pixels on the accumulator rows: A = im2col(x) generated by the
    load engine (one element per cycle), B = w^T. With pooling, row blocks hold whole pairs of
    output rows, and an odd last row or column is not computed."""
    n, c, h, w = x_shape
    _, k_out, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    _, _, r, s = w_shape
    crs, pq = c * r * s, p * q
    pool = epilogue is not None and epilogue.pool
    size = output_dtype(epilogue).itemsize
    # Row blocks stay inside one image so each output tile is one strided store.
    plan = plan_gemm(config, n * pq, crs, k_out, m_tile_limit=pq)
    if pool:
        pair = 2 * q
        if plan.m_tile < pair:
            plan = plan_gemm(config, n * pq, crs, k_out, m_tile_limit=pair)
        if plan.m_tile < pair:
            raise ValueError(f"pool needs two output rows ({pair} pixels) in one tile: at most "
                             f"{plan.m_tile} fit this core's buffers")
        plan = replace(plan, m_tile=plan.m_tile // pair * pair)
    rows, cols = config.rows, config.cols

    def load_a(program, m0, count, first, tiles, sram_row, deps):
        image, pixel = divmod(m0, pq)
        channel, tap = divmod(first * rows, r * s)
        program.load_im2col({
            "base": x_addr, "sram_row": sram_row, "rows": count, "lanes": rows,
            "batch": n, "channels": c, "height": h, "width": w, "out_height": p, "out_width": q,
            "kernel_h": r, "kernel_w": s, "conv_stride": stride, "dilation": dilation,
            "padding": padding, "n0": image, "p0": pixel // q, "q0": pixel % q,
            "c0": channel, "r0": tap // s, "s0": tap % s,
            "stride_n": c * h * w, "stride_c": h * w, "stride_h": w, "stride_w": 1}, deps)

    def load_b(program, first, tiles, n0, sram_row, deps):
        program.load(tensor(w_addr, 1, sram_row, [
            Dim(extent=cols, start=n0, bound=k_out, stride=crs),
            Dim(extent=tiles * rows, start=first * rows, bound=crs, stride=1)]), deps)

    def store_c(m0, count, n0, acc_row):
        image, pixel = divmod(m0, pq)
        if pool:
            p2, q2 = p // 2, q // 2
            return tensor(y_addr + size * image * k_out * p2 * q2, size, acc_row, [
                Dim(extent=cols, start=n0, bound=k_out, stride=size * p2 * q2),
                Dim(extent=q2, start=0, bound=q2, stride=size),
                Dim(extent=count // (2 * q), start=pixel // (2 * q), bound=p2,
                    stride=size * q2)])
        return tensor(y_addr + size * image * k_out * pq, size, acc_row, [
            Dim(extent=cols, start=n0, bound=k_out, stride=size * pq),
            Dim(extent=count, start=pixel, bound=pq, stride=size)])

    # Pooling computes only the output rows that pooling windows cover.
    computed = (p // 2 * 2) * q if pool else pq
    blocks = [(image * pq + p0, min(plan.m_tile, computed - p0))
              for image in range(n) for p0 in range(0, computed, plan.m_tile)]
    return compile_gemm(config, plan, blocks, load_a, load_b, store_c, epilogue,
                         pool_pitch=q, a_region_tiles=1)


def _valid_range(offset, step, limit, count):
    """The indices i in [0, count) with ``0 <= offset + i * step < limit``, as (first, last);
    first > last when there are none."""
    first = max(0, -(offset // step)) if offset < 0 else 0
    last = min(count - 1, (limit - 1 - offset) // step)
    return first, last


def _compile_conv2d_pixels(config, x_shape, w_shape, *, stride, padding, dilation, x_addr,
                           w_addr, y_addr, epilogue, span):
    """The pixels lowering (`_pixels_ops`), its tiles spanning output rows if ``span`` (None:
    where `_pixels_cycles` estimates that faster)."""
    _, _, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    conv = {"stride": stride, "padding": padding, "dilation": dilation}
    if span is None:
        span = (_pixels_cycles(config, x_shape, w_shape, **conv, span=True)
                < _pixels_cycles(config, x_shape, w_shape, **conv, span=False))
    return schedule(config, _pixels_ops(
        config, x_shape, w_shape, **conv, x_addr=x_addr, w_addr=w_addr, y_addr=y_addr,
        epilogue=epilogue, computed=(p, q),
        per_row=epilogue is not None and not epilogue.per_tensor, span=span))


def _pixels_cycles(config, x_shape, w_shape, *, stride, padding, dilation, span):
    """Estimated cycles of the pixels lowering with tiles that ``span`` output rows or not: the
    busier of the array (a MATMUL of K vectors per tap tile) and the load engine (a LOAD of
    C * R rows per segment and kernel column), over all tiles. Spanning fills every lane but
    loads the tiles of two rows twice as often: it pays where the array is the bound."""
    n, c, _, _ = x_shape
    k_out, _, r, s = w_shape
    _, _, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    beat = config.axi_data_width // 8
    tiles = _pixel_tiles(n, p, q, config.cols, span)
    compute = len(tiles) * -(-(c * r * s) // config.rows) * tile_cycles(config, k_out)
    load = 0
    for _, segments in tiles:
        for _, _, count, _ in segments:
            beats = -(-((count - 1) * stride + 1) // beat) + 1  # mostly unaligned
            load += s * load_cycles(c * r, beats, count if stride > 1 else beats)
    return max(compute, load)


def _pixel_tiles(n, p, q, cols, span):
    """The pixels lowering's tiles as (image, segments), a segment (row, q0, count, lane):
    ``count`` output pixels of one row from column ``q0`` on, on lanes ``lane`` on. With
    ``span`` a tile is ``cols`` consecutive pixels of an image in raster order (a segment per
    output row it touches), else the pixels of one row from a multiple of ``cols`` on."""
    if not span:
        return [(image, [(row, q0, min(cols, q - q0), 0)])
                for image in range(n) for row in range(p) for q0 in range(0, q, cols)]
    tiles = []
    for image in range(n):
        for first in range(0, p * q, cols):
            end = min(first + cols, p * q)
            segments, pixel = [], first
            while pixel < end:
                row, q0 = divmod(pixel, q)
                count = min(q - q0, end - pixel)
                segments.append((row, q0, count, pixel - first))
                pixel += count
            tiles.append((image, segments))
    return tiles


def _pixels_ops(config, x_shape, w_shape, *, stride, padding, dilation, x_addr, w_addr, y_addr,
                epilogue, computed, per_row, span, store_writes=lambda image, row: ()):
    """The transposed implicit GEMM, with output pixels on the lanes: y^T (K x pixels) = W'
    (K x taps) @ X (taps x pixels), taps in (s, c, r) order (W' is w as (K, S, C, R)).

    A weight tile of the array is ``rows`` taps x ``cols`` pixels (`_pixel_tiles`: with
    ``span``, consecutive in raster order, so every lane is used when Q is not a multiple of
    ``cols``; else of one output row), each of its segments (an output row's part) loaded at
    its first lane (`TensorDescriptor.lane`) with one 3-D descriptor per kernel column s: lanes
    q (stride ``stride``), rows r and c; padding is the descriptor's bounds. So the load engine
    moves row segments, not single elements. The filter bank stays in the scratchpad as
    activations (one MATMUL of K vectors per tap tile); pixel tiles are double-buffered in the
    scratchpad and in the accumulator, and each output segment (K filters x its pixels) is one
    STORE of contiguous row segments of y. A per-channel epilogue (channels are accumulator
    rows here) stores it in groups of ``cols`` filters (`Epilogue.per_row`, as many rows as
    the parameter table has entries), each group's segments after a PARAMS of its entries.

    Its `Op`s, for the first ``computed`` (P, Q) output rows and columns, y being (N, K, P, Q)
    at ``y_addr``; ``per_row``: per-row parameters (else one broadcast PARAMS first);
    ``store_writes(image, row)``: what each STORE of an output row writes beside memory.
    """
    n, c, h, w = x_shape
    k_out, _, r, s = w_shape
    p, q = computed
    rows, cols = config.rows, config.cols
    taps = s * c * r
    chunks = -(-taps // rows)
    x_rows = chunks * rows
    x_base = [0, x_rows]
    w_base = 2 * x_rows
    half = config.accumulator_rows // 2
    size = output_dtype(epilogue).itemsize
    store_fields = epilogue.fields(per_row=per_row) if epilogue is not None else None
    # Filters stored together (k0, count): all, or groups of a parameter table each.
    groups = ([(k0, min(cols, k_out - k0)) for k0 in range(0, k_out, cols)] if per_row
              else [(0, k_out)])
    tiles = _pixel_tiles(n, p, q, cols, span)
    ops = []
    if epilogue is not None and not per_row:
        ops.append(Op(Engine.STORE, 0, lambda program, deps: program.params(epilogue.entries(0, 1),
                                                                  broadcast=True)))
    # The filter bank loads a chunk before the first tile's MATMUL of that chunk.
    ops += [Op(Engine.LOAD, kc, partial(Program.load, descriptor=tensor(w_addr, 1, w_base + kc * k_out, [
        Dim(extent=rows, start=kc * rows, bound=taps, stride=1),
        Dim(extent=k_out, start=0, bound=k_out, stride=taps)])),
        writes=(("W", 0, kc, 1),)) for kc in range(chunks)]
    # Tile b's pixels load while tile b - 1 computes, spread over its MATMULs; its output
    # STOREs (and PARAMS) while tile b + 1 computes: a run of them would fill the store queue
    # and hold the fetch of those MATMULs.
    for b, (image, segments) in enumerate(tiles):
        spacing = max(1, (chunks - LEAD) // (s * len(segments) + 1))
        store_gap = max(1, (chunks - LEAD) // (len(groups) * len(segments)))
        for tap_s in range(s):
            q_first, q_last = _valid_range(tap_s * dilation - padding, stride, w, q)
            for j, (row, q0, count, lane) in enumerate(segments):
                r_first, r_last = _valid_range(row * stride - padding, dilation, h, r)
                base = x_addr + image * c * h * w
                if r_first <= r_last and q_first <= q_last:
                    base += ((row * stride + r_first * dilation - padding) * w
                             + q_first * stride + tap_s * dilation - padding)
                descriptor = tensor(base, 1, x_base[b % 2] + tap_s * c * r, [
                    Dim(extent=count, start=q0 - q_first, bound=max(0, q_last - q_first + 1),
                        stride=stride),
                    Dim(extent=r, start=-r_first, bound=max(0, r_last - r_first + 1),
                        stride=dilation * w),
                    Dim(extent=c, start=0, bound=c, stride=h * w)], lane=lane)
                if b == 0:  # before the first MATMUL that reads it
                    position = tap_s * c * r // rows
                elif b == 1:  # after the filter bank
                    position = chunks - 1
                else:  # before one MATMUL of tile b - 1 at least
                    position = min((b - 1) * chunks + LEAD
                                   + (tap_s * len(segments) + j) * spacing, b * chunks - 1)
                ops.append(Op(Engine.LOAD, position, partial(Program.load, descriptor=descriptor),
                               writes=((("X", b % 2), b, tap_s, len(segments)),)))
        acc_row = (b % 2) * half
        for kc in range(chunks):
            taps_read = range(kc * rows // (c * r), (min(taps, (kc + 1) * rows) - 1) // (c * r) + 1)
            ops.append(Op(Engine.EXECUTE, b * chunks + kc, partial(
                Program.matmul, weight_row=x_base[b % 2] + kc * rows,
                act_row=w_base + kc * k_out, acc_row=acc_row, count=k_out,
                accumulate=kc > 0),
                reads=(("W", 0, kc), *((("X", b % 2), b, t) for t in taps_read)),
                writes=((("C", b % 2), b, 0, chunks),)))
        for g, (k0, count) in enumerate(groups):
            for j, (row, q0, pixels, lane) in enumerate(segments):
                position = min((b + 1) * chunks + LEAD + (g * len(segments) + j) * store_gap,
                               (b + 2) * chunks)
                if per_row and j == 0:
                    ops.append(Op(Engine.STORE, position, lambda program, deps, k0=k0,
                                  count=count: program.params(epilogue.entries(k0, count))))
                ops.append(Op(Engine.STORE, position, partial(
                    Program.store, descriptor=tensor(
                        y_addr + size * (((image * k_out + k0) * p + row) * q), size,
                        acc_row + k0, [
                            Dim(extent=pixels, start=q0, bound=q, stride=size),
                            Dim(extent=count, start=0, bound=count, stride=size * p * q)],
                        lane=lane),
                    epilogue=store_fields), reads=((("C", b % 2), b, 0),),
                    writes=store_writes(image, row)))
    return ops


def _compile_conv2d_pooled(config, x_shape, w_shape, *, stride, padding, dilation, x_addr,
                           w_addr, y_addr, epilogue, scratch_addr):
    """`POOLED_PIXELS`: a requantized conv2d with 2x2 pooling in two passes of one program.

    Pass 1 is the pixels lowering (`_pixels_ops`) of the 2(P//2) x 2(Q//2) outputs that pooling
    windows cover, with the epilogue but no pooling (per-row parameters), into an int8 z (N, K,
    2(P//2), 2(Q//2)) at ``scratch_addr``. Pass 2 pools z on the core, one output-row pair
    (image, y2) at a time, once pass 1 has stored it: a LOAD puts its row segments of ``rows``
    outputs into the scratchpad (segment-major, so that one segment column of every channel
    and both rows is a MATMUL's strided activation vectors); per ``group`` channels and
    segment, two MATMULs with the `pool_selection` tiles put the even and the odd outputs of
    each vector in lanes 0 .. rows/2 - 1 of two accumulator blocks ``2 * group`` rows apart
    (rows 2k and 2k + 1: channel k's two output rows), and a pooled STORE through the
    identity epilogue (requant with multiplier 1, shift 0: the values are int8 already) takes
    the maximum of the four. Pooling the requantized outputs is what `apply_epilogue` does.
    The two passes interleave: a pair's LOAD waits (through a one-vector MATMUL, as tokens go
    between neighbouring engines) for its last STORE in pass 1, a tile later; its MATMULs run
    among the next tile's."""
    n, c, _, _ = x_shape
    k_out, _, r, s = w_shape
    _, _, pooled_p, pooled_q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation,
                                                   pool=True)
    rows = config.rows
    p, q = 2 * pooled_p, 2 * pooled_q  # z's rows and columns
    chunks = -(-(c * r * s) // rows)
    second = _PoolPass.of(config, k_out, pooled_q)
    row_tiles = -(-q // config.cols)
    stores = 2 * row_tiles * -(-k_out // config.cols)  # pass 1's STOREs of an output-row pair
    ops = _pixels_ops(config, x_shape, w_shape, stride=stride, padding=padding,
                      dilation=dilation, x_addr=x_addr, w_addr=w_addr, y_addr=scratch_addr,
                      epilogue=replace(epilogue, pool=False), computed=(p, q), per_row=True,
                      span=False,
                      store_writes=lambda image, row: ((("z", image, row // 2), 0, 0, stores),))
    tile_count = n * p * row_tiles
    # Scratchpad: pass 1's pixel tiles and filter bank, then the selection tiles and the z
    # buffers; accumulator: pass 1's two halves of k_out rows, then the fence's row and two
    # blocks of 4 * group rows.
    selection_row = 2 * chunks * rows + chunks * k_out
    z_rows = 2 * second.segment_rows * k_out
    z_base = [selection_row + 2 * rows, selection_row + 2 * rows + z_rows]
    half = config.accumulator_rows // 2
    fence_row = k_out
    block_base = [k_out + 1, half + k_out + 1]
    stride_log2 = second.segment_rows.bit_length() - 1
    identity = [(PARAMS_RESET["bias"], PARAMS_RESET["multiplier"], PARAMS_RESET["shift"])]
    pool_fields = {"bias": 0, "requant": 1, "relu": 0, "pool": 1, "per_row": 0}

    ops.append(Op(Engine.LOAD, 0, partial(Program.load, descriptor=tensor(
        w_addr + k_out * c * r * s, 1, selection_row, [
            Dim(extent=config.cols, start=0, bound=config.cols, stride=1),
            Dim(extent=2 * rows, start=0, bound=2 * rows, stride=config.cols)])),
        writes=(("S", 0, 0, 1),)))
    pairs = [(image, y2) for image in range(n) for y2 in range(pooled_p)]
    steps = [(k0, min(second.group, k_out - k0), segment)
             for k0 in range(0, k_out, second.group) for segment in range(second.segments)]
    spacing = max(1, (chunks - LEAD) // len(steps))
    cursor = (tile_count + 1) * chunks + 1  # after pass 1's last STORE
    block = 0
    for t, (image, y2) in enumerate(pairs):
        last_tile = 2 * (t + 1) * row_tiles - 1
        fence = (last_tile + 3) * chunks - 0.5  # a tile after the pair's last STORE
        sequential = fence + 2 * chunks >= tile_count * chunks  # after pass 1, in sequence
        if sequential:
            fence = cursor
        gap = 1 if sequential else spacing
        first_at = fence + (1 if sequential else chunks + LEAD)
        matmul_at = [first_at + i * gap for i in range(len(steps))]
        # A step's STORE comes before the MATMULs two steps on (the same accumulator block).
        store_lead = min(LEAD, 2 * gap - 1) + 0.75
        cursor = max(cursor, matmul_at[-1] + store_lead + 1)
        ops.append(Op(Engine.EXECUTE, fence, partial(
            Program.matmul, weight_row=selection_row, act_row=selection_row, acc_row=fence_row,
            count=1), reads=(("S", 0, 0), (("z", image, y2), 0, 0)),
            writes=((("z ready", t), 0, 0, 1),)))
        z_row = z_base[t % 2]
        for k0 in range(0, k_out, second.group):
            count = min(second.group, k_out - k0)
            channels = min(second.channels, count)
            for k in range(k0, k0 + count, channels):
                ops.append(Op(Engine.LOAD, fence + 0.25, partial(Program.load, descriptor=tensor(
                    scratch_addr + ((image * k_out + k) * p + 2 * y2) * q, 1,
                    z_row + 2 * second.segment_rows * k, [
                        Dim(extent=rows, start=0, bound=rows, stride=1),
                        Dim(extent=second.segment_rows, start=0, bound=second.segments,
                            stride=rows),
                        Dim(extent=2, start=0, bound=2, stride=q),
                        Dim(extent=channels, start=0, bound=channels, stride=p * q)])),
                    reads=((("z ready", t), 0, 0),),
                    writes=((("Z", t % 2), t, k0, count // channels),)))
        for (k0, count, segment), position in zip(steps, matmul_at):
            acc_row = block_base[block % 2]
            act_row = z_row + 2 * second.segment_rows * k0 + segment
            for parity in range(2):
                ops.append(Op(Engine.EXECUTE, position, partial(
                    Program.matmul, weight_row=selection_row + parity * rows, act_row=act_row,
                    acc_row=acc_row + parity * 2 * count, count=2 * count,
                    act_stride_log2=stride_log2),
                    reads=(("S", 0, 0), (("Z", t % 2), t, k0)),
                    writes=((("P", block % 2), block, 0, 2),)))
            first = segment * second.half
            descriptor = tensor(
                y_addr + ((image * k_out + k0) * pooled_p + y2) * pooled_q + first, 1, acc_row, [
                    Dim(extent=second.half, start=0, bound=pooled_q - first, stride=1),
                    Dim(extent=count, start=0, bound=count, stride=pooled_p * pooled_q)])

            def store(program, deps, descriptor=descriptor, pitch=2 * count):
                program.params(identity, broadcast=True)
                program.store(descriptor, {**pool_fields, "pool_pitch": pitch}, deps=deps)
            ops.append(Op(Engine.STORE, position + store_lead, store,
                          reads=((("P", block % 2), block, 0),)))
            block += 1
    return schedule(config, ops)
