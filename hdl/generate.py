"""Verilog for a configured design."""
from amaranth.back import verilog

from .array import SystolicArray
from .core import TpuCore
from .sim_system import SimSystem

__all__ = ["DESIGNS", "elaborate", "generate_verilog"]


def _board_system(config):
    from .board import simulated_board_system

    return simulated_board_system(config)


DESIGNS = {"tpu_core": TpuCore, "systolic_array": SystolicArray, "board_system": _board_system,
           "sim_system": SimSystem}
"""Top-level designs by module name."""


def elaborate(config, design="tpu_core", **options):
    """The component of ``design`` for ``config``; ``options``: its other constructor arguments."""
    if design not in DESIGNS:
        raise ValueError(f"design={design!r} is invalid: allowed {', '.join(DESIGNS)}")
    return DESIGNS[design](config, **options)


def generate_verilog(config, design="tpu_core", **options):
    """Verilog text with top module ``design``, ports named after the component's signature."""
    component = elaborate(config, design, **options)
    return verilog.convert(component, name=design, emit_src=False)
