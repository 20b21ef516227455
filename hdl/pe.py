"""Processing element: one int8 multiply-accumulate with double-buffered weights."""
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ProcessingElement", "pe_signature", "add_pe"]


def pe_signature(data_width=8, acc_width=32, act_width=None):
    """``data_width``: signed weights; ``act_width`` (default ``data_width``): signed activations."""
    act_width = data_width if act_width is None else act_width
    if data_width < 2:
        raise ValueError(f"data_width={data_width!r} is invalid: allowed an integer >= 2")
    if act_width < data_width:
        raise ValueError(f"act_width={act_width!r} is invalid: allowed >= data_width")
    if acc_width < data_width + act_width:
        raise ValueError(f"acc_width={acc_width!r} is invalid: allowed >= data_width + act_width")
    return wiring.Signature({
        "act_in": In(signed(act_width)),
        "sel_in": In(1),
        "act_out": Out(signed(act_width)),
        "sel_out": Out(1),
        "psum_in": In(signed(acc_width)),
        "psum_out": Out(signed(acc_width)),
        "shift_in": In(signed(data_width)),
        "shift_out": Out(signed(data_width)),
        "shift_en": In(1),
        "commit": In(1),
        "commit_bank": In(1),
    })


def add_pe(m, pe, name="pe"):
    """Add the logic of one PE, with ports ``pe`` (a `pe_signature` interface), to module ``m``.

    The array builds its PEs with this directly rather than as 256 submodules: one flat module
    generates (and simulates) faster, with the same logic as `ProcessingElement`.
    """
    width = len(pe.shift_in)
    banks = [Signal(signed(width), name=f"{name}_weight{b}") for b in range(2)]
    weight = Mux(pe.sel_in, banks[1], banks[0])
    m.d.sync += [
        pe.act_out.eq(pe.act_in),
        pe.sel_out.eq(pe.sel_in),
        pe.psum_out.eq(pe.psum_in + pe.act_in * weight),
    ]
    with m.If(pe.shift_en):
        m.d.sync += pe.shift_out.eq(pe.shift_in)
    for index, bank in enumerate(banks):
        with m.If(pe.commit & (pe.commit_bank == index)):
            m.d.sync += bank.eq(pe.shift_out)


class ProcessingElement(wiring.Component):
    """Weight-stationary PE.

    Each cycle: ``psum_out <= psum_in + act_in * weight[sel_in]`` and ``act_out <= act_in``
    (``sel_out <= sel_in``), so the bank select travels with the activation wavefront.
    Weights arrive through a shift chain (``shift_in`` to ``shift_out`` when ``shift_en``), and
    ``commit`` copies the chain register into bank ``commit_bank`` while the other bank computes.
    """

    def __init__(self, data_width=8, acc_width=32, act_width=None):
        self.data_width = data_width
        self.acc_width = acc_width
        super().__init__(pe_signature(data_width, acc_width, act_width))

    def elaborate(self, platform):
        m = Module()
        add_pe(m, self)
        return m
