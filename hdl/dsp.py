"""ECP5 MULT18X18D blocks with their own registers: yosys maps ``*`` to the block without any,
so a register beside the multiplier is a flip-flop of the fabric and the route to the DSP column
is on the path."""
from amaranth.hdl import Cat, ClockSignal, Const, Instance, Signal, Value, signed

from .family import dsp_model, fpga_family

__all__ = ["mult18x18d", "registered_operands_product", "registered_wide_product"]


def mult18x18d(m, a, b, name, *, registered_inputs=False, registered_output=False,
               model=False):
    """The signed product ``a * b`` (each at most 18 bits, sign-extended) from one MULT18X18D in
    ``m``, ``len(a) + len(b)`` bits. ``registered_inputs``: the block registers ``a`` and ``b``
    (the product is of the previous cycle's); ``registered_output``: it registers the product (a
    cycle later). The registers run on clock 0, always enabled and never reset.

    ``model``: the same registers in Amaranth instead of the instance (the simulators)."""
    if max(len(a), len(b)) > 18:
        raise ValueError(f"a MULT18X18D multiplies 18-bit operands, not {len(a)} x {len(b)} bits")
    a, b = Value.cast(a), Value.cast(b)
    product = Signal(signed(len(a) + len(b)), name=f"{name}_product", reset_less=True)
    if model:
        if registered_inputs:
            a_reg, b_reg = (Signal.like(v, name=f"{name}_{n}", reset_less=True)
                            for v, n in ((a, "a"), (b, "b")))
            m.d.sync += [a_reg.eq(a), b_reg.eq(b)]
            a, b = a_reg, b_reg
        m.d["sync" if registered_output else "comb"] += product.eq(a * b)
        return product
    clock = {True: "CLK0", False: "NONE"}
    parameters = {"REG_INPUTA_CLK": clock[registered_inputs],
                  "REG_INPUTB_CLK": clock[registered_inputs],
                  "REG_PIPELINE_CLK": "NONE", "REG_OUTPUT_CLK": clock[registered_output],
                  "CLK0_DIV": "ENABLED", "GSR": "DISABLED", "RESETMODE": "SYNC"}
    p = Signal(36, name=f"{name}_p")
    m.submodules[name] = Instance(
        "MULT18X18D", **{f"p_{key}": value for key, value in parameters.items()},
        i_SIGNEDA=Const(1, 1), i_SIGNEDB=Const(1, 1), i_SOURCEA=Const(0, 1),
        i_SOURCEB=Const(0, 1), i_CLK0=ClockSignal(), i_CE0=Const(1, 1), i_RST0=Const(0, 1),
        **{f"i_A{bit}": a[min(bit, len(a) - 1)] for bit in range(18)},
        **{f"i_B{bit}": b[min(bit, len(b) - 1)] for bit in range(18)},
        **{f"i_C{bit}": Const(0, 1) for bit in range(18)},
        **{f"o_P{bit}": p[bit] for bit in range(36)})
    m.d.comb += product.eq(p[:len(product)])
    return product


def registered_wide_product(m, a, b, name, *, model=False):
    """``a * b`` of the previous cycle's ``a`` (signed, at most 35 bits) and ``b`` (unsigned, at
    most 17 bits), from two MULT18X18D that register them: ``a``'s low 17 bits (unsigned) and
    the rest (signed), each times ``b``, added in the fabric."""
    if len(a) > 35 or len(b) > 17:
        raise ValueError(f"a MULT18X18D pair multiplies up to 35 x 17 bits, not {len(a)} x "
                         f"{len(b)}")
    a, b = Value.cast(a), Cat(b, Const(0, 1)).as_signed()
    low = mult18x18d(m, Cat(a[:17], Const(0, 1)).as_signed(), b, f"{name}_low",
                     registered_inputs=True, model=model)
    high = mult18x18d(m, a[17:].as_signed(), b, f"{name}_high", registered_inputs=True,
                      model=model)
    return (high << 17) + low


def registered_operands_product(m, a, b, name, platform):
    """``a * b`` of the previous cycle's ``a`` (signed, at most 35 bits) and ``b`` (unsigned, at
    most 17 bits), for ``platform``: on ECP5 from a MULT18X18D pair that registers them
    (`registered_wide_product`), elsewhere from registers of the fabric and ``*``."""
    if fpga_family(platform) == "ecp5":
        return registered_wide_product(m, a, b, name, model=dsp_model(platform))
    a, b = Value.cast(a), Value.cast(b)
    a_reg = Signal(a.shape(), name=f"{name}_a")
    b_reg = Signal(b.shape(), name=f"{name}_b")
    m.d.sync += [a_reg.eq(a), b_reg.eq(b)]
    return a_reg * b_reg
