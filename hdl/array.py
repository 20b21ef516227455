"""Weight-stationary systolic array with edge skew/de-skew and double-buffered weight tiles."""
from amaranth.hdl import Cat, ClockSignal, Instance, Module, Mux, ResetSignal, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..arch import min_tile_length, skewed_cols, skewed_rows
from .family import dsp_model, fpga_family
from .pe import (ICE40_ACT_WIDTHS, ICE40_WEIGHT_WIDTH, PRODUCT_STAGES, ProcessingElement,
                 add_pe, ice40_cascade_sum, ice40_mac_operands, ice40_mac_pair, pe_outputs,
                 pe_signature, pe_weight)

__all__ = ["SystolicArray", "act_width", "activation_layout", "array_latency",
           "ice40_column_cascades", "ice40_mac_pairs", "ice40_weights_in_block",
           "lut_multiplier_pes", "min_tile_length",
           "pe_module", "pe_module_name", "psum_width", "result_layout", "weight_layout"]


def weight_layout(config):
    """One weight row W[k, 0..cols-1]."""
    return data.ArrayLayout(signed(config.data_width), config.cols)


def act_width(config):
    """With the softmax unit activations are one bit wider than weights, so they hold int8 and
    uint8 values alike (softmax probabilities are unsigned); without it they are int8 only."""
    return config.data_width + 1 if config.softmax else config.data_width


def activation_layout(config):
    """One activation vector A[m, 0..rows-1]; ``last`` ends the current weight tile."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(act_width(config)), config.rows),
        "last": 1,
    })


def psum_width(config):
    """Bits of the partial sums inside the array: a signed product takes ``data_width +
    act_width(config)`` (int8 x int9: 17, the widest is -128 x -256 = 32,768; int8 x int8: 16,
    -128 x -128 = 16,384), a column adds
    ``rows`` of them, ``ceil_log2(rows)`` bits more, and never more than ``acc_width``. The sum
    leaving a column is sign-extended to ``acc_width`` (`result_layout`), so narrowing is exact."""
    return min(config.acc_width, config.data_width + act_width(config) + ceil_log2(config.rows))


def result_layout(config):
    """One result vector C[m, 0..cols-1] = A[m, :] @ W; ``last`` marks a tile's last vector."""
    return data.StructLayout({
        "data": data.ArrayLayout(signed(config.acc_width), config.cols),
        "last": 1,
    })


def array_latency(config):
    """Cycles from an accepted activation vector to its result vector: a cycle per skewed row
    and column (`arch.skewed_rows`, `arch.skewed_cols`), and the registered product
    (`PRODUCT_STAGES`)."""
    return skewed_rows(config) + skewed_cols(config) + PRODUCT_STAGES


def lut_multiplier_pes(config):
    """(row, col) of the ``config.lut_multipliers`` PEs whose multiplier is built from LUTs: the
    last ones in column-major order, so whole columns from the right and the bottom of one more.

    Whole columns keep each column's 32-bit partial-sum chain in one kind of logic, DSP or fabric:
    only the 10-bit activation chain crosses between the DSP sites and the LUT block.
    """
    order = [(r, c) for c in range(config.cols) for r in range(config.rows)]
    return frozenset(order[len(order) - config.lut_multipliers:])


def ice40_mac_pairs(config):
    """The PEs of ``config``'s array that share each SB_MAC16, as tuples of one or two (row, col):
    the DSP PEs (not `lut_multiplier_pes`) two by two down each column, column after column, or
    with ``broadcast_activations`` along each row, row after row (a pair in one row switches
    weights in the same cycle: `ice40_weights_in_block`). ``ceil((rows * cols -
    lut_multipliers) / 2)`` blocks; the micro 4x4 takes the UP5K's 8."""
    lut_pes = lut_multiplier_pes(config)
    if config.broadcast_activations:
        order = [(r, c) for r in range(config.rows) for c in range(config.cols)]
    else:
        order = [(r, c) for c in range(config.cols) for r in range(config.rows)]
    order = [pe for pe in order if pe not in lut_pes]
    return [tuple(order[index:index + 2]) for index in range(0, len(order), 2)]


