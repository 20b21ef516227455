"""ECP5 carry chains whose LUTs also make their operands: a CCU2C half adds two bits that are
each the AND of two signals, so a multiplier's partial products cost no LUT of their own."""
from amaranth.hdl import Cat, Const, Instance, Mux, Signal

from .family import dsp_model, fpga_family

__all__ = ["add_or_subtract", "and_pair_sums", "ccu2c_chain", "half_init", "separator"]


def half_init(x, y):
    """INIT of a CCU2C half adding bit ``x(A, B)`` to bit ``y(C, D)`` (functions of its inputs):
    its LUT4 is the propagate ``x ^ y``. The block takes the generate from the same INIT at
    C = D = 0 (INIT[3:0]), so ``y(0, 0)`` must be 0: the generate is then ``x``, the carry
    whenever the propagate is 0."""
    if y(0, 0):
        raise ValueError("a CCU2C half's C, D operand must be 0 where C = D = 0")
    return sum((x(a, b) ^ y(c, d)) << (d << 3 | c << 2 | b << 1 | a)
               for a in (0, 1) for b in (0, 1) for c in (0, 1) for d in (0, 1))


def ccu2c_chain(m, halves, carry_in, name, *, model=False):
    """The sum bits of one carry chain of CCU2C blocks in ``m``. Each of ``halves`` is
    ``(inputs, init)``: the A, B, C, D signals of a half and its 16-bit INIT; a half's sum is its
    LUT4 xor the carry from the half below, and it passes the carry on where the LUT4 is 1, else
    the same INIT's value at C = D = 0. ``carry_in``: the constant carry into the first half.
    ``model``: the same arithmetic in Amaranth (as yosys' ``ccu2c_sim.vh``), for the simulator."""
    halves = list(halves) + [((Const(0, 1),) * 4, 0)] * (len(halves) % 2)
    sums = Signal(len(halves), name=f"{name}_s")
    carry = Const(carry_in, 1)
    for block in range(0, len(halves), 2):
        if model:
            for bit in (block, block + 1):
                inputs, init = halves[bit]
                index = Cat(*inputs)
                propagate = Const(init, 16).bit_select(index, 1)
                generate = Const(init & 15, 4).bit_select(index[:2], 1)
                carry_out = Signal(name=f"{name}_c{bit}")
                m.d.comb += [sums[bit].eq(propagate ^ carry),
                             carry_out.eq(Mux(propagate, carry, generate))]
                carry = carry_out
            continue
        (inputs0, init0), (inputs1, init1) = halves[block:block + 2]
        carry_out = Signal(name=f"{name}_c{block + 1}")
        m.submodules[f"{name}_{block // 2}"] = Instance(
            "CCU2C", p_INIT0=Const(init0, 16), p_INIT1=Const(init1, 16),
            p_INJECT1_0="NO", p_INJECT1_1="NO", i_CIN=carry,
            **{f"i_{port}{half}": signal for half, inputs in enumerate((inputs0, inputs1))
               for port, signal in zip("ABCD", inputs)},
            o_S0=sums[block], o_S1=sums[block + 1], o_COUT=carry_out)
        carry = carry_out
    return sums


def separator(carry):
    """A half that starts the next adder of a chain with ``carry`` whatever comes in: its LUT4
    (the propagate) is 0 at its inputs (C = 1, the others 0) and the generate, the same INIT
    at C = 0, is ``carry``. Adders that share a chain share nextpnr's two extra CCU2C of every
    chain (one feeding in the constant carry, one bringing the last carry out)."""
    zero, one = Const(0, 1), Const(1, 1)
    return (zero, zero, one, zero), int(carry)


def and_pair_sums(m, act, pairs, name, *, model=False):
    """For each ``(low, high, negative)`` of ``pairs``: ``(act if low else 0) + 2 * (act if high
    else 0)`` (signed ``act``, bits ``low`` and ``high``), ``len(act) + 2`` bits, two rows of a
    multiplier's partial products added in the LUTs of their adder. ``high`` may be None (no
    second row); ``negative``: None, ``"low"`` or ``"high"``, the row subtracted instead (a
    signed multiplier's top weight bit). One carry chain for all, a `separator` between."""
    width = len(act) + 2
    zero = Const(0, 1)

    def row_bit(bit, weight_bit, shift):
        if weight_bit is None or bit < shift:
            return zero, zero
        return act[min(bit - shift, len(act) - 1)], weight_bit

    halves, starts = [], []
    for index, (low, high, negative) in enumerate(pairs):
        if index:
            halves.append(separator(negative is not None))
        starts.append(len(halves))
        # The subtracted row is x (A, B): its complement is 1 at C = D = 0.
        init = half_init(lambda a, b: (a & b) ^ (negative is not None), lambda c, d: c & d)
        for bit in range(width):
            rows = {"low": row_bit(bit, low, 0), "high": row_bit(bit, high, 1)}
            x, y = ((rows["high"], rows["low"]) if negative == "high"
                    else (rows["low"], rows["high"]))
            halves.append(((*x, *y), init))
    sums = ccu2c_chain(m, halves, int(pairs[0][2] is not None), name, model=model)
    return [sums[start:start + width].as_signed() for start in starts]


def add_or_subtract(m, a, b, subtract, name, platform=None):
    """``a + b``, or ``a - b`` where ``subtract``, wrapped to ``len(a)`` bits (``b`` sign- or
    zero-extended as its shape says), for ``platform``. On ECP5 (`fpga_family`) from one carry
    chain: the inversion of ``b`` is in the chain's LUTs, the 1 of ``-b = ~b + 1`` the carry
    out of a first half whose two operands are both ``subtract`` (modelled in Amaranth with a
    true ``dsp_model``). Elsewhere ``a + (b ^ subtract) + subtract``, which yosys maps to an
    adder with a LUT per bit more on ECP5, for the xor."""
    extended = Signal(len(a), name=f"{name}_b")
    m.d.comb += extended.eq(b)
    if fpga_family(platform) != "ecp5":
        addend = Signal(len(a), name=f"{name}_addend")
        m.d.comb += addend.eq(extended ^ subtract.replicate(len(a)))
        return (Cat(subtract, a) + Cat(subtract, addend))[1:len(a) + 1]
    zero = Const(0, 1)
    init = half_init(lambda a, _: a, lambda c, d: c ^ d)
    halves = [((subtract, zero, subtract, zero), init)]
    halves += [((a[bit], zero, extended[bit], subtract), init) for bit in range(len(a))]
    return ccu2c_chain(m, halves, 0, name, model=dsp_model(platform))[1:len(a) + 1]
