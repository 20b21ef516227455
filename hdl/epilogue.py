"""The store engine's fused epilogue: the per-lane parameter table and the pipelined datapath."""
from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..isa import PARAMS_PER_INSTRUCTION, PARAMS_RESET, Epilogue, EpilogueParams, ParamsInstruction
from .dsp import registered_operands_product
from .family import fpga_family
from .pipeline import SRAM_ATTRS, pipeline_register

__all__ = ["EpilogueDatapath", "LaneParams"]


class LaneParams(wiring.Component):
    """The per-lane `EpilogueParams` in ``units`` memory banks: lane ``l`` is row ``l //
    units`` of bank ``l % units``, so the ``units`` lanes from any first lane are one row of
    each bank. Read asynchronously from a registered ``lane`` where the FPGA has LUT RAM; on an
    iCE40 (none, and flip-flops are its scarcest cells) the banks are block RAMs read at
    ``lane`` as it is registered.

    ``instr``: a PARAMS, taken (``ready``) in the cycle of its last write, one entry a cycle: 8
    cycles, or with ``broadcast`` one cycle per row of the banks. After reset the banks are
    swept to ``PARAMS_RESET`` the same way, ``clearing`` meanwhile: nothing may read them then.
    ``params``: lanes ``lane .. lane + units - 1`` (those past ``cols`` unspecified) of the
    ``lane`` of the cycle before; with ``same`` (a STORE's ``per_row``), lane ``lane``'s in
    every unit. Without ``multiplier`` the banks do not keep the
    multiplier, and ``params`` has multiplier 1. With ``shifted`` entry k is read from entry 0,
    ``shift`` asking its queue to move the entries down one after each (`store.params_shift`).
    """

    def __init__(self, cols, units, *, multiplier=True, shifted=False):
        self.cols, self.units, self.multiplier = cols, units, multiplier
        self.shifted = shifted
        super().__init__({
            "instr": In(stream.Signature(ParamsInstruction)),
            **({"shift": Out(1)} if shifted else {}),
            "clearing": Out(1, init=1),
            "lane": In(range(cols)),
            "same": In(1),
            "params": Out(EpilogueParams.size * units),
        })

    def elaborate(self, platform):
        m = Module()
        cols, units = self.cols, self.units
        select = cols > units  # units, a power of two, banks of lanes l % units; else a lane each
        rows = -(-cols // units)
        bank_bits = ceil_log2(units) if select else 0

        # Entry k of a PARAMS to lane first_lane + k; with broadcast (and in the sweep after
        # reset) entry 0 (PARAMS_RESET) to row k of every bank.
        instr = self.instr.payload
        k = Signal(range(max(rows, PARAMS_PER_INSTRUCTION)))
        every_row = self.clearing | instr.broadcast
        writing = self.clearing | self.instr.valid
        last = k == Mux(every_row, rows - 1, PARAMS_PER_INSTRUCTION - 1)
        # Entry k >= cols would go to a lane >= cols (not written): only the first cols are read.
        useful = Cat(instr.entries[e].as_value()
                     for e in range(min(cols, PARAMS_PER_INSTRUCTION)))
        entry = Signal(EpilogueParams)
        first = useful[:EpilogueParams.size]
        m.d.comb += [entry.eq(Mux(self.clearing, EpilogueParams.const(PARAMS_RESET),
                                  first if self.shifted else
                                  useful.word_select(Mux(instr.broadcast, 0, k),
                                                     EpilogueParams.size))),
                     self.instr.ready.eq(~self.clearing & last)]
        if self.shifted:
            m.d.comb += self.shift.eq(~self.clearing & self.instr.valid & ~instr.broadcast)
        m.d.sync += k.eq(Mux(writing & ~last, k + 1, 0))
        with m.If(self.clearing & last):
            m.d.sync += self.clearing.eq(0)
        # Not truncated (lanes >= cols are not written), but narrow: past `lane_bits` bits the
        # first lane is beyond every lane, and the sum of the rest with k is exact.
        lane_bits = ceil_log2(cols + PARAMS_PER_INSTRUCTION)
        beyond = instr.first_lane[lane_bits:].any()
        lane = Cat(instr.first_lane[:lane_bits] + k, beyond)

        # Reads: bank b holds lane `lane` + u for u = (b - lane) % units, in the row of `lane`
        # or the next; unit u takes bank (lane + u) % units. `read_lane`: the lane of the
        # cycle before (registered), `address_lane` the one the banks are read at.
        read_lane = Signal.like(self.lane)
        m.d.sync += read_lane.eq(self.lane)
        block_ram = fpga_family(platform) == "ice40"
        address_lane = self.lane if block_ram else read_lane
        kept = EpilogueParams if self.multiplier else _SHIFT_ONLY_PARAMS
        reset = {name: PARAMS_RESET[name] for name in kept.members}
        outputs = []
        for b in range(units):
            # (A block RAM bank reads nothing while written: `SRAM_ATTRS`.)
            bank = memory.Memory(shape=kept, depth=rows, init=[reset] * rows,
                                 attrs={"ram_style": "block", **SRAM_ATTRS} if block_ram
                                 else None)
            m.submodules[f"bank{b}"] = bank
            write = bank.write_port()
            read = bank.read_port() if block_ram else bank.read_port(domain="comb")
            if block_ram:
                m.d.comb += read.en.eq(~writing)
            if select:
                ours = (lane[:bank_bits] == b) & (lane < cols)
                m.d.comb += [write.addr.eq(Mux(every_row, k, lane[bank_bits:])),
                             read.addr.eq((address_lane >> bank_bits)
                                          + (b < address_lane[:bank_bits]))]
            else:
                ours = lane == b
            params = Signal(EpilogueParams, init=PARAMS_RESET, name=f"params{b}")
            m.d.comb += write.en.eq(writing & (every_row | ours))
            for name in kept.members:  # without the multiplier it stays PARAMS_RESET's
                m.d.comb += [getattr(write.data, name).eq(getattr(entry, name)),
                             getattr(params, name).eq(getattr(read.data, name))]
            outputs.append(params)
        banks = Cat(outputs)
        if units == 1:  # the bank's row of `lane`
            m.d.comb += self.params.eq(banks)
        elif select:  # unit u takes bank (lane + u) % units, or with same bank lane % units
            m.d.comb += self.params.eq(Cat(
                banks.word_select((read_lane + Mux(self.same, 0, u))[:bank_bits],
                                  EpilogueParams.size) for u in range(units)))
        else:  # a bank a lane: unit u is lane u, or with same lane `lane`
            mine = banks.word_select(read_lane, EpilogueParams.size)
            m.d.comb += self.params.eq(Cat(Mux(self.same, mine, outputs[u])
                                           for u in range(units)))
        return m


_SHIFT_ONLY_PARAMS = data.StructLayout({name: shape for name, shape
                                        in EpilogueParams.members.items() if name != "multiplier"})
"""What `LaneParams` keeps of a lane's `EpilogueParams` on a core without the multiplier."""


class EpilogueDatapath(wiring.Component):
    """``units`` lanes of the epilogue, a pipeline of ``latency`` stages that move every cycle.

    Stage 1 takes an accumulator value per lane (``acc``) and its `EpilogueParams`: the maximum
    with the values since ``first`` (pooling), and the parameters, registered. Stage 2 adds the
    bias. Stage 3 multiplies (registered inputs and output; on ECP5 the inputs in a MULT18X18D
    pair's own registers, `dsp.registered_operands_product`). Stage 4 shifts by the high three
    bits of the shift (by bytes), keeping a guard bit and a sticky bit, and clamps the quotient
    to what can still come back into range (`_WINDOW`; without the multiplier t fits it).
    Stage 5 shifts by the low three bits and rounds half to even; stage 6 saturates (to int8
    with ``int8``, else int32) and applies ReLU. Without ``options.requant`` the multiplier is
    1 and the shift 0. ``y``: the int32 or int8 (sign extended) results, ``latency`` cycles
    after their ``acc``. Without ``multiplier`` there is
    no stage 3 and stage 4 shifts ``t`` as it is added (the multiplier of ``params`` is
    ignored, as if 1; ``latency`` 4, not 6), and the later stages are sized for ``t``: a bias,
    shift, ReLU and pool epilogue without a DSP or LUT multiplier. Without ``pool``
    (`CoreConfig.epilogue_pool`) there is no stage 1: stage 2 adds the bias of ``params`` to
    ``acc`` in the cycle they come (``first`` is not used; ``latency`` one less).
    """

    def __init__(self, units, *, multiplier=True, pool=True):
        self.units, self.multiplier, self.pool = units, multiplier, pool
        self.latency = (6 if multiplier else 4) - (0 if pool else 1)
        super().__init__({
            "options": In(Epilogue),
            "int8": In(1),
            "first": In(1),
            "acc": In(32 * units),
            "params": In(EpilogueParams.size * units),
            "y": Out(32 * units),
        })

    def elaborate(self, platform):
        m = Module()
        # (The options and int8 hold while a STORE's steps pass.)
        scaled, relu, int8 = self.options.requant, self.options.relu, self.int8

        def stage(value, name):
            return pipeline_register(m, value, name)

        def first_stage(value, name):  # stage 1, which a core without pooling has not
            return stage(value, name) if self.pool else value

        units = self.units
        acc_in = data.View(data.ArrayLayout(signed(32), units), self.acc)
        params_in = data.View(data.ArrayLayout(EpilogueParams, units), self.params)
        y_out = data.View(data.ArrayLayout(signed(32), units), self.y)
        for u in range(units):
            acc, params = acc_in[u], params_in[u]
            # 1: pool max (the reads of a pooled step come on consecutive cycles), the
            # parameters registered: the routed 16x16's critical path ran from the accumulator
            # row and the parameters' LUT RAM through the compare and the bias add into the
            # multiplier's operands (21.2 ns).
            peak = acc
            if self.pool:
                peak = Signal(signed(32), name=f"peak{u}")  # the maximum of a pooled step so far
                m.d.sync += peak.eq(Mux(self.first | (acc > peak), acc, peak))
            bias = first_stage(Mux(self.options.bias, params.bias, 0), f"bias{u}")
            shift = first_stage(Mux(scaled, params.shift, 0), f"shift{u}")
            if self.multiplier:
                multiplier = first_stage(Mux(scaled, params.multiplier, 1), f"multiplier{u}")
            # 2: t = pooled value + bias.
            t = peak + bias
            # 3: t * multiplier, at most 50 bits; on ECP5 t and the multiplier are registered in
            # the MULT18X18D pair (the routed 8x8's critical path ran from registers of the
            # fabric into the pair, 20.6 ns). Without the multiplier t (33 bits) goes on to 4 in
            # the cycle it is added.
            if self.multiplier:
                shift = stage(shift, f"shift{u}_2")
                product = stage(registered_operands_product(m, t, multiplier, f"mult{u}",
                                                            platform), f"product{u}")
                shift = stage(shift, f"shift{u}_3")
            else:
                product = t
            # 4: twice = 2 * product, shifted right by 8 * high (the bit below the quotient is
            # the guard bit); sticky: any bit shifted out. The quotient, clamped to 39 bits:
            # after the low shift of at most 7 it still saturates int32 (and int8).
            # (Without the multiplier `twice` fits the window: no clamp.)
            twice = Cat(0, product).as_signed()
            window = min(_WINDOW, len(twice))
            high, low = shift[3:], shift[:3]
            sign = twice[-1]
            padded = Cat(twice, sign.replicate(max(8 * 7 + window - len(twice), 0)))
            shifted = Cat(padded[8 * g:8 * g + window] for g in range(8)).word_select(
                high, window)
            below = [Cat(twice[:8 * g]).any() for g in range(8)]
            sticky = Cat(below).bit_select(high, 1)
            fits = Cat(_same_bits(twice[8 * g + window - 1:])
                       if 8 * g + window - 1 < len(twice) else 1
                       for g in range(8)).bit_select(high, 1)
            clamped = Signal(signed(window), name=f"clamped{u}")  # guard bit and quotient
            m.d.comb += clamped.eq(Mux(fits, shifted.as_signed(),
                                       Mux(sign, -2**(window - 1), 2**(window - 1) - 2)))
            clamped, sticky = stage(clamped, f"clamped{u}"), stage(sticky, f"sticky{u}")
            low = stage(low, f"low{u}")
            # 5: shift right by low, round half to even.
            v = clamped >> low
            sticky = sticky | (clamped.as_unsigned() & Cat(low > b for b in range(8))).any()
            quotient = v[1:].as_signed()
            rounded = stage(quotient + (v[0] & (sticky | quotient[0])), f"rounded{u}")
            # 6: saturate (whether the bits above int8's or int32's are a sign extension, not
            # two compares as wide as the quotient), ReLU.
            sign = rounded[-1]
            fits = Mux(int8, _same_bits(rounded[7:]), _same_bits(rounded[31:]))
            saturated = Mux(sign, Mux(int8, -128, -2**31), Mux(int8, 127, 2**31 - 1))
            m.d.sync += y_out[u].eq(Mux(relu & sign, 0, Mux(fits, rounded, saturated)))
        return m


_WINDOW = 40
"""Bits of the epilogue's quotient after the high shift, its guard bit included: a 32-bit
result and 7 bits of the low shift."""


def _same_bits(value):
    """Whether all bits of ``value`` are equal (a sign extension)."""
    return (value == 0) | (value.as_unsigned() == (1 << len(value)) - 1)
