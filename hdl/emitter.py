"""A scoped change to Amaranth's RTLIL emitter for the conversions of this generator."""
from contextlib import contextmanager

from amaranth.back import rtlil

__all__ = ["memories_start_at_zero"]


@contextmanager
def memories_start_at_zero():
    """Within the block, RTLIL (and Verilog) conversion writes no initial contents for memories
    whose contents are all zero; the emitter is restored after it.

    Amaranth 0.5 emits every memory's initial contents bit by bit, which took 19 of 50 s for the
    16x16 core's 320 KiB of SRAM, and yosys cannot map an initialized memory to iCE40 SPRAM. Our
    memories start at zero (block RAM does), so the conversions of our designs skip it."""
    emit_memory = rtlil.ModuleEmitter.emit_memory

    def emit_memory_unless_zero(self, cell_idx, cell):
        if any(cell.init):
            emit_memory(self, cell_idx, cell)

    rtlil.ModuleEmitter.emit_memory = emit_memory_unless_zero
    try:
        yield
    finally:
        rtlil.ModuleEmitter.emit_memory = emit_memory
