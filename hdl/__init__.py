"""Amaranth generator of the tpugen core."""
from amaranth.back import rtlil

from .array import SystolicArray
from .controller import Controller
from .core import TpuCore
from .csr import ControlRegisters
from .execute import ExecuteEngine
from .load import LoadEngine
from .pe import ProcessingElement
from .store import StoreEngine

__all__ = ["ControlRegisters", "Controller", "ExecuteEngine", "LoadEngine", "ProcessingElement",
           "StoreEngine", "SystolicArray", "TpuCore"]

_emit_memory = rtlil.ModuleEmitter.emit_memory


def _emit_memory_unless_zero(self, cell_idx, cell):
    # Amaranth 0.5 emits every memory's initial contents bit by bit, which took 19 of 50 s for
    # the 16x16 core's 320 KiB of SRAM, and yosys cannot map an initialized memory to iCE40
    # SPRAM. Our memories start at zero (block RAM does), so skip it, on every path to RTLIL.
    if any(cell.init):
        _emit_memory(self, cell_idx, cell)


rtlil.ModuleEmitter.emit_memory = _emit_memory_unless_zero

