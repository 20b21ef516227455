"""Amaranth generator of the tpugen core."""
from .array import SystolicArray
from .pe import ProcessingElement

__all__ = ["ProcessingElement", "SystolicArray"]