def ice40_weights_in_block(config, pair):
    """Whether the PEs of ``pair`` (`ice40_mac_pairs`) keep their active weights in their
    SB_MAC16's B register instead of the fabric's flip-flops: int8 activations (an int9's
    correction reads the weight in the fabric, `ice40_mac_operands`) and one switch for both
    (broadcast activations, one row): 8 flip-flops a PE less."""
    return (act_width(config) == ICE40_WEIGHT_WIDTH and config.broadcast_activations
            and len({r for r, _ in pair}) == 1)


def ice40_column_cascades(config, pairs):
    """{pair index: index of the pair above it} of ``pairs`` (`ice40_mac_pairs`) whose
    SB_MAC16 adds the products of the pair in the row above, of the same columns, through its
    C and D inputs (`ice40_mac_pair`'s ``cascade``): with ``adder_tree_columns`` and int8
    activations (no correction in C and D), the pairs of each odd row under those of the even
    row above. A column's adder tree then sums half as many terms (micro: 2 adders a column
    less), each read back to 17 bits (`ice40_cascade_sum`)."""
    if not config.adder_tree_columns or act_width(config) != ICE40_WEIGHT_WIDTH:
        return {}
    index = {pair: i for i, pair in enumerate(pairs)}
    cascades = {}
    for i, pair in enumerate(pairs):
        r = pair[0][0]
        above = tuple((r - 1, c) for _, c in pair)
        if r % 2 and all(row == r for row, _ in pair) and above in index:
            cascades[i] = index[above]
    return cascades


def pe_module_name(lut_multiplier, prefix="tpu"):
    """The Verilog module of the array's PEs of one kind, when the array instantiates its PEs
    as modules (see `SystolicArray`); ``prefix`` starts every module name of a design."""
    return f"{prefix}_pe_lut" if lut_multiplier else f"{prefix}_pe"


def pe_module(config, lut_multiplier):
    """The component to emit as `pe_module_name` for ``config``."""
    return ProcessingElement(config.data_width, psum_width(config), act_width(config),
                             lut_multiplier=lut_multiplier,
                             weight_prefetch=config.weight_prefetch,
                             chained=not config.adder_tree_columns,
                             weight_chain=config.weight_chain)


def _pe_instance(signature, pe, module_name):
    """An instance of Verilog module ``module_name`` with the ports of ``signature`` (a
    `pe_signature`), connected to ``pe`` (the array's side of them)."""
    ports = {f"{'i' if member.flow == In else 'o'}_{name}": getattr(pe, name)
             for name, member in signature.members.items()}
    return Instance(module_name, i_clk=ClockSignal(), i_rst=ResetSignal(), **ports)


