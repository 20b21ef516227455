"""The systolic array on Verilator under cocotb: bit-exact results and ideal cycle counts."""
import pytest

from tpugen import CoreConfig
from tpugen.hdl.array import array_latency, min_tile_length

SHAPES = [(1, 1), (1, 8), (8, 1), (3, 5), (8, 8), (16, 16)]


# Without `weight_prefetch` (two weight registers a PE) a tile shifts in once the one before it
# has switched every PE: `min_tile_length` is longer, and tight (one vector fewer, a bubble).
# With `broadcast_activations` a row's PEs take its activation in the same cycle, and with
# `adder_tree_columns` every row takes its activation at once: a shorter latency and minimum
# tile.
CASES = ([(r, c, True, False, False) for r, c in SHAPES]
         + [(r, c, False, False, False) for r, c in ((1, 1), (3, 5), (4, 4), (8, 1))]
         + [(r, c, p, True, False) for r, c, p in ((3, 5, True), (1, 8, True), (4, 4, False),
                                                   (5, 3, False))]
         + [(r, c, p, b, True) for r, c, p, b in ((4, 4, False, True), (3, 5, True, True),
                                                  (8, 8, True, False), (5, 3, False, False),
                                                  (1, 1, False, True), (16, 4, True, True))])


@pytest.mark.parametrize("rows,cols,weight_prefetch,broadcast,tree", CASES,
                         ids=[f"{r}x{c}{'' if p else '-two-weights'}{'-broadcast' if b else ''}"
                              f"{'-tree' if t else ''}" for r, c, p, b, t in CASES])
def test_back_to_back_tiles_are_exact_and_bubble_free(run_tb, rows, cols, weight_prefetch,
                                                       broadcast, tree):
    cfg = CoreConfig(rows=rows, cols=cols, weight_prefetch=weight_prefetch,
                     broadcast_activations=broadcast, adder_tree_columns=tree)
    tile = min_tile_length(cfg)
    lengths = [tile, tile + 3, tile, 2 * tile + 1]
    stats = run_tb(cfg, "tpugen.sim.tb_array", {"seed": rows * 100 + cols, "tile_lengths": lengths})
    vectors = sum(lengths)
    # One activation vector per cycle across all tiles: no bubble between weight tiles.
    assert stats["act_cycles"] == vectors
    # First tile: rows weight pushes, (with prefetch) one commit cycle, a cycle for the last
    # push or the commit to reach the columns, then activations; results follow after the
    # array latency.
    assert stats["first_act_cycle"] == rows + 2 + weight_prefetch
    assert stats["cycles"] == stats["first_act_cycle"] + vectors - 1 + array_latency(cfg)
    if not weight_prefetch:
        short = run_tb(cfg, "tpugen.sim.tb_array", {"seed": 5, "tile_lengths": [tile - 1] * 4})
        assert short["act_cycles"] > short["vectors"]


@pytest.mark.parametrize("rows,cols", [(3, 5), (4, 1)], ids=["3x5", "4x1"])
def test_short_and_single_vector_tiles_are_exact(run_tb, rows, cols):
    cfg = CoreConfig(rows=rows, cols=cols)
    stats = run_tb(cfg, "tpugen.sim.tb_array", {"seed": 7, "tile_lengths": [1, 2, 1, 5, 1, 1]})
    assert stats["vectors"] == 11

