"""Amaranth generator of the tpugen core."""
from .array import SystolicArray
from .controller import Controller
from .core import TpuCore
from .csr import REGISTERS, ControlRegisters
from .execute import ExecuteEngine
from .load import LoadEngine
from .pe import ProcessingElement
from .store import StoreEngine

__all__ = ["ControlRegisters", "Controller", "ExecuteEngine", "LoadEngine", "ProcessingElement",
           "REGISTERS", "StoreEngine", "SystolicArray", "TpuCore"]
