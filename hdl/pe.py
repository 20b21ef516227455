"""Processing element: one int8 multiply-accumulate with double-buffered weights."""
from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, Mux, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .carry import and_pair_sums
from .dsp import mult18x18d
from .family import dsp_model, fpga_family

__all__ = ["PRODUCT_STAGES", "ProcessingElement", "add_pe", "carry_chain_product",
           "ice40_cascade_sum", "ice40_mac_operands", "ice40_mac_pair", "lut_product",
           "pe_signature"]

PRODUCT_STAGES = 1
"""Registers between a PE's multiplier and its partial sum's adder (`pe_outputs`), in every kind
of PE (a DSP PE's in its block): the cycles a PE adds to the array's latency beyond passing its
partial sum on."""


def pe_signature(data_width=8, acc_width=32, act_width=None):
    """``data_width``: signed weights; ``act_width`` (default ``data_width``): signed activations;
    ``acc_width``: the partial sums (the array's are narrower than its results, `psum_width`)."""
    act_width = data_width if act_width is None else act_width
    if data_width < 2:
        raise ValueError(f"data_width={data_width!r} is invalid: allowed an integer >= 2")
    if act_width < data_width:
        raise ValueError(f"act_width={act_width!r} is invalid: allowed >= data_width")
    if acc_width < data_width + act_width:
        raise ValueError(f"acc_width={acc_width!r} is invalid: allowed >= data_width + act_width")
    return wiring.Signature({
        "act_in": In(signed(act_width)),
        "switch_in": In(1),
        "act_out": Out(signed(act_width)),
        "switch_out": Out(1),
        "psum_in": In(signed(acc_width)),
        "psum_out": Out(signed(acc_width)),
        "shift_in": In(signed(data_width)),
        "shift_out": Out(signed(data_width)),
        "shift_en": In(1),
        "commit": In(1),
    })


