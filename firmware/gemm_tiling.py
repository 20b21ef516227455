"""How a GEMM is tiled: `GemmPlan` and the regions of its A buffers, which the cost model
(`gemm_cost`), the planner (`gemm_plan`) and the code generator (`matmul`) share."""
from dataclasses import dataclass

from ..arch import PLAN_DEPTH

__all__ = ["BURST_TILES", "GemmPlan", "a_region_limit", "a_regions", "row_pieces"]


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
    b_contiguous: bool = False
    """A weight panel is one contiguous run in memory (`matmul_weights`), not a row per K."""
    split_ends: bool = False
    """The first weight panel's MATMULs and the last output tile's last go by row pieces
    (`row_pieces`): the first MATMULs wait for the first rows of A only, and only the last
    piece's STORE is left after the last MATMUL."""

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


BURST_TILES = PLAN_DEPTH // 4
"""K tiles of an A row the load engine reads in one burst (it plans a step per tile row)."""


def a_region_limit(plan, later):
    """Most K tiles in one region of an A buffer: the first buffer's regions are K chunks, so
    the first MATMULs wait for one chunk only; later buffers are loaded ahead of their use, in
    regions of a burst per row."""
    return max(plan.k_chunk, BURST_TILES) if later else plan.k_chunk


def a_regions(first, tiles, whole_tiles, max_tiles):
    """K tiles [first, first + tiles) of A as (first tile, tiles) regions: a power of two of whole
    tiles, at most ``max_tiles``, or a partial last K tile alone."""
    regions, t = [], first
    while t < first + tiles:
        whole = min(first + tiles, whole_tiles) - t
        size = min(max_tiles, 1 << (whole.bit_length() - 1)) if whole > 0 else 1
        regions.append((t, size))
        t += size
    return regions


def row_pieces(count, smallest):
    """Sizes of the row pieces of a split panel (`GemmPlan.split_ends`), growing: each as many
    rows as the pieces before it, at least ``smallest`` (a MATMUL that short keeps the array
    busy); the last takes the rest, at least as many. All rows when there is no room for two."""
    sizes, left = [], count
    while left >= 2 * max(smallest, count - left):
        sizes.append(max(smallest, count - left))
        left -= sizes[-1]
    return [*sizes, left]
