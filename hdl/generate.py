"""Verilog for a configured design."""
from amaranth.back import verilog

from .array import SystolicArray
from .core import TpuCore

__all__ = ["DESIGNS", "elaborate", "generate_verilog"]


def _board_system(config):
    from .board import simulated_board_system

    return simulated_board_system(config)


DESIGNS = {"tpu_core": TpuCore, "systolic_array": SystolicArray, "board_system": _board_system}
"""Top-level designs by module name."""


def elaborate(config, design="tpu_core"):
    try:
        return DESIGNS[design](config)
    except KeyError:
        raise ValueError(f"design={design!r} is invalid: allowed {', '.join(DESIGNS)}") from None


def generate_verilog(config, design="tpu_core"):
    """Verilog text with top module ``design``, ports named after the component's signature."""
    component = elaborate(config, design)
    return verilog.convert(component, name=design, emit_src=False)
