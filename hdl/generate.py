"""Verilog for a configured design."""
from amaranth.back import verilog

from .array import SystolicArray, lut_multiplier_pes, pe_module, pe_module_name
from .core import TpuCore
from .emitter import memories_start_at_zero
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


_TOP_ATTRIBUTE = "(* top =  1  *)\n"
"""How Amaranth's Verilog marks the top module."""


class _VerilogTarget:
    """What `generate_verilog` elaborates for: the array's PEs as instances of modules emitted
    once (`SystolicArray`), so generating a 16x16 core elaborates and converts one PE of each
    kind instead of 256."""
    pe_modules = True


def generate_verilog(config, design="tpu_core", **options):
    """Verilog text with top module ``design``, ports named after the component's signature,
    after the modules of its PEs."""
    component = elaborate(config, design, **options)
    lut_pes = len(lut_multiplier_pes(config))
    kinds = [lut for lut, used in ((False, lut_pes < config.rows * config.cols),
                                   (True, lut_pes > 0)) if used]
    with memories_start_at_zero():
        # Amaranth marks every converted module as a top; only ``design`` may stay one, or yosys
        # without -top picks a PE and deletes the core.
        modules = [verilog.convert(pe_module(config, lut), name=pe_module_name(lut),
                                   emit_src=False).replace(_TOP_ATTRIBUTE, "", 1) for lut in kinds]
        top = verilog.convert(component, name=design, emit_src=False, platform=_VerilogTarget())
    return "\n".join([*modules, top])
