"""The GEMM planner: the tiling of a matmul with the fewest estimated cycles."""
from dataclasses import replace

from .gemm_cost import gemm_cycles
from .gemm_tiling import GemmPlan

__all__ = ["plan_gemm"]


def plan_gemm(config, m, k, n, *, m_tile_limit=None, b_contiguous=False, split_ends=False):
    """The tiling with the fewest `gemm_cycles` that fits the scratchpad and half the
    accumulator (the other half takes the next group, so STOREs overlap MATMULs).
    ``b_contiguous``: B's weight panels are contiguous (`GemmPlan.b_contiguous`): the tiling is
    still chosen as for row-major B (the model's fill then favours small K chunks, which measure
    slower: 8x8 64^3 with a K chunk of 2 tiles 5,949 cycles, of 4 5,455, of 8 5,288);
    ``split_ends``: split the ends (`GemmPlan.split_ends`) where the model says it helps."""
    for name, value in (("M", m), ("K", k), ("N", n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
    rows, cols = config.rows, config.cols
    k_tiles, n_tiles = -(-k // rows), -(-n // cols)
    half = config.accumulator_rows // 2
    largest = min(m, m_tile_limit or m, half, 0xFFFF)
    fewest = -(-m // max(largest, 1))
    m_tiles = {-(-m // b) for b in [*range(fewest, fewest + 4), *(fewest << i for i in range(5))]}
    # A LOAD of A takes a K chunk of tiles as a 3-D tile: a core that walks 2 dims loads a
    # tile at a time (more would be a LOAD per row of A, `program.split_tile`).
    k_chunks = ({min(1 << i, k_tiles) for i in range(k_tiles.bit_length() + 1)}
                if config.descriptor_dims > 2 else {1})
    plans = [GemmPlan(m=m, k=k, n=n, rows=rows, cols=cols, m_tile=m_tile, group=group,
                      k_chunk=k_chunk, a_resident=resident)
             for m_tile in sorted(m_tiles) if m_tile <= largest
             for group in range(1, min(n_tiles, half // m_tile) + 1)
             for k_chunk in sorted(k_chunks) for resident in (False, True)]
    plans = [plan for plan in plans if plan.scratchpad_rows <= config.scratchpad_rows]
    if not plans:
        raise ValueError("the scratchpad or accumulator is too small for one tile")
    plan = replace(min(plans, key=lambda p: (gemm_cycles(config, p), not p.a_resident,
                                             -p.m_tile, p.group, -p.k_chunk)),
                   b_contiguous=b_contiguous)
    split = replace(plan, split_ends=True)
    return split if split_ends and gemm_cycles(config, split) < gemm_cycles(config, plan) else plan
