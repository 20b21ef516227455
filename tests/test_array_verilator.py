"""The systolic array on Verilator under cocotb: bit-exact results and ideal cycle counts."""
import pytest

from tpugen import CoreConfig
from tpugen.hdl.array import array_latency, min_tile_length

SHAPES = [(1, 1), (1, 8), (8, 1), (3, 5), (8, 8), (16, 16)]


@pytest.mark.parametrize("rows,cols", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_back_to_back_tiles_are_exact_and_bubble_free(run_tb, rows, cols):
    cfg = CoreConfig(rows=rows, cols=cols)
    tile = min_tile_length(cfg)
    lengths = [tile, tile + 3, tile, 2 * tile + 1]
    stats = run_tb(cfg, "tpugen.sim.tb_array", {"seed": rows * 100 + cols, "tile_lengths": lengths})
    vectors = sum(lengths)
    # One activation vector per cycle across all tiles: no bubble between weight tiles.
    assert stats["act_cycles"] == vectors
    # First tile: rows weight pushes, one commit cycle, a cycle for the commit to reach the
    # columns, then activations; results follow after the array latency.
    assert stats["first_act_cycle"] == rows + 3
    assert stats["cycles"] == stats["first_act_cycle"] + vectors - 1 + array_latency(cfg)


@pytest.mark.parametrize("rows,cols", [(3, 5), (4, 1)], ids=["3x5", "4x1"])
def test_short_and_single_vector_tiles_are_exact(run_tb, rows, cols):
    cfg = CoreConfig(rows=rows, cols=cols)
    stats = run_tb(cfg, "tpugen.sim.tb_array", {"seed": 7, "tile_lengths": [1, 2, 1, 5, 1, 1]})
    assert stats["vectors"] == 11


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 5), (4, 4), (8, 1)],
                         ids=["1x1", "3x5", "4x4", "8x1"])
def test_without_weight_prefetch_tiles_are_exact_and_min_tile_length_is_tight(run_tb, rows,
                                                                             cols):
    # Two weight registers a PE: a tile shifts in once the one before it has switched every
    # PE, so `min_tile_length` is longer; one vector fewer a tile leaves a bubble.
    cfg = CoreConfig(rows=rows, cols=cols, weight_prefetch=False)
    tile = min_tile_length(cfg)
    lengths = [tile, tile + 3, tile, 2 * tile + 1]
    stats = run_tb(cfg, "tpugen.sim.tb_array", {"seed": rows * 10 + cols, "tile_lengths": lengths})
    vectors = sum(lengths)
    assert stats["act_cycles"] == vectors
    # First tile: rows weight pushes, a cycle for the last to reach the columns, activations.
    assert stats["first_act_cycle"] == rows + 2
    assert stats["cycles"] == stats["first_act_cycle"] + vectors - 1 + array_latency(cfg)
    short = run_tb(cfg, "tpugen.sim.tb_array", {"seed": 5, "tile_lengths": [tile - 1] * 4})
    assert short["act_cycles"] > short["vectors"]