class SystolicArray(wiring.Component):
    """``rows`` x ``cols`` weight-stationary array computing ``C = A @ W`` tile by tile.

    * ``weights``: a tile is ``rows`` transfers, W[0, :] first. It shifts into the PEs' load chain
      while the previous tile computes, then commits to their upcoming weight registers once
      the previous tile's first activation has switched every PE to its own. Without
      ``CoreConfig.weight_chain`` transfer r loads row r's active weights directly, once the
      previous tile has taken its last vector (`arch.tile_cycles`).
    * ``acts``: one activation vector per cycle; ready while a tile computes or a committed
      one waits. ``last`` ends the tile; the next vector switches the PEs to the next tile.
    * ``results``: one result vector per accepted activation, ``array_latency(config)`` cycles later, in order.
      No backpressure.

    Tiles stream back to back, one activation vector per cycle, when each tile has at least
    ``min_tile_length(config)`` vectors (the next tile shifts in and commits meanwhile).

    The PEs are logic of this module, unless the platform it is elaborated for has a true
    ``pe_modules``: then each is an instance of a Verilog module (`pe_module`), which the
    platform's user emits once (`hdl.generate.generate_verilog`). Amaranth would emit the logic
    of each of the rows x cols PEs again. Those PEs' registers see the sync reset but not a
    `ResetInserter` around the array; every result they compute is flushed through them first.
    On an iCE40 (`fpga_family`) the DSP PEs are logic of this module around SB_MAC16 instances,
    two PEs to a block (`ice40_mac_pairs`) that registers their products (`ice40_mac_pair`); on
    an ECP5 each registers its product in its MULT18X18D (`dsp.mult18x18d`). A platform with a
    true ``dsp_model`` gets the same registers and arithmetic without the instances, for the
    simulator.

    Partial sums are `psum_width` bits inside the array, sign-extended to ``acc_width`` at the
    bottom edge. Activations are signed ``act_width`` bits (int8 or uint8 from the execute
    engine); every signed 9-bit value computes exactly, on every kind of multiplier.

    With ``CoreConfig.broadcast_activations`` a row's activation reaches all of its PEs in the
    cycle it leaves the skew: no activation or switch registers between the columns, and the
    columns' results leave the bottom row together (no de-skew). With
    ``CoreConfig.adder_tree_columns`` every row takes its activation in the same cycle and
    each column adds its PEs' registered products in a tree, registering the sum: no row skew
    and no partial-sum chain. ``ahead`` is ``results.valid`` a cycle early.
    """

    def __init__(self, config):
        self.config = config
        super().__init__({
            "weights": In(stream.Signature(weight_layout(config))),
            "acts": In(stream.Signature(activation_layout(config))),
            # No backpressure: a valid-only stream (an always-ready stream.Signature has a
            # constant `ready`, which cannot be a Verilog port).
            "results": Out(wiring.Signature({"payload": Out(result_layout(config)),
                                             "valid": Out(1)})),
            "ahead": Out(1),  # ``results.valid`` of the next cycle
        })


    def elaborate(self, platform):
        m = Module()
        rows, cols = self.config.rows, self.config.cols
        width = act_width(self.config)
        chained = not self.config.adder_tree_columns  # else the columns sum in trees
        weight_chain = self.config.weight_chain

        signature = pe_signature(self.config.data_width, psum_width(self.config), width)
        pes = [[signature.flip().create(path=(f"pe_{r}_{c}",)) for c in range(cols)]
               for r in range(rows)]
        lut_pes = lut_multiplier_pes(self.config)
        instances = getattr(platform, "pe_modules", False)
        prefix = getattr(platform, "module_prefix", "tpu")
        family = fpga_family(platform)
        ice40 = family == "ice40"
        model = dsp_model(platform)
        if ice40 and (self.config.data_width != ICE40_WEIGHT_WIDTH
                      or width not in ICE40_ACT_WIDTHS):
            raise ValueError("the iCE40 array takes int8 weights and int8 or int9 activations")
        for r in range(rows):
            for c in range(cols):
                lut = (r, c) in lut_pes
                if ice40 and not lut:
                    continue  # below, two by two
                if instances and not ice40:
                    m.submodules[f"pe_{r}_{c}"] = _pe_instance(signature, pes[r][c],
                                                               pe_module_name(lut, prefix))
                else:
                    add_pe(m, pes[r][c], name=f"pe_{r}_{c}", lut_multiplier=lut,
                           ecp5=family == "ecp5", model=model,
                           weight_prefetch=self.config.weight_prefetch,
                           weight_chain=weight_chain, chained=chained)
        pairs = ice40_mac_pairs(self.config) if ice40 else []
        cascades = ice40_column_cascades(self.config, pairs)
        # Every PE on an SB_MAC16 pair along its row, taking an int8 activation in the same
        # cycle as the others (broadcast, adder tree columns): the blocks' A registers are the
        # rows' input registers (no activation is zeroed between vectors then: a result is
        # taken only with its valid).
        acts_in_blocks = (ice40 and not lut_pes and self.config.broadcast_activations
                          and not chained and width == ICE40_WEIGHT_WIDTH)
        pair_products = {}
        for index, pair in enumerate(pairs):
            in_block = ice40_weights_in_block(self.config, pair)
            halves = [ice40_mac_operands(pes[r][c].act_in,
                                         pe_weight(m, pes[r][c], name=f"pe_{r}_{c}",
                                                   prefetch=self.config.weight_prefetch,
                                                   active=not in_block, chain=weight_chain))
                      for r, c in pair]
            above = cascades.get(index)
            if above is not None:  # the row above's products come in as C and D
                halves = [(a, b, product, 0) for (a, b, _, _), (product, _)
                          in zip(halves, pair_products[above])]
            (r, c), *_ = pair
            load = pes[r][c].switch_in if weight_chain else pes[r][c].shift_en
            products = ice40_mac_pair(m, halves, name=f"mac_{index}", model=model,
                                      weight_load=load if in_block else None,
                                      cascade=above is not None, registered_a=acts_in_blocks)
            pair_products[index] = products
            for (r, c), (product, carry) in zip(pair, products):
                if index in cascades.values():  # summed in the block below
                    product = 0
                elif above is not None:  # the two products' sum
                    product = ice40_cascade_sum(product)
                # registered in the block, as an ECP5 DSP PE's (`add_pe`)
                pe_outputs(m, pes[r][c], product, carry, registered=False, chained=chained)

        # Weight loading: a shift chain from the bottom row up, a commit into the upcoming
        # registers, and a switch that travels one cycle ahead of the tile's first activation.
        # Without `weight_prefetch` the switch takes the chain's weight: a full chain is the
        # committed tile, and the next one shifts in once this one's switch has passed.
        prefetch = self.config.weight_prefetch
        loaded = Signal(range(rows + 1))
        committed = Signal()  # a tile waits in the upcoming registers (or the chain)
        takeable = Signal()   # ... and has reached every column's (a cycle after its commit)
        started = Signal()    # the current tile's first vector was taken: its weights are active
        # Cycles until the current tile's switch has passed every PE (PE(r, c) switches r + c
        # cycles after the tile's first vector is taken, r < `skewed_rows`, c < `skewed_cols`):
        # the upcoming registers (or the chain) are free again.
        skewed = skewed_cols(self.config)
        passed = skewed_rows(self.config) + skewed - 3
        switching = Signal(range(max(passed, 1)))

        push = Signal()
        commit = Signal()
        take = Signal()
        first = Signal()
        m.d.comb += [
            push.eq(self.weights.valid & self.weights.ready),
            self.acts.ready.eq(started | takeable),
            take.eq(self.acts.valid & self.acts.ready),
            first.eq(take & ~started),
        ]
        with m.If(push):
            m.d.sync += loaded.eq(loaded + 1)
        if prefetch:
            m.d.comb += [self.weights.ready.eq(loaded != rows),
                         commit.eq((loaded == rows) & ~committed & (switching == 0))]
            with m.If(commit):
                m.d.sync += [loaded.eq(0), committed.eq(1)]
            with m.If(first):
                m.d.sync += committed.eq(0)
        elif not weight_chain:
            # Row `loaded` loads into the active weights once the tile before has taken its
            # last vector (`started` falls the cycle after): that vector's products are
            # registered, with the old weights, by the time the row's weights change (with
            # broadcast activations and adder tree columns every PE takes a vector at once).
            m.d.comb += [self.weights.ready.eq((loaded != rows) & ~started),
                         committed.eq(loaded == rows)]
            with m.If(first):
                m.d.sync += loaded.eq(0)
        else:
            m.d.comb += [self.weights.ready.eq((loaded != rows) & (switching == 0)),
                         committed.eq(loaded == rows)]
            with m.If(first):
                m.d.sync += loaded.eq(0)
        with m.If(first):
            m.d.sync += switching.eq(max(passed - 1, 0))
        with m.Elif(switching != 0):
            m.d.sync += switching.eq(switching - 1)
        with m.If(take):
            m.d.sync += started.eq(~self.acts.payload.last)
        if weight_chain:
            m.d.sync += takeable.eq(committed & ~first)
        else:
            m.d.comb += takeable.eq(committed)

        # Each column takes the weight loading's control a cycle later, from registers of its
        # own: no net of the array fans out to every PE (the 16x16's commit enables and shift
        # enable were its most congested nets, `docs/DESIGN.md`). The delay is why a committed
        # tile is taken a cycle after its commit at the earliest (``takeable``). Without a
        # chain (micro's 4x4) each row loads its weights from the stream in the cycle they
        # come, its own load enable (through a kept net: yosys' abc9 failed on a block RAM
        # output straight into the SB_MAC16 B inputs), and the tile is taken the cycle after.
        column = data.StructLayout({"push": 1, "commit": 1,
                                    "weight": signed(self.config.data_width)})
        row_load = Signal(rows)
        if not weight_chain:
            m.d.comb += row_load.eq(Cat(push & (loaded == r) for r in range(rows)))
        for c in range(cols):
            control = Signal(column, name=f"load_control_{c}")
            m.d.sync += [control.push.eq(push), control.commit.eq(commit),
                         control.weight.eq(self.weights.payload[c])]
            direct = Signal(signed(self.config.data_width), name=f"load_weight_{c}",
                            attrs={"keep": 1})
            m.d.comb += direct.eq(self.weights.payload[c])
            for r in range(rows):
                pe = pes[r][c]
                chained_in = control.weight if r == rows - 1 else pes[r + 1][c].shift_out
                m.d.comb += [
                    pe.shift_en.eq(control.push if weight_chain else row_load[r]),
                    pe.commit.eq(control.commit),
                    pe.shift_in.eq(chained_in if weight_chain else direct),
                ]
        for r in range(rows):
            for c in range(cols):
                pe = pes[r][c]
                m.d.comb += pe.psum_in.eq(0 if r == 0 or not chained else pes[r - 1][c].psum_out)
                if c > 0 and self.config.broadcast_activations:  # the row's, from the skew
                    m.d.comb += [pe.act_in.eq(pes[r][0].act_in),
                                 pe.switch_in.eq(pes[r][0].switch_in)]
                elif c > 0:
                    m.d.comb += [pe.act_in.eq(pes[r][c - 1].act_out),
                                 pe.switch_in.eq(pes[r][c - 1].switch_out)]

        # Input register, then row r delayed by r more cycles (skew; none with adder tree
        # columns); row r's switch by as many: it reaches each PE a cycle before the tile's
        # first activation.
        for r in range(rows):
            act = Signal(signed(width), name=f"skew_{r}_0",
                         attrs={"keep": 1} if acts_in_blocks else {})
            if acts_in_blocks:  # registered in the blocks (a kept net, as the weights')
                m.d.comb += act.eq(self.acts.payload.data[r])
            else:
                m.d.sync += act.eq(Mux(take, self.acts.payload.data[r], 0))
            switch = first
            for stage in range(1, (r if chained else 0) + 1):
                act_next = Signal(signed(width), name=f"skew_{r}_{stage}")
                switch_next = Signal(name=f"skew_switch_{r}_{stage}")
                m.d.sync += [act_next.eq(act), switch_next.eq(switch)]
                act, switch = act_next, switch_next
            m.d.comb += [pes[r][0].act_in.eq(act), pes[r][0].switch_in.eq(switch)]

        # Column c leaves the bottom row c cycles after column 0 (c < `skewed_cols`): delay it
        # by skewed_cols - 1 - c (de-skew), still `psum_width` bits, then sign-extend it to
        # acc_width (.eq of a signed value). Every PE registers its product (`PRODUCT_STAGES`;
        # a DSP PE on iCE40 and ECP5 in its block), so no column takes more (flip-flops are the
        # UP5K's scarcest cells).
        # With adder tree columns, each column's products (`pe_outputs`) are summed pairwise
        # and the sum registered: the register a row of a chain would have.
        for c in range(cols):
            if chained:
                psum = pes[rows - 1][c].psum_out
            else:
                psum = Signal(signed(psum_width(self.config)), name=f"column_{c}")
                m.d.sync += psum.eq(_pairwise_sum(m, [pes[r][c].psum_out for r in range(rows)],
                                                  len(psum), f"column_{c}"))
            for stage in range(max(skewed - 1 - c, 0)):
                psum_next = Signal(signed(psum_width(self.config)), name=f"deskew_{c}_{stage}")
                m.d.sync += psum_next.eq(psum)
                psum = psum_next
            m.d.comb += self.results.payload.data[c].eq(psum)

        # valid/last travel alongside: results appear `latency` cycles after `take`.
        valid, last = take, take & self.acts.payload.last
        for stage in range(array_latency(self.config)):
            valid_next = Signal(name=f"valid_{stage}")
            last_next = Signal(name=f"last_{stage}")
            m.d.sync += [valid_next.eq(valid), last_next.eq(last)]
            m.d.comb += self.ahead.eq(valid)
            valid, last = valid_next, last_next
        m.d.comb += [self.results.valid.eq(valid), self.results.payload.last.eq(last)]
        return m


def _pairwise_sum(m, terms, width, name):
    """The sum of ``terms`` (signed) in a balanced tree of ``width``-bit adders, each its own
    signal (driven in ``m``)."""
    level = 0
    while len(terms) > 1:
        sums = []
        for index in range(0, len(terms) - 1, 2):
            total = Signal(signed(width), name=f"{name}_sum{level}_{index // 2}")
            m.d.comb += total.eq(terms[index] + terms[index + 1])
            sums.append(total)
        terms = sums + terms[2 * len(sums):]
        level += 1
    return terms[0]
