"""Code generation of tiled GEMM programs: `compile_gemm` for any operand layout, and
`compile_matmul` for row-major matrices."""
from collections import Counter
from functools import partial
from itertools import accumulate

import numpy as np

from ..arch import Engine
from .epilogue import output_dtype
from .gemm_cost import gemm_cycles, shortest_piece
from .gemm_plan import plan_gemm
from .gemm_tiling import a_region_limit, a_regions, row_pieces
from .program import LEAD, Dim, Op, Program, schedule, tensor

__all__ = ["B_LAYOUTS", "TRANSPOSE_GAIN", "compile_gemm", "compile_matmul", "matmul_weights",
           "transposed_is_faster"]

B_LAYOUTS = ("rows", "tiles")
"""How `compile_matmul` finds B in memory: row-major, or `matmul_weights`'s tile order."""


def compile_gemm(config, plan, m_blocks, load_a, load_b, store_c, epilogue=None,
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
    tile's STORE follows its last MATMUL and overlaps the next group. With
    ``plan.split_ends`` the first panel's MATMULs go by growing row pieces, each waiting only
    for its rows of A (and, when that panel covers all of K, each piece of the first output
    tile stored as it finishes, so the store engine starts after the first piece), and the last
    output tile's last panel by shrinking ones, each piece stored as it finishes. The tokens
    follow from what each instruction reads and overwrites (`dependency_tokens`). An
    ``epilogue`` sets its parameters once (per tensor) or before each STORE (per channel, for
    the tile's columns).
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
    last_panel = len(chunks) * sum(len(tile_starts) for *_, tile_starts in groups) - 1

    def panel_pieces(p, count):
        """Row pieces (first, end) of panel p's MATMULs: growing in the first panel, shrinking in
        the last (`GemmPlan.split_ends`), else all rows."""
        sizes = row_pieces(count, shortest_piece(config)) if plan.split_ends else [count]
        sizes = sizes[::-1] if p == last_panel and p else sizes if p in (0, last_panel) else [count]
        ends = list(accumulate(sizes))
        return list(zip([0, *ends], ends))

    def output_pieces(t, g, count):
        """Row pieces of output tile (t, g), a STORE each: the last tile's are the last panel's;
        the first tile's the first panel's when that panel covers all of K (its first piece is
        then finished, and stored, after the first piece's MATMULs); else all rows."""
        if (t, g) == (len(groups) - 1, len(groups[-1][2]) - 1):
            return panel_pieces(last_panel, count)
        return panel_pieces(0 if (t, g) == (0, 0) and len(chunks) == 1 else -1, count)

    def overlapping(pieces, first, end):
        return [i for i, (lo, hi) in enumerate(pieces) if lo < end and hi > first]

    # The MATMULs, weight panels, A buffers and output tiles, in the order they are used.
    ops, panels, units, outputs = [], [], [], {}
    for t, (m0, count, tile_starts) in enumerate(groups):
        for t0, tiles in chunks:
            if not plan.a_resident or t0 == 0 and (t == 0 or groups[t - 1][0] != m0):
                first, size = (0, k_tiles) if plan.a_resident else (t0, tiles)
                regions, offset = [], a_rows[len(units) % 2]
                limit = a_region_limit(plan, later=bool(units))
                for r0, r_tiles in a_regions(first, size, whole_tiles,
                                              min(a_region_tiles, limit)):
                    # The first panel's regions are loaded in its row pieces.
                    pieces = panel_pieces(0, count) if not units and r0 < tiles else [(0, count)]
                    regions.append({"t0": r0, "tiles": r_tiles, "row": offset, "pieces": pieces,
                                    "starts": {}})
                    offset += r_tiles * count
                units.append({"m0": m0, "count": count, "regions": regions})
            u = len(units) - 1
            for g, n0 in enumerate(tile_starts):
                p = len(panels)
                pieces = panel_pieces(p, count)
                panels.append({"first": len(ops), "t0": t0, "tiles": tiles, "n0": n0})
                acc_row = (t % 2) * half + g * count
                if t0 == 0:
                    outputs[t, g] = {"m0": m0, "count": count, "n0": n0, "acc_row": acc_row,
                                     "first": len(ops), "pieces": output_pieces(t, g, count)}
                output = outputs[t, g]
                for lo, hi in pieces:
                    panels[p]["last_piece"] = len(ops)
                    for kt in range(t0, t0 + tiles):
                        r, region = next((r, region)
                                         for r, region in enumerate(units[u]["regions"])
                                         if region["t0"] <= kt < region["t0"] + region["tiles"])
                        region.setdefault("first", len(ops))
                        a_parts = overlapping(region["pieces"], lo, hi)
                        for i in a_parts:
                            region["starts"].setdefault(i, len(ops))
                        c_parts = overlapping(output["pieces"], lo, hi)
                        for i in c_parts:
                            output.setdefault("piece_last", {})[i] = len(ops)
                        ops.append(Op(Engine.EXECUTE, len(ops), partial(
                            Program.matmul, weight_row=(p % 2) * panel_rows + (kt - t0) * rows,
                            act_row=region["row"] + kt - region["t0"] + region["tiles"] * lo,
                            acc_row=acc_row + lo, count=hi - lo, accumulate=kt > 0,
                            act_stride_log2=region["tiles"].bit_length() - 1),
                            reads=((("B", p % 2), p, 0),
                                   *((("A", u % 2), u, (r, i)) for i in a_parts)),
                            writes=tuple((("C", t % 2), t, (g, i)) for i in c_parts)))
                units[u]["last"] = output["last"] = len(ops) - 1
    total = len(ops)
    writes = Counter(part for op in ops for part in op.writes)  # an output piece's MATMULs
    for op in ops:
        op.writes = tuple((*part, writes[part]) for part in op.writes)

    # Weight panel p goes LEAD MATMULs into panel p - 1 (into its last row piece).
    for p, panel in enumerate(panels):
        before = panels[p - 1]["last_piece"] if p else 0
        ops.append(Op(Engine.LOAD, min(before + LEAD, panel["first"]), partial(
            load_b, first=panel["t0"], tiles=panel["tiles"], n0=panel["n0"],
            sram_row=(p % 2) * panel_rows), writes=((("B", p % 2), p, 0, 1),)))
    # A buffer u: region by region, in pieces of rows of about a MATMUL's worth of beats,
    # spread evenly from LEAD MATMULs after buffer u - 2's last use, each region before its
    # first use; a region of the first panel's row pieces: a LOAD each, as the piece before
    # starts.
    beat = config.axi_data_width // 8
    for u, unit in enumerate(units):
        count, regions = unit["count"], unit["regions"]
        low = min(units[u - 2]["last"] + 1 + LEAD, regions[0]["first"]) if u >= 2 else 0
        pieces = []
        for r, region in enumerate(regions):
            if len(region["pieces"]) > 1:
                pieces += [(r, (r, i), 1, lo, hi, region["starts"][i - 1] if i else low)
                           for i, (lo, hi) in enumerate(region["pieces"])]
                continue
            beats = count * -(-region["tiles"] * rows // beat)
            parts = max(1, min(count, region["first"] - low, beats // count))
            bounds = [i * count // parts for i in range(parts + 1)]
            pieces += [(r, (r, 0), parts, first, end, None)
                       for first, end in zip(bounds, bounds[1:])]
        for i, (r, part, parts, first, end, position) in enumerate(pieces):
            region = regions[r]
            if position is None:
                position = min(low + i * (regions[-1]["first"] - low) // len(pieces),
                               region["first"])
            ops.append(Op(Engine.LOAD, position, partial(
                load_a, m0=unit["m0"] + first, count=end - first, first=region["t0"],
                tiles=region["tiles"], sram_row=region["row"] + region["tiles"] * first),
                writes=((("A", u % 2), u, part, parts),)))
    # STOREs: LEAD MATMULs after the tile's (or row piece's) last, a store's time apart,
    # before the next group in this accumulator half starts.
    if epilogue is not None and epilogue.per_tensor:
        ops.append(Op(Engine.STORE, 0, lambda program, deps: program.params(epilogue.entries(0, 1),
                                                                  broadcast=True)))
    store_fields = epilogue.fields(pool_pitch) if epilogue is not None else None
    spacing = -(-cols * 4 // beat)
    position = 0
    for (t, g), o in outputs.items():
        reuse = outputs[t + 2, 0]["first"] if (t + 2, 0) in outputs else total
        for i, (lo, hi) in enumerate(o["pieces"]):
            position = min(max(o["piece_last"][i] + 1 + LEAD, position + spacing), reuse)
            if epilogue is not None and not epilogue.per_tensor and i == 0:
                ops.append(Op(Engine.STORE, position, lambda program, deps, n0=o["n0"]:
                              program.params(epilogue.entries(n0, cols))))
            ops.append(Op(Engine.STORE, position, partial(
                Program.store, descriptor=store_c(o["m0"] + lo, hi - lo, o["n0"],
                                                  o["acc_row"] + lo),
                epilogue=store_fields), reads=((("C", t % 2), t, (g, i)),)))

    return schedule(config, ops)


TRANSPOSE_GAIN = 0.9
"""`transposed_is_faster` when the transposed GEMM's estimate is at most this fraction of the
GEMM's: a margin over the cost model's error."""


def transposed_is_faster(config, m, k, n):
    """Whether C^T = B^T A^T (n x k @ k x m) is estimated (`gemm_cycles`, weights tile-packed)
    clearly faster than C = A B: a skinny M makes m-vector MATMULs, one instruction fetched per
    weight tile, where the transposed GEMM streams n vectors per tile."""
    def cycles(m, n):
        return gemm_cycles(config, plan_gemm(config, m, k, n, b_contiguous=True,
                                             split_ends=True))
    return cycles(n, m) <= TRANSPOSE_GAIN * cycles(m, n)


def matmul_weights(config, b):
    """B (K x N) in the order the weight LOADs read it (``b_layout="tiles"``): column tile by
    column tile (``config.cols`` wide, the last one what is left), each row-major, so a weight
    panel is one contiguous run of full bursts. The same bytes as B."""
    return np.concatenate([b[:, n0:n0 + config.cols].ravel()
                           for n0 in range(0, b.shape[1], config.cols)])


def compile_matmul(config, m, k, n, *, a_addr, b_addr, c_addr, epilogue=None, b_layout="rows"):
    """C (int32, m x n) = A (int8, m x k) @ B (int8, k x n), A and C row-major, B row-major or
    (``b_layout="tiles"``) as `matmul_weights` lays it out; with an `Epilogue` C is its output
    (int8 when requantized)."""
    if epilogue is not None and epilogue.pool:
        raise ValueError("pool is for conv2d only")
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout={b_layout!r} is invalid: allowed {' or '.join(B_LAYOUTS)}")
    plan = plan_gemm(config, m, k, n, b_contiguous=b_layout == "tiles", split_ends=True)
    size = output_dtype(epilogue).itemsize
    rows, cols = config.rows, config.cols

    def load_a(program, m0, count, first, tiles, sram_row, deps):
        lanes = ([Dim(extent=rows, start=first * rows, bound=k, stride=1)] if tiles == 1 else
                 [Dim(extent=rows, start=0, bound=rows, stride=1),
                  Dim(extent=tiles, start=first, bound=k // rows, stride=rows)])
        program.load(tensor(a_addr, 1, sram_row, [
            *lanes, Dim(extent=count, start=m0, bound=m, stride=k)]), deps)

    def load_b(program, first, tiles, n0, sram_row, deps):
        if b_layout == "rows":
            base, row_bytes, n0_in_row = b_addr, n, n0
        else:  # the column tile's rows are its own width apart, after the tiles before it
            base, row_bytes, n0_in_row = b_addr + k * n0, min(cols, n - n0), 0
        program.load(tensor(base + first * rows * row_bytes, 1, sram_row, [
            Dim(extent=cols, start=n0_in_row, bound=n0_in_row + min(cols, n - n0), stride=1),
            Dim(extent=tiles * rows, bound=k - first * rows, stride=row_bytes)]), deps)

    def store_c(m0, count, n0, acc_row):
        return tensor(c_addr, size, acc_row, [
            Dim(extent=cols, start=n0, bound=n, stride=size),
            Dim(extent=count, start=m0, bound=m, stride=size * n)])

    blocks = [(m0, min(plan.m_tile, m - m0)) for m0 in range(0, m, plan.m_tile)]
    return compile_gemm(config, plan, blocks, load_a, load_b, store_c, epilogue)
