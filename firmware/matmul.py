"""Tiled GEMM programs on the core: matmul, and conv2d as implicit GEMM."""
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ..arch import MAX_OUTSTANDING, PLAN_DEPTH, Engine, min_tile_length
from ..isa import INSTRUCTION_BYTES
from .epilogue import output_dtype
from .program import LEAD, Dim, Op, Program, schedule, tensor

__all__ = ["GemmPlan", "compile_conv2d", "compile_matmul", "conv2d_lowering", "conv2d_output_shape",
           "conv2d_weights", "gemm_cycles", "plan_gemm"]


@dataclass(frozen=True)
class GemmPlan:
    """How C (m x n) = A (m x k) @ B (k x n) is tiled: all derived from the config and shape."""
    m: int
    k: int
    n: int
    rows: int
    cols: int
    m_tile: int
    """Activation vectors per MATMUL: rows of an A block and of an output tile."""
    group: int
    """Output-column tiles computed together, in one accumulator half."""
    k_chunk: int
    """K tiles per weight load (a panel of one column tile), and per A load unless A is
    resident."""
    a_resident: bool
    """A row block's A (all of K) is loaded once for all its column groups."""

    @property
    def k_tiles(self):
        return -(-self.k // self.rows)

    @property
    def n_tiles(self):
        return -(-self.n // self.cols)

    @property
    def a_tiles(self):
        """K tiles in one of the two A buffers."""
        return self.k_tiles if self.a_resident else self.k_chunk

    @property
    def scratchpad_rows(self):
        """Two weight panels and two A buffers."""
        return 2 * self.k_chunk * self.rows + 2 * self.m_tile * self.a_tiles


MEMORY_LATENCY = 24
"""Cycles from a read request to its data that the tiling's cost model assumes (DRAM behind an
interconnect)."""
_INSTRUCTION_CYCLES = 16
"""Cycles an engine spends on an instruction besides moving data (checks, address setup)."""
_BURST_TILES = PLAN_DEPTH // 4
"""K tiles of an A row the load engine reads in one burst (it plans a step per tile row)."""


def gemm_cycles(config, plan):
    """Estimated cycles of a GEMM: the busiest of the array, the load engine, the store engine and
    the instruction fetch (one instruction at a time), plus what overlaps nothing: filling the
    pipeline (the first A buffer's K chunks and weight panels against the MATMULs that can run
    meanwhile) and the last STORE. A DMA instruction waits for its last data; a burst costs at
    least its share of the latency over the bursts in flight."""
    beat = config.axi_data_width // 8
    rows, cols, k_tiles, n_tiles = plan.rows, plan.cols, plan.k_tiles, plan.n_tiles
    blocks = -(-plan.m // plan.m_tile)
    count = -(-plan.m // blocks)
    chunks = -(-k_tiles // plan.k_chunk)
    outputs = blocks * n_tiles
    panels = outputs * chunks
    matmuls = outputs * k_tiles
    a_buffers = blocks * (1 if plan.a_resident else -(-n_tiles // plan.group) * chunks)
    dma = MEMORY_LATENCY + _INSTRUCTION_CYCLES

    def row_cycles(beats):
        """One row of ``beats`` beats, read in bursts of up to 16 beats."""
        return max(beats, -(-beats // 16) * MEMORY_LATENCY / MAX_OUTSTANDING)

    def a_loads(tiles, max_tiles):
        """LOADs and cycles of ``tiles`` K tiles of an A block in regions of up to
        ``max_tiles``, each row of a region a burst, in row pieces of about a MATMUL's worth
        of beats."""
        beats = [-(-size * rows // beat)
                 for _, size in _a_regions(0, tiles, plan.k // rows, max_tiles)]
        return sum(beats), sum(beats) * dma + count * sum(map(row_cycles, beats))

    _, first_chunk = a_loads(plan.k_chunk, plan.k_chunk)
    buffer_loads, buffer = a_loads(plan.a_tiles, _a_region_limit(plan, later=True))
    panel = dma + plan.k_chunk * rows * row_cycles(-(-cols // beat))
    load = a_buffers * buffer + panels * panel
    store = dma + count * -(-cols * 4 // beat)
    instructions = matmuls + panels + a_buffers * buffer_loads + outputs
    fetch = instructions * (MEMORY_LATENCY + INSTRUCTION_BYTES // beat + 4)
    compute = matmuls * max(count, min_tile_length(config))
    group = min(plan.group, n_tiles)
    fill = max((c + 1) * first_chunk + (c * group + 1) * panel - c * group * plan.k_chunk * count
               for c in range(chunks if plan.a_resident else 1))
    return max(compute, load, outputs * store, fetch) + fill + store


def plan_gemm(config, m, k, n, *, m_tile_limit=None):
    """The tiling with the fewest `gemm_cycles` that fits the scratchpad and half the
    accumulator (the other half takes the next group, so STOREs overlap MATMULs)."""
    for name, value in (("M", m), ("K", k), ("N", n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
    rows, cols = config.rows, config.cols
    k_tiles, n_tiles = -(-k // rows), -(-n // cols)
    half = config.accumulator_rows // 2
    largest = min(m, m_tile_limit or m, half, 0xFFFF)
    fewest = -(-m // max(largest, 1))
    m_tiles = {-(-m // b) for b in [*range(fewest, fewest + 4), *(fewest << i for i in range(5))]}
    k_chunks = {min(1 << i, k_tiles) for i in range(k_tiles.bit_length() + 1)}
    plans = [GemmPlan(m=m, k=k, n=n, rows=rows, cols=cols, m_tile=m_tile, group=group,
                      k_chunk=k_chunk, a_resident=resident)
             for m_tile in sorted(m_tiles) if m_tile <= largest
             for group in range(1, min(n_tiles, half // m_tile) + 1)
             for k_chunk in sorted(k_chunks) for resident in (False, True)]
    plans = [plan for plan in plans if plan.scratchpad_rows <= config.scratchpad_rows]
    if not plans:
        raise ValueError("the scratchpad or accumulator is too small for one tile")
    return min(plans, key=lambda p: (gemm_cycles(config, p), not p.a_resident, -p.m_tile,
                                     p.group, -p.k_chunk))


def _a_region_limit(plan, later):
    """Most K tiles in one region of an A buffer: the first buffer's regions are K chunks, so
    the first MATMULs wait for one chunk only; later buffers are loaded ahead of their use, in
    regions of a burst per row."""
    return max(plan.k_chunk, _BURST_TILES) if later else plan.k_chunk


def _a_regions(first, tiles, whole_tiles, max_tiles):
    """K tiles [first, first + tiles) of A as (first tile, tiles) regions: a power of two of whole
    tiles, at most ``max_tiles``, or a partial last K tile alone."""
    regions, t = [], first
    while t < first + tiles:
        whole = min(first + tiles, whole_tiles) - t
        size = min(max_tiles, 1 << (whole.bit_length() - 1)) if whole > 0 else 1
        regions.append((t, size))
        t += size
    return regions


def _compile_gemm(config, plan, m_blocks, load_a, load_b, store_c, epilogue=None,
                  pool_pitch=0, a_region_tiles=1 << 15):
    """The program for C = A @ B, double buffered in the scratchpad and in the accumulator.

    ``m_blocks``: (m0, count) row blocks of at most ``plan.m_tile``. ``load_a(program, m0,
    count, first, tiles, sram_row, deps)`` puts K tiles ``first + j`` of A rows ``m0 + i`` at
    scratchpad row ``sram_row + j + tiles * i`` (``tiles`` is a power of two up to
    ``a_region_tiles``, or a partial last K tile), ``load_b(program, first, tiles, n0,
    sram_row, deps)`` the weight rows of those K tiles for the column tile at ``n0`` from
    ``sram_row`` on, and ``store_c(m0, count, n0, acc_row)`` is an output tile's descriptor.

    Work goes by row block, group of ``plan.group`` column tiles (one accumulator half), K chunk,
    column tile (a weight panel, loaded while the panel before is used), K tile. An A buffer (a
    K chunk of a row block, or all of its K when resident) is loaded in pieces spread over the
    MATMULs since the buffer was last used, each region of K tiles before its first use; a
    tile's STORE follows its last MATMUL and overlaps the next group. The tokens follow from
    what each instruction reads and overwrites (`dependency_tokens`). An ``epilogue`` sets its parameters
    once (per tensor) or before each STORE (per channel, for the tile's columns).
    """
    rows, cols = config.rows, config.cols
    k_tiles, whole_tiles = plan.k_tiles, plan.k // rows
    panel_rows = plan.k_chunk * rows
    a_rows = [2 * panel_rows, 2 * panel_rows + plan.m_tile * plan.a_tiles]
    half = config.accumulator_rows // 2
    n_starts = list(range(0, plan.n, cols))
    chunks = [(t0, min(plan.k_chunk, k_tiles - t0)) for t0 in range(0, k_tiles, plan.k_chunk)]
    groups = [(m0, count, n_starts[g:g + plan.group])
              for m0, count in m_blocks for g in range(0, len(n_starts), plan.group)]

    # The MATMULs, weight panels, A buffers and output tiles, in the order they are used.
    ops, panels, units, outputs = [], [], [], {}
    for t, (m0, count, tile_starts) in enumerate(groups):
        for t0, tiles in chunks:
            if not plan.a_resident or t0 == 0 and (t == 0 or groups[t - 1][0] != m0):
                first, size = (0, k_tiles) if plan.a_resident else (t0, tiles)
                regions, offset = [], a_rows[len(units) % 2]
                limit = _a_region_limit(plan, later=bool(units))
                for r0, r_tiles in _a_regions(first, size, whole_tiles,
                                              min(a_region_tiles, limit)):
                    regions.append({"t0": r0, "tiles": r_tiles, "row": offset})
                    offset += r_tiles * count
                units.append({"m0": m0, "count": count, "regions": regions})
            u = len(units) - 1
            for g, n0 in enumerate(tile_starts):
                p = len(panels)
                panels.append({"first": len(ops), "t0": t0, "tiles": tiles, "n0": n0})
                acc_row = (t % 2) * half + g * count
                if t0 == 0:
                    outputs[t, g] = {"m0": m0, "count": count, "n0": n0, "acc_row": acc_row,
                                     "first": len(ops)}
                for kt in range(t0, t0 + tiles):
                    r, region = next((r, region) for r, region in enumerate(units[u]["regions"])
                                     if region["t0"] <= kt < region["t0"] + region["tiles"])
                    region.setdefault("first", len(ops))
                    ops.append(Op(Engine.EXECUTE, len(ops), partial(
                        Program.matmul, weight_row=(p % 2) * panel_rows + (kt - t0) * rows,
                        act_row=region["row"] + kt - region["t0"], acc_row=acc_row, count=count,
                        accumulate=kt > 0, act_stride_log2=region["tiles"].bit_length() - 1),
                        reads=((("B", p % 2), p, 0), (("A", u % 2), u, r)),
                        writes=((("C", t % 2), t, g, k_tiles),)))
                units[u]["last"] = outputs[t, g]["last"] = len(ops) - 1
    total = len(ops)

    # Weight panel p goes LEAD MATMULs into panel p - 1.
    for p, panel in enumerate(panels):
        before = panels[p - 1]["first"] if p else 0
        ops.append(Op(Engine.LOAD, min(before + LEAD, panel["first"]), partial(
            load_b, first=panel["t0"], tiles=panel["tiles"], n0=panel["n0"],
            sram_row=(p % 2) * panel_rows), writes=((("B", p % 2), p, 0, 1),)))
    # A buffer u: region by region, in pieces of rows of about a MATMUL's worth of beats,
    # spread evenly from LEAD MATMULs after buffer u - 2's last use, each region before its
    # first use.
    beat = config.axi_data_width // 8
    for u, unit in enumerate(units):
        count, regions = unit["count"], unit["regions"]
        low = min(units[u - 2]["last"] + 1 + LEAD, regions[0]["first"]) if u >= 2 else 0
        pieces = []
        for r, region in enumerate(regions):
            beats = count * -(-region["tiles"] * rows // beat)
            parts = max(1, min(count, region["first"] - low, beats // count))
            bounds = [i * count // parts for i in range(parts + 1)]
            pieces += [(r, parts, first, end) for first, end in zip(bounds, bounds[1:])]
        for i, (r, parts, first, end) in enumerate(pieces):
            region = regions[r]
            position = min(low + i * (regions[-1]["first"] - low) // len(pieces), region["first"])
            ops.append(Op(Engine.LOAD, position, partial(
                load_a, m0=unit["m0"] + first, count=end - first, first=region["t0"],
                tiles=region["tiles"], sram_row=region["row"] + region["tiles"] * first),
                writes=((("A", u % 2), u, r, parts),)))
    # STOREs: LEAD MATMULs after the tile's last, a store's time apart, before the next group
    # in this accumulator half starts.
    if epilogue is not None and epilogue.per_tensor:
        ops.append(Op(Engine.STORE, 0, lambda program, deps: program.params(epilogue.entries(0, 1),
                                                                  broadcast=True)))
    store_fields = epilogue.fields(pool_pitch) if epilogue is not None else None
    spacing = -(-cols * 4 // beat)
    position = 0
    for (t, g), o in outputs.items():
        reuse = outputs[t + 2, 0]["first"] if (t + 2, 0) in outputs else total
        position = min(max(o["last"] + 1 + LEAD, position + spacing), reuse)
        if epilogue is not None and not epilogue.per_tensor:
            ops.append(Op(Engine.STORE, position, lambda program, deps, n0=o["n0"]: program.params(
                epilogue.entries(n0, cols))))
        ops.append(Op(Engine.STORE, position, partial(
            Program.store, descriptor=store_c(o["m0"], o["count"], o["n0"], o["acc_row"]),
            epilogue=store_fields), reads=((("C", t % 2), t, g),)))

    return schedule(ops)


def compile_matmul(config, m, k, n, *, a_addr, b_addr, c_addr, epilogue=None):
    """C (int32, m x n) = A (int8, m x k) @ B (int8, k x n), all row-major; with an
    `Epilogue` C is its output (int8 when requantized)."""
    if epilogue is not None and epilogue.pool:
        raise ValueError("pool is for conv2d only")
    plan = plan_gemm(config, m, k, n)
    size = output_dtype(epilogue).itemsize
    rows, cols = config.rows, config.cols

    def load_a(program, m0, count, first, tiles, sram_row, deps):
        lanes = ([Dim(extent=rows, start=first * rows, bound=k, stride=1)] if tiles == 1 else
                 [Dim(extent=rows, start=0, bound=rows, stride=1),
                  Dim(extent=tiles, start=first, bound=k // rows, stride=rows)])
        program.load(tensor(a_addr, 1, sram_row, [
            *lanes, Dim(extent=count, start=m0, bound=m, stride=k)]), deps)

    def load_b(program, first, tiles, n0, sram_row, deps):
        program.load(tensor(b_addr, 1, sram_row, [
            Dim(extent=cols, start=n0, bound=n, stride=1),
            Dim(extent=tiles * rows, start=first * rows, bound=k, stride=n)]), deps)

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
    if (lowering or chosen) == "im2col" and not config.im2col:
        raise ValueError("this convolution needs the im2col walker, and the core was generated "
                         "without it (CoreConfig.im2col=False): only a per-tensor epilogue "
                         "without pooling and a filter bank that fits the scratchpad run on it")
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
    return _compile_gemm(config, plan, blocks, load_a, load_b, store_c, epilogue,
                         pool_pitch=q, a_region_tiles=1)


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
    ops = []
    if epilogue is not None:
        ops.append(Op(Engine.STORE, 0, lambda program, deps: program.params(epilogue.entries(0, 1),
                                                                  broadcast=True)))
    # The filter bank loads a chunk before the first tile's MATMUL of that chunk.
    ops += [Op(Engine.LOAD, kc, partial(Program.load, descriptor=tensor(w_addr, 1, w_base + kc * k_out, [
        Dim(extent=rows, start=kc * rows, bound=taps, stride=1),
        Dim(extent=k_out, start=0, bound=k_out, stride=taps)])),
        writes=(("W", 0, kc, 1),)) for kc in range(chunks)]
    # Tile b's pixels load while tile b - 1 computes, spread over its MATMULs; its output
    # STOREs while tile b + 1 computes.
    spacing = max(1, (chunks - LEAD) // (s + 1))
    for b, (image, row, q0) in enumerate(tiles):
        r_first, r_last = _valid_range(row * stride - padding, dilation, h, r)
        for tap_s in range(s):
            q_first, q_last = _valid_range(tap_s * dilation - padding, stride, w, q)
            base = x_addr + image * c * h * w
            if r_first <= r_last and q_first <= q_last:
                base += ((row * stride + r_first * dilation - padding) * w
                         + q_first * stride + tap_s * dilation - padding)
            descriptor = tensor(base, 1, x_base[b % 2] + tap_s * c * r, [
                Dim(extent=cols, start=q0 - q_first, bound=max(0, q_last - q_first + 1),
                    stride=stride),
                Dim(extent=r, start=-r_first, bound=max(0, r_last - r_first + 1),
                    stride=dilation * w),
                Dim(extent=c, start=0, bound=c, stride=h * w)])
            if b == 0:  # before the first MATMUL that reads it
                position = tap_s * c * r // rows
            elif b == 1:  # after the filter bank
                position = chunks - 1
            else:  # before one MATMUL of tile b - 1 at least
                position = min((b - 1) * chunks + LEAD + tap_s * spacing, b * chunks - 1)
            ops.append(Op(Engine.LOAD, position, partial(Program.load, descriptor=descriptor),
                           writes=((("X", b % 2), b, tap_s, 1),)))
        acc_row = (b % 2) * half
        for kc in range(chunks):
            taps_read = range(kc * rows // (c * r), (min(taps, (kc + 1) * rows) - 1) // (c * r) + 1)
            ops.append(Op(Engine.EXECUTE, b * chunks + kc, partial(
                Program.matmul, weight_row=x_base[b % 2] + kc * rows,
                act_row=w_base + kc * k_out, acc_row=acc_row, count=k_out,
                accumulate=kc > 0),
                reads=(("W", 0, kc), *((("X", b % 2), b, t) for t in taps_read)),
                writes=((("C", b % 2), b, 0, chunks),)))
        ops.append(Op(Engine.STORE, min((b + 1) * chunks + LEAD, (b + 2) * chunks), partial(
            Program.store, descriptor=tensor(
                y_addr + size * ((image * k_out * p + row) * q), size, acc_row, [
                    Dim(extent=cols, start=q0, bound=q, stride=size),
                    Dim(extent=k_out, start=0, bound=k_out, stride=size * p * q)]),
            epilogue=store_fields), reads=((("C", b % 2), b, 0),)))
    return schedule(ops)