def _booth_digits(weight):
    """Radix-4 Booth digits of signed ``weight``, least significant first, as (one, two, negative):
    the digit is ``(-1 if negative else 1) * (1 if one else 2 if two else 0)``."""
    bits = Cat(Const(0, 1), weight, weight[-1])
    for index in range((len(weight) + 1) // 2):
        low, middle, high = bits[2 * index], bits[2 * index + 1], bits[2 * index + 2]
        yield middle ^ low, (high & ~middle & ~low) | (~high & middle & low), high


def _adder_tree(m, terms, act_width, name):
    """``(sum, carry)`` of ``terms``, each ``(value, digits, carry)``: ``value`` is the sum of
    ``digits`` base-4 digits of a product of ``act`` (``act_width`` bits) starting at the term's
    own, ``carry`` a carry-in it misses; the terms are in order of their lowest digit.

    Summed pairwise in a balanced tree of adders (one level fewer than a chain: 12% higher fmax on
    ECP5, 4% more LUTs). Each adder adds the higher sum above the lower one's finished low bits,
    so yosys keeps the adders as separate carry chains; a plain sum becomes one $macc of full
    adders, 2.5 times the LUTs. The first term's missing carry is the one returned."""
    level = 0
    while len(terms) > 1:
        pairs = []
        for index in range(0, len(terms) - 1, 2):
            (low, low_digits, carry), (high, high_digits, high_carry) = terms[index:index + 2]
            digits = low_digits + high_digits
            # A digit's term is at most 3 * 2**(act_width - 1) (Booth's 2**act_width), so |a sum of
            # d digits| <= 2**(act_width - 1) * (4**d - 1): it fits act_width + 2 * d signed bits.
            total = Signal(signed(act_width + 2 * digits), name=f"{name}_sum{level}_{index // 2}")
            done = 2 * low_digits
            m.d.comb += total.eq(Cat(low[:done], low[done:].as_signed() + high + high_carry))
            pairs.append((total, digits, carry))
        terms = pairs + terms[len(pairs) * 2:]
        level += 1
    product, _, carry = terms[0]
    return product, carry


def lut_product(m, act, weight, name="mul"):
    """``(product, carry)`` with ``product + carry == act * weight`` (signed), built in ``m``
    without ``*``: from LUTs, not a DSP.

    One radix-4 Booth partial product of ``act`` per weight digit (at most 2 |act|), summed in
    a tree of adders (`_adder_tree`). A negative digit's partial product is
    ``~(|digit| * act)``; its missing +1 is the carry-in of the adder that absorbs it (digit 0's:
    ``carry``, for the adder that takes the product).
    """
    act_width = len(act)
    terms = [(Mux(two, act << 1, Mux(one, act, 0)) ^ negative.replicate(act_width + 1).as_signed(),
              1, negative)
             for one, two, negative in _booth_digits(weight)]
    return _adder_tree(m, terms, act_width, name)


def carry_chain_product(m, act, weight, name="mul", *, model=False):
    """``(product, 0)`` with ``product == act * weight`` (signed) from ECP5 carry chains, built in
    ``m`` without ``*``: each pair of weight bits adds two rows of partial products (``act`` or
    0, at most 3 / 2 of |act| together) made in the LUTs of their adder, all pairs in one chain
    (`carry.and_pair_sums`), then a tree of adders (`_adder_tree`). Two thirds of
    `lut_product`'s LUTs on ECP5, where a Booth partial product bit is a LUT of five inputs.

    ``model``: the CCU2C blocks modelled in Amaranth, for the simulator."""
    top = len(weight) - 1
    pairs = [(weight[low], weight[low + 1] if low < top else None,
              "low" if low == top else "high" if low + 1 == top else None)
             for low in range(0, len(weight), 2)]
    terms = [(pair, 1, 0) for pair in and_pair_sums(m, act, pairs, f"{name}_pairs", model=model)]
    return _adder_tree(m, terms, len(act), name)


ICE40_WEIGHT_WIDTH, ICE40_ACT_WIDTHS = 8, (8, 9)
"""The weight width and the activation widths of the PEs `ice40_mac_operands` puts on an
SB_MAC16 half."""


def ice40_mac_operands(act, weight):
    """``(a, b, c, carry)`` such that ``act * weight == wrap16(a * b + c) + carry`` exactly, for
    a signed 9-bit (or 8-bit: ``c`` and ``carry`` 0) ``act`` and a signed 8-bit ``weight``: what
    one 8x8 half of an iCE40 SB_MAC16 (signed x signed, plus its 16-bit C or D input) computes,
    plus a carry-in of the PE's adder.

    ``a`` is ``act``'s low byte read as signed, so ``act == a + 256 * (act[7] - act[8])``: the
    correction ``c`` is ``256 * weight`` for a uint8 above 127, ``-256 * weight - 1`` for an int9
    below -128 (``~weight`` in the high byte, ones in the low byte; ``carry`` adds the 1 back), 0
    for an int8. The sum without ``carry`` stays in -32,768..32,767 for every operand pair
    (int9 -256 x -128 = 32,768 is the only product beyond 16 bits), so the wrap is exact.
    """
    if len(weight) != ICE40_WEIGHT_WIDTH or len(act) not in ICE40_ACT_WIDTHS:
        raise ValueError(f"an SB_MAC16 half takes int8 weights and int8 or int9 activations, "
                         f"not int{len(weight)} and int{len(act)}")
    if len(act) == 8:
        return act, weight, Const(0, 16), 0
    above = act[7] & ~act[8]  # 128..255
    below = act[8] & ~act[7]  # -256..-129
    high = Mux(above, weight.as_unsigned(), Mux(below, ~weight.as_unsigned(), 0))
    return act[:8].as_signed(), weight, Cat(below.replicate(8), high), below


ICE40_MAC_PARAMETERS = {
    # Two independent 8x8 signed multipliers (A[15:8] x B[15:8] on top, A[7:0] x B[7:0] at the
    # bottom), each product registered (TOP_/BOT_8x8_MULT_REG) and added to C (top) or D
    # (bottom), registered too (C_REG, D_REG), in its 16-bit adder; no carry in: O[31:16] =
    # C + top product, O[15:0] = D + bottom product (mod 2**16), of the cycle before's inputs.
    "MODE_8x8": Const(1, 1), "A_SIGNED": Const(1, 1), "B_SIGNED": Const(1, 1),
    "TOP_8x8_MULT_REG": Const(1, 1), "BOT_8x8_MULT_REG": Const(1, 1),
    "C_REG": Const(1, 1), "D_REG": Const(1, 1),
    "TOPADDSUB_LOWERINPUT": Const(1, 2), "TOPADDSUB_UPPERINPUT": Const(1, 1),
    "TOPADDSUB_CARRYSELECT": Const(0, 2), "TOPOUTPUT_SELECT": Const(0, 2),
    "BOTADDSUB_LOWERINPUT": Const(1, 2), "BOTADDSUB_UPPERINPUT": Const(1, 1),
    "BOTADDSUB_CARRYSELECT": Const(0, 2), "BOTOUTPUT_SELECT": Const(0, 2),
}
"""SB_MAC16 parameters of `ice40_mac_pair` (as yosys' ice40/cells_sim.v models the block: in
8x8 mode A_SIGNED and B_SIGNED sign-extend both halves' operands). Registered: each half's
8x8 product (its pipeline register) and its C or D input, so the block holds the PEs' product
register (`PRODUCT_STAGES`) as an ECP5 PE's MULT18X18D does (`add_pe`); A, B and the outputs
are not (B is, held between weight switches, with `ice40_mac_pair`'s ``weight_load``). The
registers take CLK, always enabled, never reset, and never held but for B."""


def ice40_mac_pair(m, halves, name="mac", *, model=False, weight_load=None, cascade=False,
                   registered_a=False):
    """One iCE40 SB_MAC16 for one or two ``halves``, each ``(a, b, c, carry)`` of
    `ice40_mac_operands` (signed 8-bit ``a``, ``b``; 16-bit ``c``); returns for each
    ``(product, carry)``: ``product`` the 16-bit signed ``wrap16(a * b + c)`` and ``carry``
    of the cycle before, so ``product + carry`` is the registered ``act * weight``
    (`PRODUCT_STAGES`). The block registers the 8x8 product and ``c``
    (`ICE40_MAC_PARAMETERS`), on the sync clock, always enabled; an int9 activation's
    ``carry`` (an int8's is 0) is a flip-flop of the fabric. None of them is reset.

    With ``weight_load`` the block's B register is the halves' weight register: it takes
    both ``b`` in a cycle of ``weight_load`` (BHOLD otherwise) and the products use it, as a
    PE's active weight (`pe_weight`); without, ``b`` goes to the multipliers as it is.

    With ``registered_a`` the block's A register takes both ``a`` every cycle (A_REG 1): the
    products are of the ``a`` of two cycles before, the register of the PEs' activations.

    With ``cascade`` ``c`` is not registered (C_REG and D_REG 0): ``product`` is the registered
    8x8 product plus ``c`` of the same cycle, for a ``c`` that is another block's ``product``
    (two PEs of a column summed in the blocks' adders, `SystolicArray`).

    ``model``: the same registers and arithmetic in Amaranth instead of the instance, for the
    simulator."""
    if not 1 <= len(halves) <= 2:
        raise ValueError(f"an SB_MAC16 has two 8x8 halves, not {len(halves)}")
    if registered_a and model:  # the block's A register, not reset
        registers = [Signal(signed(8), name=f"{name}_a{index}", reset_less=True)
                     for index in range(len(halves))]
        m.d.sync += [register.eq(a) for register, (a, _, _, _) in zip(registers, halves)]
        halves = [(register, b, c, carry) for register, (_, b, c, carry)
                  in zip(registers, halves)]
    if weight_load is not None and model:  # the block's B register, not reset
        weights = [Signal(signed(8), name=f"{name}_b{index}", reset_less=True)
                   for index in range(len(halves))]
        with m.If(weight_load):
            m.d.sync += [weight.eq(b) for weight, (_, b, _, _) in zip(weights, halves)]
        halves = [(a, weight, c, carry) for weight, (a, _, c, carry) in zip(weights, halves)]
    results = [Signal(signed(16), name=f"{name}_o{index}", reset_less=True)
               for index in range(len(halves))]
    carries = []
    for index, (*_, carry) in enumerate(halves):
        if isinstance(carry, Value):  # int9; an int8's is the integer 0: no flip-flop
            carry_reg = Signal(name=f"{name}_carry{index}", reset_less=True)
            m.d.sync += carry_reg.eq(carry)
            carry = carry_reg
        carries.append(carry)
    if model and cascade:
        for index, ((a, b, c, _), result) in enumerate(zip(halves, results)):
            product = Signal(signed(16), name=f"{name}_p{index}", reset_less=True)
            m.d.sync += product.eq(a * b)
            m.d.comb += result.eq(product + c.as_signed())
        return list(zip(results, carries))
    if model:
        m.d.sync += [result.eq(a * b + c.as_signed())
                     for (a, b, c, _), result in zip(halves, results)]
        return list(zip(results, carries))
    zero = (Const(0, 8), Const(0, 8), Const(0, 16), 0)
    (a_top, b_top, c_top, _), (a_bottom, b_bottom, d_bottom, _) = [*halves, zero][:2]
    out = Signal(32, name=f"{name}_out")
    controls = {port: Const(0, 1) for port in (
        "AHOLD", "BHOLD", "CHOLD", "DHOLD", "IRSTTOP", "IRSTBOT", "ORSTTOP", "ORSTBOT",
        "OLOADTOP", "OLOADBOT", "ADDSUBTOP", "ADDSUBBOT", "OHOLDTOP", "OHOLDBOT", "CI",
        "ACCUMCI", "SIGNEXTIN")}
    parameters = dict(ICE40_MAC_PARAMETERS)
    if cascade:
        parameters.update(C_REG=Const(0, 1), D_REG=Const(0, 1))
    if registered_a:
        parameters["A_REG"] = Const(1, 1)
    if weight_load is not None:
        parameters["B_REG"] = Const(1, 1)
        controls["BHOLD"] = ~weight_load
    m.submodules[name] = Instance(
        "SB_MAC16", **{f"p_{key}": value for key, value in parameters.items()},
        **{f"i_{port}": value for port, value in controls.items()}, i_CLK=ClockSignal(),
        i_CE=Const(1, 1), i_A=Cat(a_bottom, a_top), i_B=Cat(b_bottom, b_top), i_C=c_top,
        i_D=d_bottom, o_O=out)
    m.d.comb += [result.eq(out[16 * (1 - index):16 * (2 - index)])
                 for index, result in enumerate(results)]
    return list(zip(results, carries))


def ice40_cascade_sum(product):
    """The 17-bit signed sum of two int8 x int8 products that an SB_MAC16 half of
    `ice40_mac_pair` with ``cascade`` gives as ``product`` (16 bits): every sum fits them but
    32,768 (-128 x -128 twice), which wraps to 0x8000 and is read back as positive (no sum is
    -32,768)."""
    return Cat(product, product[15] & product[:15].any()).as_signed()


def pe_weight(m, pe, name="pe", prefetch=True, active=True, chain=True):
    """Add ``pe``'s load chain and weight registers to ``m``; returns the active weight.

    ``shift_en`` moves the chain (``shift_in`` to ``shift_out``), ``commit`` copies it into the
    upcoming weight, and ``switch_in`` makes the upcoming weight active for the next cycle's
    activation; without ``prefetch`` (`CoreConfig.weight_prefetch`) there is no upcoming
    weight: ``switch_in`` takes the chain's and ``commit`` is not used. The product takes the
    active register as it is: no multiplexer between two banks on its path (8 LUTs a PE).
    Without ``chain`` (`CoreConfig.weight_chain`) there is no chain either: ``shift_en`` loads
    ``shift_in`` into the active weight (``shift_out``, ``commit`` and ``switch_in`` are not
    used). Without ``active`` it returns the upcoming weight (or the chain's, or without a
    chain ``shift_in``), for a register that ``switch_in`` (without a chain ``shift_en``)
    loads elsewhere (an SB_MAC16's, `ice40_mac_pair`)."""
    width = len(pe.shift_in)
    if not chain:
        if not active:
            return pe.shift_in
        weight = Signal(signed(width), name=f"{name}_active")
        with m.If(pe.shift_en):
            m.d.sync += weight.eq(pe.shift_in)
        return weight
    with m.If(pe.shift_en):
        m.d.sync += pe.shift_out.eq(pe.shift_in)
    upcoming = pe.shift_out
    if prefetch:
        upcoming = Signal(signed(width), name=f"{name}_upcoming")
        with m.If(pe.commit):
            m.d.sync += upcoming.eq(pe.shift_out)
    if not active:
        return upcoming
    weight = Signal(signed(width), name=f"{name}_active")
    with m.If(pe.switch_in):
        m.d.sync += weight.eq(upcoming)
    return weight


def pe_outputs(m, pe, product, carry=0, *, registered=True, chained=True):
    """The PE's registers: the activation and the weight switch passed on, and ``psum_out <=
    psum_in + product + carry``. With ``registered`` the product and its carry are registered
    first (`PRODUCT_STAGES`): the multiplier and the partial sum's adder are not one path (the
    ECP5 8x8 array's critical path ran from the former weight bank select through both,
    12.9 ns). Not reset: no valid partial sum takes a product from before a reset. Without
    ``chained`` (`CoreConfig.adder_tree_columns`) ``psum_out`` is the registered product plus
    its carry, for the column's adder tree, and ``psum_in`` is not used."""
    if registered:
        product_reg = Signal.like(product, name=f"{pe.psum_out.name}_product", reset_less=True)
        carry_reg = Signal(name=f"{pe.psum_out.name}_carry", reset_less=True)
        m.d.sync += [product_reg.eq(product), carry_reg.eq(carry)]
        product, carry = product_reg, carry_reg
    m.d.sync += [pe.act_out.eq(pe.act_in), pe.switch_out.eq(pe.switch_in)]
    if chained:
        m.d.sync += pe.psum_out.eq(pe.psum_in + product + carry)
    else:
        m.d.comb += pe.psum_out.eq(product + carry)


def add_pe(m, pe, name="pe", lut_multiplier=False, *, ecp5=False, model=False,
           weight_prefetch=True, weight_chain=True, chained=True):
    """Add the logic of one PE, with ports ``pe`` (a `pe_signature` interface), to module ``m``.

    ``lut_multiplier``: build the multiplier from LUTs (`lut_product`) instead of ``*``, which
    yosys maps to a DSP block; both compute the same. The product is registered before the
    partial sum's adder (`PRODUCT_STAGES`, `pe_outputs`); with ``ecp5`` a DSP PE's in its
    MULT18X18D's output register (`dsp.mult18x18d`, modelled with ``model``). The array
    builds its PEs with this directly rather than as 256 submodules (one flat module simulates
    faster), except in generated Verilog, where each PE is an instance of one
    `ProcessingElement` module (`SystolicArray`). On iCE40 the array builds its DSP PEs in
    pairs around one SB_MAC16 instead, which registers their products (`ice40_mac_pair`).
    ``weight_prefetch`` and ``weight_chain``: see `pe_weight`; ``chained``: see `pe_outputs`.
    """
    weight = pe_weight(m, pe, name, weight_prefetch, chain=weight_chain)
    registered = True
    if lut_multiplier and ecp5:
        product, carry = carry_chain_product(m, pe.act_in, weight, name=f"{name}_mul",
                                             model=model)
    elif lut_multiplier:
        product, carry = lut_product(m, pe.act_in, weight, name=f"{name}_mul")
    elif ecp5:  # the product register is the DSP block's own: no fabric
        # flip-flops beside it (in each of the 8x8's 64 PEs they left two placements unroutable)
        product = mult18x18d(m, pe.act_in, weight, f"{name}_mult", registered_output=True,
                             model=model)
        carry = 0
        registered = False
    else:
        product, carry = pe.act_in * weight, 0
    pe_outputs(m, pe, product, carry, registered=registered, chained=chained)


class ProcessingElement(wiring.Component):
    """Weight-stationary PE.

    Each cycle: ``psum_out <= psum_in + product`` with ``product <= act_in * weight``
    (registered, `PRODUCT_STAGES`: ``psum_in`` meets the product of the activation that came a
    cycle before it), ``act_out <= act_in`` and ``switch_out <= switch_in``.
    Weights arrive through a shift chain (``shift_in`` to ``shift_out`` when ``shift_en``);
    ``commit`` copies the chain register into the upcoming weight while the active one computes,
    and ``switch_in``, one cycle ahead of a tile's first activation, makes it active: the switch
    travels with the activations, so a tile switch needs no bubble (`pe_weight`; without
    ``weight_prefetch`` the switch takes the chain's weight and ``commit`` is unused; without
    ``weight_chain`` ``shift_en`` loads ``shift_in`` as the weight).
    ``lut_multiplier``: see `add_pe`. Without ``chained`` ``psum_out`` is the registered
    product, for a column's adder tree (`pe_outputs`).
    """

    def __init__(self, data_width=8, acc_width=32, act_width=None, lut_multiplier=False,
                 weight_prefetch=True, chained=True, weight_chain=True):
        for name, value in (("lut_multiplier", lut_multiplier),
                            ("weight_prefetch", weight_prefetch), ("chained", chained),
                            ("weight_chain", weight_chain)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r} is invalid: allowed True or False")
        self.data_width = data_width
        self.acc_width = acc_width
        self.lut_multiplier = lut_multiplier
        self.weight_prefetch = weight_prefetch
        self.weight_chain = weight_chain
        self.chained = chained
        super().__init__(pe_signature(data_width, acc_width, act_width))

    def elaborate(self, platform):
        m = Module()
        add_pe(m, self, lut_multiplier=self.lut_multiplier, ecp5=fpga_family(platform) == "ecp5",
               model=dsp_model(platform), weight_prefetch=self.weight_prefetch,
               weight_chain=self.weight_chain, chained=self.chained)
        return m
