"""Processing element: one int8 multiply-accumulate with double-buffered weights."""
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ProcessingElement"]


class ProcessingElement(wiring.Component):
    """Weight-stationary PE.

    Each cycle: ``psum_out <= psum_in + act_in * weight[sel_in]`` and ``act_out <= act_in``
    (``sel_out <= sel_in``), so the bank select travels with the activation wavefront.
    Weights arrive through a shift chain (``shift_in`` to ``shift_out`` when ``shift_en``), and
    ``commit`` copies the chain register into bank ``commit_bank`` while the other bank computes.
    """

    def __init__(self, data_width=8, acc_width=32):
        if data_width < 2:
            raise ValueError(f"data_width={data_width!r} is invalid: allowed an integer >= 2")
        if acc_width < 2 * data_width:
            raise ValueError(f"acc_width={acc_width!r} is invalid: allowed >= 2 * data_width")
        self.data_width = data_width
        self.acc_width = acc_width
        super().__init__({
            "act_in": In(signed(data_width)),
            "sel_in": In(1),
            "act_out": Out(signed(data_width)),
            "sel_out": Out(1),
            "psum_in": In(signed(acc_width)),
            "psum_out": Out(signed(acc_width)),
            "shift_in": In(signed(data_width)),
            "shift_out": Out(signed(data_width)),
            "shift_en": In(1),
            "commit": In(1),
            "commit_bank": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        banks = [Signal(signed(self.data_width), name=f"weight{b}") for b in range(2)]
        weight = Mux(self.sel_in, banks[1], banks[0])

        m.d.sync += [
            self.act_out.eq(self.act_in),
            self.sel_out.eq(self.sel_in),
            self.psum_out.eq(self.psum_in + self.act_in * weight),
        ]
        with m.If(self.shift_en):
            m.d.sync += self.shift_out.eq(self.shift_in)
        for index, bank in enumerate(banks):
            with m.If(self.commit & (self.commit_bank == index)):
                m.d.sync += bank.eq(self.shift_out)
        return m
