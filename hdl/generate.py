"""Verilog for a configured design."""
import re

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


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP_ATTRIBUTE = "(* top =  1  *)\n"
"""How Amaranth's Verilog marks the top module."""


class _VerilogTarget:
    """What `generate_verilog` elaborates for: the array's PEs as instances of modules emitted
    once (`SystolicArray`), so generating a 16x16 core elaborates and converts one PE of each
    kind instead of 256; every module name starts with ``module_prefix``; ``family``: the
    FPGA family whose primitives the design instantiates (`hdl.family.fpga_family`), None for
    generic Verilog."""
    pe_modules = True

    def __init__(self, module_prefix, family=None):
        self.module_prefix = module_prefix
        self.family = family


def generate_verilog(config, design="tpu_core", name=None, *, family=None, emit_src=False,
                     **options):
    """Verilog text with top module ``name`` (default: ``design``), ports named after the
    component's signature, after the modules of its PEs. Every other module's name starts with
    ``name`` too (submodules ``name.block``, PEs ``name_pe``), so cores generated under different
    names can share one design; the default keeps ``tpu_pe``. ``family``: the FPGA whose
    primitives to instantiate, as a board build does (for yosys, not for the simulators):
    "ice40" puts the array's DSP PEs on SB_MAC16 instances, "ecp5" their products in
    MULT18X18D instances' output registers and the datapath's reset on a DCCA
    (`hdl.core.registered_global`); else generic. ``emit_src``: keep each signal's Python
    source line as a ``src`` attribute (for timing reports that name it)."""
    if name is not None and (not isinstance(name, str) or not _IDENTIFIER.fullmatch(name)):
        raise ValueError(f"name={name!r} is invalid: allowed a Verilog identifier "
                         "([A-Za-z_][A-Za-z0-9_]*)")
    component = elaborate(config, design, **options)
    target = _VerilogTarget("tpu" if name is None else name, family)
    lut_pes = len(lut_multiplier_pes(config))
    kinds = [lut for lut, used in ((False, lut_pes < config.rows * config.cols),
                                   (True, lut_pes > 0)) if used]
    with memories_start_at_zero():
        # Amaranth marks every converted module as a top; only ``design`` may stay one, or yosys
        # without -top picks a PE and deletes the core.
        modules = [verilog.convert(pe_module(config, lut), emit_src=emit_src, platform=target,
                                   name=pe_module_name(lut, target.module_prefix))
                   .replace(_TOP_ATTRIBUTE, "", 1) for lut in kinds]
        top = verilog.convert(component, name=name or design, emit_src=emit_src,
                              platform=target)
    return "\n".join([*modules, top])
