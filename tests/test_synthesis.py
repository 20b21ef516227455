"""Yosys maps the scratchpad and accumulator to block RAM, not flip-flops."""
import math

from tpugen import PRESETS
from tpugen.fpga.synth import synth_cells

def test_memories_are_block_ram_on_ecp5():
    config = PRESETS["tiny"]
    cells = synth_cells(config, "ecp5")
    scratchpad_bits = config.scratchpad_kib * 8192
    accumulator_bits = config.accumulator_kib * 8192
    # Each memory has two read ports, which yosys implements as two copies.
    expected = 2 * (math.ceil(scratchpad_bits / (16 * 1024)) + math.ceil(accumulator_bits / (16 * 1024)))
    assert cells.get("DP16KD", 0) >= expected, cells
    # Were the memories flip-flops, there would be more flip-flops than memory bits.
    assert cells.get("TRELLIS_FF", 0) < scratchpad_bits + accumulator_bits, cells
