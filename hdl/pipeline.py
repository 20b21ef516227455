"""Delay lines: a value some cycles later, in flip-flops of the module's sync domain."""
from amaranth.hdl import Signal

__all__ = ["delayed", "delays", "pipeline_register"]


def delays(m, value, cycles):
    """``value`` 1, 2, ... ``cycles`` cycles later (registers driven in ``m``)."""
    stages = []
    for _ in range(cycles):
        reg = Signal.like(value)
        m.d.sync += reg.eq(value)
        stages.append(value := reg)
    return stages


def delayed(m, value, cycles):
    """``value`` ``cycles`` (>= 0) cycles later: itself when 0."""
    return delays(m, value, cycles)[-1] if cycles else value


def pipeline_register(m, value, name):
    """``value`` one stage later: a register of ``m`` named ``name`` (for timing reports)."""
    reg = Signal.like(value, name=name)
    m.d.sync += reg.eq(value)
    return reg
