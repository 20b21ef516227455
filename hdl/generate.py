"""Verilog for a configured design."""
from amaranth.back import rtlil, verilog

from .array import SystolicArray
from .core import TpuCore

__all__ = ["DESIGNS", "elaborate", "generate_verilog"]

DESIGNS = {"tpu_core": TpuCore, "systolic_array": SystolicArray}
"""Top-level designs by module name."""


def elaborate(config, design="tpu_core"):
    try:
        return DESIGNS[design](config)
    except KeyError:
        raise ValueError(f"design={design!r} is invalid: allowed {', '.join(DESIGNS)}") from None


_emit_memory = rtlil.ModuleEmitter.emit_memory


def _emit_memory_unless_zero(self, cell_idx, cell):
    # Amaranth 0.5 emits every memory's initial contents bit by bit, which took 19 of 50 s for
    # the 16x16 core's 320 KiB of SRAM. Our memories start at zero (block RAM does), so skip it.
    if any(cell.init):
        _emit_memory(self, cell_idx, cell)


rtlil.ModuleEmitter.emit_memory = _emit_memory_unless_zero


def generate_verilog(config, design="tpu_core"):
    """Verilog text with top module ``design``, ports named after the component's signature."""
    component = elaborate(config, design)
    return verilog.convert(component, name=design, emit_src=False)
