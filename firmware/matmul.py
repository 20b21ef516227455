"""Tiled GEMM programs on the core: matmul, and conv2d as implicit GEMM."""
from dataclasses import dataclass, replace

import numpy as np

from .epilogue import output_dtype
from .program import Deps, Dim, Program, tensor

__all__ = ["GemmPlan", "compile_conv2d", "compile_matmul", "conv2d_lowering", "conv2d_output_shape",
           "conv2d_weights", "plan_gemm"]


@dataclass(frozen=True)
class GemmPlan:
    """How C (m x n) = A (m x k) @ B (k x n) is tiled: all derived from the config and shape."""
    m: int
    k: int
    n: int
    rows: int
    cols: int
    m_tile: int
    """Activation vectors per MATMUL: rows of an A tile and of an output tile."""
    group: int
    """Output-column tiles that share one A tile: it is loaded once per k tile for all of them."""

    @property
    def k_tiles(self):
        return -(-self.k // self.rows)

    @property
    def n_tiles(self):
        return -(-self.n // self.cols)


_MAX_GROUP = 4


def plan_gemm(config, m, k, n, *, m_tile_limit=None):
    for name, value in (("M", m), ("K", k), ("N", n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
    group = min(-(-n // config.cols), _MAX_GROUP)
    # Scratchpad: two A tiles and two weight tiles; accumulator: two groups of output tiles.
    m_tile = min(m, m_tile_limit or m, (config.scratchpad_rows - 2 * config.rows) // 2, 0xFFFF)
    group = max(1, min(group, config.accumulator_rows // 2 // max(m_tile, 1)))
    m_tile = min(m_tile, config.accumulator_rows // 2 // group)
    if m_tile < 1:
        raise ValueError("the scratchpad or accumulator is too small for one tile")
    return GemmPlan(m=m, k=k, n=n, rows=config.rows, cols=config.cols, m_tile=m_tile,
                    group=group)


def _compile_gemm(config, plan, m_blocks, load_a, load_b, store_c, epilogue=None,
                  pool_pitch=0):
    """The program for C = A @ B, double buffered in the scratchpad and in the accumulator.

    ``m_blocks``: (m0, count) row blocks of at most ``plan.m_tile``. ``load_a(program, m0,
    count, k0, sram_row, deps)``, ``load_b(program, k0, n0, sram_row, deps)`` and
    ``store_c(m0, count, n0, acc_row)`` (a descriptor) say where the operands live.

    Work goes by (row block, group of up to ``plan.group`` column tiles), then by k tile: one A
    tile load serves every column tile of the group. Loads run ahead of the MATMULs by a buffer,
    and the STOREs of one group overlap the next group. Tokens: load -> execute when a MATMUL's
    operands are in, execute -> load when a weight buffer (and with it the older A buffer) may
    be refilled, execute -> store when an output tile is complete, store -> execute when an
    accumulator half may be reused. An ``epilogue`` sets its parameters once (per tensor) or
    before each STORE (per channel, for the tile's columns).
    """
    rows, cols = config.rows, config.cols
    b_rows = [0, rows]
    a_rows = [2 * rows, 2 * rows + plan.m_tile]
    half = config.accumulator_rows // 2
    n_starts = list(range(0, plan.n, cols))
    groups = [(m0, count, n_starts[g:g + plan.group])
              for m0, count in m_blocks for g in range(0, len(n_starts), plan.group)]
    total = sum(len(tiles) for _, _, tiles in groups) * plan.k_tiles
    program = Program()
    if epilogue is not None and epilogue.per_tensor:
        program.params(epilogue.entries(0, 1), broadcast=True)
    store_fields = epilogue.fields(pool_pitch) if epilogue is not None else None
    matmul = step = 0
    for t, (m0, count, tiles) in enumerate(groups):
        acc_base = (t % 2) * half
        for kt in range(plan.k_tiles):
            k0 = kt * rows
            first_k, last_k = kt == 0, kt == plan.k_tiles - 1
            for g, n0 in enumerate(tiles):
                # The weight load pops the token of the MATMUL two back; that also frees the
                # A buffer this step overwrites (its last user is at least two MATMULs back).
                load_b(program, k0, n0, b_rows[matmul % 2],
                       Deps(pop_next=matmul >= 2, push_next=g > 0))
                if g == 0:
                    load_a(program, m0, count, k0, a_rows[step % 2], Deps(push_next=True))
                program.matmul(b_rows[matmul % 2], a_rows[step % 2], acc_base + g * count,
                               count, accumulate=not first_k,
                               deps=Deps(pop_prev=True, pop_next=first_k and g == 0 and t >= 2,
                                         push_prev=matmul + 2 < total, push_next=last_k))
                matmul += 1
            step += 1
        for g, n0 in enumerate(tiles):
            if epilogue is not None and not epilogue.per_tensor:
                program.params(epilogue.entries(n0, cols))
            program.store(store_c(m0, count, n0, acc_base + g * count), store_fields,
                          Deps(pop_prev=True,
                               push_prev=g == len(tiles) - 1 and t + 2 < len(groups)))
    program.end()
    return program


def compile_matmul(config, m, k, n, *, a_addr, b_addr, c_addr, epilogue=None):
    """C (int32, m x n) = A (int8, m x k) @ B (int8, k x n), all row-major; with an
    `Epilogue` C is its output (int8 when requantized)."""
    if epilogue is not None and epilogue.pool:
        raise ValueError("pool is for conv2d only")
    plan = plan_gemm(config, m, k, n)
    size = output_dtype(epilogue).itemsize
    rows, cols = config.rows, config.cols

    def load_a(program, m0, count, k0, sram_row, deps):
        program.load(tensor(a_addr, 1, sram_row, [
            Dim(extent=rows, start=k0, bound=k, stride=1),
            Dim(extent=count, start=m0, bound=m, stride=k)]), deps)

    def load_b(program, k0, n0, sram_row, deps):
        program.load(tensor(b_addr, 1, sram_row, [
            Dim(extent=cols, start=n0, bound=n, stride=1),
            Dim(extent=rows, start=k0, bound=k, stride=n)]), deps)

    def store_c(m0, count, n0, acc_row):
        return tensor(c_addr, size, acc_row, [
            Dim(extent=cols, start=n0, bound=n, stride=size),
            Dim(extent=count, start=m0, bound=m, stride=size * n)])

    blocks = [(m0, min(plan.m_tile, m - m0)) for m0 in range(0, m, plan.m_tile)]
    return _compile_gemm(config, plan, blocks, load_a, load_b, store_c, epilogue)


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


def conv2d_lowering(config, x_shape, w_shape, epilogue=None):
    """"pixels" when the whole filter bank stays in the scratchpad and the epilogue is per
    tensor without pooling (see `_compile_conv2d_pixels`; it wants the weights as (K, S, C,
    R)), else "im2col" (weights as given, (K, C, R, S))."""
    k_out, c, r, s = w_shape
    taps = c * r * s
    chunks = -(-taps // config.rows)
    fits = (k_out <= min(config.accumulator_rows // 2, 0xFFFF)
            and 2 * chunks * config.rows + chunks * k_out <= config.scratchpad_rows)
    plain = epilogue is None or (epilogue.per_tensor and not epilogue.pool)
    return "pixels" if fits and plain else "im2col"


def conv2d_weights(w, lowering):
    """The filter bank ``w`` (K, C, R, S) in the layout ``lowering`` reads."""
    return np.ascontiguousarray(w.transpose(0, 3, 1, 2)) if lowering == "pixels" else w


def compile_conv2d(config, x_shape, w_shape, *, stride=1, padding=0, dilation=1, x_addr,
                   w_addr, y_addr, epilogue=None, lowering=None):
    """y (int32, N x K x P x Q) = conv2d(x (int8, N x C x H x W), w (int8, K x C x R x S)),
    NCHW. With an `Epilogue` y is its output (int8 when requantized, P and Q halved when
    pooled). ``lowering``: "pixels" or "im2col", by default `conv2d_lowering`'s choice; the
    weights at ``w_addr`` must be in its layout (`conv2d_weights`)."""
    for name, value in (("stride", stride), ("dilation", dilation)):
        if not 1 <= value <= 255:
            raise ValueError(f"{name}={value!r} is invalid: allowed 1..255")
    if not 0 <= padding <= 255:
        raise ValueError(f"padding={padding!r} is invalid: allowed 0..255")
    chosen = conv2d_lowering(config, x_shape, w_shape, epilogue)
    if lowering not in (None, "pixels", "im2col"):
        raise ValueError(f'lowering={lowering!r} is invalid: allowed "pixels" or "im2col"')
    if lowering == "pixels" and chosen != "pixels":
        raise ValueError("this convolution does not fit the pixels lowering")
    if (lowering or chosen) == "pixels":
        return _compile_conv2d_pixels(config, x_shape, w_shape, stride=stride, padding=padding,
                                      dilation=dilation, x_addr=x_addr, w_addr=w_addr,
                                      y_addr=y_addr, epilogue=epilogue)
    return _compile_conv2d_im2col(config, x_shape, w_shape, stride=stride, padding=padding,
                                  dilation=dilation, x_addr=x_addr, w_addr=w_addr,
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

    def load_a(program, m0, count, k0, sram_row, deps):
        image, pixel = divmod(m0, pq)
        channel, tap = divmod(k0, r * s)
        program.load_im2col({
            "base": x_addr, "sram_row": sram_row, "rows": count, "lanes": rows,
            "batch": n, "channels": c, "height": h, "width": w, "out_height": p, "out_width": q,
            "kernel_h": r, "kernel_w": s, "conv_stride": stride, "dilation": dilation,
            "padding": padding, "n0": image, "p0": pixel // q, "q0": pixel % q,
            "c0": channel, "r0": tap // s, "s0": tap % s,
            "stride_n": c * h * w, "stride_c": h * w, "stride_h": w, "stride_w": 1}, deps)

    def load_b(program, k0, n0, sram_row, deps):
        program.load(tensor(w_addr, 1, sram_row, [
            Dim(extent=cols, start=n0, bound=k_out, stride=crs),
            Dim(extent=rows, start=k0, bound=crs, stride=1)]), deps)

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
    return _compile_gemm(config, plan, blocks, load_a, load_b, store_c, epilogue,
                         pool_pitch=q)


def _valid_range(offset, step, limit, count):
    """The indices i in [0, count) with ``0 <= offset + i * step < limit``, as (first, last);
    first > last when there are none."""
    first = max(0, -(offset // step)) if offset < 0 else 0
    last = min(count - 1, (limit - 1 - offset) // step)
    return first, last


def _compile_conv2d_pixels(config, x_shape, w_shape, *, stride, padding, dilation, x_addr,
                           w_addr, y_addr, epilogue):
    """The transposed implicit GEMM, with output pixels on the lanes: y^T (K x pixels) = W'
    (K x taps) @ X (taps x pixels), taps in (s, c, r) order (W' is w as (K, S, C, R)).

    A weight tile of the array is ``rows`` taps x ``cols`` neighbouring pixels of one output row
    (q0 .. q0 + cols - 1), loaded with one 3-D descriptor per kernel column s: lanes q (stride
    ``stride``), rows r and c; padding is the descriptor's bounds. So the load engine moves
    row segments, not single elements. The filter bank stays in the scratchpad as activations
    (one MATMUL of K vectors per tap tile); pixel tiles are double-buffered in the scratchpad
    and in the accumulator, and each output tile (K filters x cols pixels) is one STORE of
    contiguous row segments of y.
    """
    n, c, h, w = x_shape
    k_out, _, r, s = w_shape
    _, _, p, q = conv2d_output_shape(x_shape, w_shape, stride, padding, dilation)
    rows, cols = config.rows, config.cols
    taps = s * c * r
    chunks = -(-taps // rows)
    x_rows = chunks * rows
    x_base = [0, x_rows]
    w_base = 2 * x_rows
    half = config.accumulator_rows // 2
    size = output_dtype(epilogue).itemsize
    store_fields = epilogue.fields() if epilogue is not None else None

    tiles = [(image, row, q0) for image in range(n) for row in range(p)
             for q0 in range(0, q, cols)]
    program = Program()
    if epilogue is not None:
        program.params(epilogue.entries(0, 1), broadcast=True)
    for b, (image, row, q0) in enumerate(tiles):
        loads = []
        if b == 0:
            loads += [tensor(w_addr, 1, w_base + kc * k_out, [
                Dim(extent=rows, start=kc * rows, bound=taps, stride=1),
                Dim(extent=k_out, start=0, bound=k_out, stride=taps)]) for kc in range(chunks)]
        r_first, r_last = _valid_range(row * stride - padding, dilation, h, r)
        for tap_s in range(s):
            q_first, q_last = _valid_range(tap_s * dilation - padding, stride, w, q)
            base = x_addr + image * c * h * w
            if r_first <= r_last and q_first <= q_last:
                base += ((row * stride + r_first * dilation - padding) * w
                         + q_first * stride + tap_s * dilation - padding)
            loads.append(tensor(base, 1, x_base[b % 2] + tap_s * c * r, [
                Dim(extent=cols, start=q0 - q_first, bound=max(0, q_last - q_first + 1),
                    stride=stride),
                Dim(extent=r, start=-r_first, bound=max(0, r_last - r_first + 1),
                    stride=dilation * w),
                Dim(extent=c, start=0, bound=c, stride=h * w)]))
        for i, descriptor in enumerate(loads):
            program.load(descriptor, Deps(pop_next=i == 0 and b >= 2,
                                          push_next=i == len(loads) - 1))
        acc_row = (b % 2) * half
        for kc in range(chunks):
            first, last = kc == 0, kc == chunks - 1
            program.matmul(x_base[b % 2] + kc * rows, w_base + kc * k_out, acc_row, k_out,
                           accumulate=not first,
                           deps=Deps(pop_prev=first, pop_next=first and b >= 2,
                                     push_prev=last and b + 2 < len(tiles), push_next=last))
        program.store(tensor(y_addr + size * ((image * k_out * p + row) * q), size, acc_row, [
            Dim(extent=cols, start=q0, bound=q, stride=size),
            Dim(extent=k_out, start=0, bound=k_out, stride=size * p * q)]), store_fields,
            Deps(pop_prev=True, push_prev=b + 2 < len(tiles)))
    program.end()
    return program
