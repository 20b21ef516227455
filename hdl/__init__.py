"""Amaranth generator of the tpugen core."""
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
