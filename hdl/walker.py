"""Shared DMA building blocks: descriptor checks, the tile walker and the burst planner."""
from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..isa import (ADDRESS_WIDTHS, DIMS, NUM_WINDOWS, ErrorCode, Im2colDescriptor,
                   TensorDescriptor, window_layout)
from .family import fpga_family
from .pipeline import SkidBuffer, StreamRegister

__all__ = ["TileCheck", "TileWalker", "Im2colWalker", "ElementStage", "BurstPlanner", "POOLING",
           "PERMISSIONS", "window_ok",
           "checked_element_layout", "element_layout", "im2col_walker_signature",
           "walker_signature", "step_layout", "burst_layout", "move_units", "select_units",
           "unit_move"]

POOLING = data.StructLayout({"enable": 1, "pitch": 16})
"""2x2 max pooling of a tile (a STORE's ``Epilogue.pool`` and ``pool_pitch``): tile element
(i0, i1, i2) is made of the rows from ``sram_row + 2 * i1 + 2 * pitch * i2`` on."""


def _check_beat_bytes(beat_bytes):
    if beat_bytes not in (4, 8, 16):
        raise ValueError(f"beat_bytes={beat_bytes!r} is invalid: allowed 4, 8 or 16")


PERMISSIONS = ("read", "write", "either")
"""What an `ElementStage` and a `BurstPlanner` check the windows for: reads, writes, or either
(a DMA front shared by the load and store engines, `CoreConfig.shared_dma`), chosen by their
``write`` input."""


def _check_address_width(value):
    _check_int("address_width", value, ADDRESS_WIDTHS.start, ADDRESS_WIDTHS.stop - 1)


def _check_permission(permission):
    if permission not in PERMISSIONS:
        raise ValueError(f'permission={permission!r} is invalid: allowed "read", "write" or '
                         f'"either"')


def _permission_members(permission):
    """The ``write`` input of a component that checks ``permission`` "either"."""
    return {"write": In(1)} if permission == "either" else {}


def _permission_of(component):
    """What ``component`` checks in this cycle: its permission's name, or its ``write`` input."""
    return component.write if component.permission == "either" else component.permission


def _writes(component):
    """Whether ``component`` checks for writes in this cycle (a constant unless "either")."""
    return component.write if component.permission == "either" else component.permission == "write"


def _check_int(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} is invalid: allowed an integer in {low}..{high}")


def _elem_log2s(value):
    """``elem_log2`` (one element size or a tuple of them) as a tuple, checked."""
    values = value if isinstance(value, tuple) else (value,)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 3
                             for v in values):
        raise ValueError(f"elem_log2={value!r} is invalid: allowed an integer in 0..3 or a "
                         f"non-empty tuple of them")
    return values


def _elem_log2(desc, elem_log2s):
    """The descriptor's element size, a constant when only one is allowed."""
    return desc.elem_log2 if len(elem_log2s) > 1 else elem_log2s[0]


def _check_dims(dims):
    _check_int("dims", dims, 2, DIMS)
    return dims


def _members(signature, pool, held):
    """``signature``'s members, plus ``pool`` (sampled with the descriptor) if asked for, and
    with ``held`` the ``held`` descriptor (and ``held_pool``): what the component works on after
    taking a descriptor, kept by an engine's register until the work ends (no copy is kept in
    the component)."""
    if not isinstance(held, bool):
        raise ValueError(f"held={held!r} is invalid: allowed True or False")
    return {**signature.members, **({"pool": In(POOLING)} if pool else {}),
            **({"held": In(TensorDescriptor)} if held else {}),
            **({"held_pool": In(POOLING)} if held and pool else {})}


def _pool_input(component):
    """The component's ``pool`` input, or pooling disabled if it has none."""
    if "pool" in component.signature.members:
        return component.pool
    return POOLING(Const(0, POOLING.size))


def _taken(component, desc_in, pool_in):
    """The descriptor and pooling ``component`` works on after taking them: its ``held``
    inputs, or registers of its own, which the returned statements load with ``desc_in`` and
    ``pool_in``."""
    members = component.signature.members
    desc = component.held if "held" in members else Signal(TensorDescriptor, name="desc")
    pool = component.held_pool if "held_pool" in members else Signal(POOLING, name="pool")
    return desc, pool, [*([] if "held" in members else [desc.eq(desc_in)]),
                        *([] if "held_pool" in members else [pool.eq(pool_in)])]


def walker_signature(descriptor_layout, lanes, rows, address_width=32):
    """What a walker shows the engine: a descriptor in, elements (or steps) out, and abort."""
    return wiring.Signature({
        "descriptor": In(stream.Signature(descriptor_layout)),
        "elements": Out(stream.Signature(element_layout(lanes, rows, address_width))),
        "abort": In(1),
    })


def im2col_walker_signature(lanes, rows, address_width=32):
    """An `Im2colWalker`'s: a walker's, with the ``held`` descriptor it works on."""
    return wiring.Signature({**walker_signature(Im2colDescriptor, lanes, rows,
                                                address_width).members,
                             "held": In(Im2colDescriptor)})


def element_layout(lanes, rows, address_width=32):
    """One step of a walk: ``count`` consecutive lanes of a row, all in bounds or all padding,
    with the address (``address_width`` bits, `CoreConfig.address_width`) and SRAM position of
    the first."""
    return data.StructLayout({
        "in_bounds": 1,   # inside the tensor (else padding)
        "addr": address_width,
        "lane": range(lanes),
        "count": range(1, lanes + 1),
        "row": range(rows),
        "last_in_row": 1,
        "last": 1,
    })


def checked_element_layout(lanes, rows, address_width=32):
    """An element of `element_layout` (the same fields at the same offsets), whether its bus
    beat lies in a window with the permission the `ElementStage` checked, and how its beat
    follows the element's before it: the same beat, or the next one in the same 4 KiB page."""
    return data.StructLayout({**element_layout(lanes, rows, address_width).members, "in_window": 1,
                              "same_beat": 1, "next_beat": 1})


def step_layout(lanes, rows, beat_bytes):
    """One step of a planned walk: where its bytes sit in the bus beats of the bursts."""
    return data.StructLayout({
        "in_bounds": 1,
        "lane": range(lanes),
        "count": range(1, lanes + 1),
        "row": range(rows),
        "last_in_row": 1,
        "last": 1,
        "offset": range(beat_bytes),  # byte offset of the first lane in its beat
        "end_of_beat": 1,             # last step using its beat (in bounds only)
        "end_of_burst": 1,            # ... and the last beat of its burst
    })


def burst_layout(address_width=32):
    """An INCR burst of ``len + 1`` beats starting at the beat-aligned ``addr``."""
    return data.StructLayout({"addr": address_width, "len": 8})


class TileCheck(wiring.Component):
    """Checks a descriptor before any memory is touched; ``result`` is NONE or the error.

    The element size must be ``elem_log2`` (or one of a tuple of them), the address and the
    walked strides multiples of it (else MISALIGNED), and ``lane + e0`` at
    most ``max_extent0`` (the lanes of a row). The tile's rows,
    ``e1 * e2 * e3`` from ``sram_row`` on, must fit ``rows``. With ``pool`` enabled (an input
    sampled with the descriptor, there when built with ``pool=True``) ``e3`` must be 1 and the
    pitch non-zero, and the rows read, ``pitch * (2 * e2 - 1) + 2 * e1`` from ``sram_row`` on,
    must fit. The products are formed by two shift-add loops (one cycle per significant bit of
    the multipliers), saturating at the power of two above ``rows``; with ``dims`` 2 there are
    none (one adder, the verdict two cycles after the descriptor). A walker of ``dims``
    dimensions (2..4) needs every dim from ``dims`` on to have extent 1 (else BAD_EXTENT);
    their strides are not checked. With ``held`` the descriptor (and pooling)
    taken stay on the ``held`` (and ``held_pool``) inputs until the result is taken: no copy
    is kept here.
    """

    def __init__(self, max_extent0, rows, elem_log2, pool=False, dims=DIMS, held=False):
        _check_int("max_extent0", max_extent0, 1, 65535)
        _check_int("rows", rows, 1, 65536)
        self.max_extent0, self.rows, self.dims = max_extent0, rows, _check_dims(dims)
        self.elem_log2s = _elem_log2s(elem_log2)
        super().__init__(_members(wiring.Signature({
            "descriptor": In(stream.Signature(TensorDescriptor)),
            "result": Out(stream.Signature(ErrorCode)),
        }), pool, held))

    def elaborate(self, platform):
        m = Module()
        # The products saturate at a power of two above ``rows``: exact up to it, the verdict
        # (``sram_row + product > rows``) the same.
        sat = 1 << ceil_log2(self.rows + 1)
        d, p = self.descriptor.payload, _pool_input(self)
        desc, pool, take = _taken(self, d, p)
        acc = Signal(range(sat + 1))

        def saturated(value):
            return Mux(value > sat, sat, value)

        dims, walked = desc.dims, range(self.dims)

        def extent(source, d):
            """Dim ``d``'s extent in the products: 1 past the walked dims (else BAD_EXTENT)."""
            return source.dims[d].extent if d in walked else 1

        elem_log2 = _elem_log2(desc, self.elem_log2s)
        mask = Cat(elem_log2 > b for b in range(3))  # the address bits below the element size
        code = Signal(ErrorCode)
        with m.If(~Cat(desc.elem_log2 == v for v in self.elem_log2s).any()):
            m.d.comb += code.eq(ErrorCode.BAD_ELEMENT)
        with m.Elif(Cat(dims[d].extent == 0 for d in walked).any() |
                    Cat(dims[d].extent != 1 for d in range(self.dims, DIMS)).any() |
                    (desc.lane + dims[0].extent > self.max_extent0) |
                    (pool.enable & ((extent(desc, 3) != 1) | (pool.pitch == 0)))):
            m.d.comb += code.eq(ErrorCode.BAD_EXTENT)
        with m.Elif(desc.sram_row + acc > self.rows):
            m.d.comb += code.eq(ErrorCode.SRAM_RANGE)
        with m.Elif(Cat((value[:3] & mask).any()
                        for value in [desc.address, *(dims[d].stride for d in walked)]).any()):
            m.d.comb += code.eq(ErrorCode.MISALIGNED)

        with m.If(self.result.ready):
            m.d.sync += self.result.valid.eq(0)
        if self.dims == 2:
            # e2 and e3 are 1 (else BAD_EXTENT): the rows are e1, or pooled 2 * e1 + pitch,
            # one adder, the verdict the next cycle.
            with m.FSM():
                with m.State("IDLE"):
                    m.d.comb += self.descriptor.ready.eq(1)
                    with m.If(self.descriptor.valid):
                        e1 = d.dims[1].extent
                        m.d.sync += [*take, acc.eq(saturated(
                            Mux(p.enable, Cat(0, e1) + p.pitch, e1)))]
                        m.next = "CHECK"
                with m.State("CHECK"):
                    m.d.sync += [self.result.valid.eq(1), self.result.payload.eq(code)]
                    m.next = "RESULT"
                with m.State("RESULT"):
                    with m.If(self.result.ready):
                        m.next = "IDLE"
            return m

        x = Signal(range(sat + 1))
        y = Signal(17)

        def shift_add():
            acc_next = acc + Mux(y[0], x, 0)
            m.d.sync += [acc.eq(Mux(acc_next > sat, sat, acc_next)),
                         x.eq(Mux(x >= sat // 2, sat, x << 1)), y.eq(y >> 1)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.descriptor.ready.eq(1)
                with m.If(self.descriptor.valid):
                    m.d.sync += [*take, acc.eq(0),
                                 x.eq(saturated(Mux(p.enable, p.pitch, d.dims[1].extent))),
                                 y.eq(Mux(p.enable, (extent(d, 2) << 1) - 1, extent(d, 2)))]
                    m.next = "E1E2"
            with m.State("E1E2"):
                with m.If(y == 0):
                    m.d.sync += [x.eq(acc), y.eq(extent(desc, 3)),
                                 acc.eq(Mux(pool.enable, saturated(dims[1].extent << 1), 0))]
                    m.next = "E3"
                with m.Else():
                    shift_add()
            with m.State("E3"):
                with m.If(y == 0):
                    m.d.sync += [self.result.valid.eq(1), self.result.payload.eq(code)]
                    m.next = "RESULT"
                with m.Else():
                    shift_add()
            with m.State("RESULT"):
                with m.If(self.result.ready):
                    m.next = "IDLE"
        return m


class TileWalker(wiring.Component):
    """Walks a descriptor a row segment at a time, dim 0 fastest (see ``TensorDescriptor``): an
    affine loop nest, with no multiplier and no coordinates (VTA's ``TensorDataCtrl``).

    A descriptor is accepted when idle and walked from the next cycle, one step per cycle. Each
    walked dim d keeps its index i_d and the address a_d of element (0, .., 0, i_d, ..): the dim
    that advances (the innermost one not at its last index) adds its stride to its a_d in one
    ``address_width``-bit adder (modulo ``2**address_width``, `CoreConfig.address_width`) and
    copies the sum to the dims inside it, whose indices restart
    at 0. An element is in bounds when ``lo_d <= i_d < hi_d`` for every walked d (compares as
    narrow as the indices, lo and hi clipped to them when the descriptor is taken) and every dim
    past them has ``lo`` 0 and ``hi`` above 0 (checked when
    the descriptor is taken). Element ``i0`` is lane ``lane + i0`` of its row. A step is one
    element or, when the dim-0 stride is the element size (``1 << elem_log2`` bytes), the
    longest run of lanes that are all padding or all in bounds and inside one ``beat_bytes`` bus
    beat. With ``pool`` enabled (an input sampled with the descriptor, there when built with
    ``pool=True``) the row of element (i0, i1, i2) is ``sram_row + 2 * i1 + 2 * pitch * i2``,
    the first of its 2x2 window. ``elem_log2`` is the element size or a tuple of those allowed;
    the descriptor must pass a ``TileCheck`` with the same ``elem_log2``, ``pool`` and ``dims``,
    so dim 0 spans at most ``lanes`` and each other dim at most ``rows``: the indices are that
    wide. ``abort`` returns to idle at once. With ``held`` the descriptor (and pooling) taken
    stay on the ``held`` (and ``held_pool``) inputs until the walk ends: no copy is kept here.
    """

    def __init__(self, lanes, rows, elem_log2, beat_bytes, pool=False, dims=DIMS, held=False,
                 address_width=32):
        _check_int("lanes", lanes, 1, 65535)
        _check_int("rows", rows, 1, 65536)
        _check_address_width(address_width)
        self.dims = _check_dims(dims)
        self.lanes, self.rows, self.elem_log2s = lanes, rows, _elem_log2s(elem_log2)
        if beat_bytes not in (4, 8, 16) or beat_bytes < 1 << max(self.elem_log2s):
            raise ValueError(f"beat_bytes={beat_bytes!r} is invalid: allowed 4, 8 or 16, at least "
                             f"the element size")
        self.beat_bytes = beat_bytes
        self.address_width = address_width
        super().__init__(_members(walker_signature(TensorDescriptor, lanes, rows, address_width),
                                  pool, held))

    def elaborate(self, platform):
        m = Module()
        desc, pool, take = _taken(self, self.descriptor.payload, _pool_input(self))
        dims, walked = desc.dims, self.dims
        spans = [self.lanes] + [self.rows] * (walked - 1)  # the largest extent of each dim
        widths = [ceil_log2(span + 1) for span in spans]

        def narrow(value, d):
            """``value`` (16 bits) clipped to ``2**width - 1``: an index of dim d (at most
            ``span - 1 <= 2**width - 2``) compares with it as with ``value``."""
            width = widths[d]
            return Mux(value[width:].any(), 2**width - 1, value[:width])

        extent = [dims[d].extent[:widths[d]] for d in range(walked)]
        # The in-bounds ranges, narrowed when the descriptor is taken (off the step's path).
        lo = [Signal(widths[d], name=f"lo{d}") for d in range(walked)]
        hi = [Signal(widths[d], name=f"hi{d}") for d in range(walked)]
        index = [Signal(range(spans[d]), name=f"i{d}") for d in range(walked)]
        addr = [Signal(self.address_width, name=f"a{d}") for d in range(walked)]
        empty = Signal()  # a dim past the walked ones is padding: so is every element
        row = Signal(range(self.rows))
        pool_row = Signal(range(self.rows))  # pooling: the row at i1 = 0

        # The step: lanes up to the end of the row, the padding / in-bounds edge and the beat.
        elem_log2 = _elem_log2(desc, self.elem_log2s)
        # Whether a step may take several lanes: the dim-0 stride is the element size, a
        # register set when the descriptor is taken (the routed UP5K's critical path ran from
        # the descriptor through that compare and the run into the dim-0 address, 47.4 ns).
        contiguous = Signal()
        # Whether index d (d >= 1) is in bounds, a register set as the index is (off the step's
        # path: the load walker's critical path ran through these compares, 14.6 ns at 8x8).
        inside = {d: Signal(name=f"inside{d}") for d in range(1, walked)}
        # Whether index d (d >= 1) is its dim's last, a register as well; and dim 0's edges
        # against its extent, set when the descriptor is taken.
        ends = {d: Signal(name=f"end{d}") for d in range(1, walked)}
        hi_covers, lo_covers, lo_below_hi = Signal(), Signal(), Signal()
        outer = ~empty & Cat(*inside.values()).all()
        # Dim 0's lanes from its index to lo, to hi (<= 0 past them) and to the row's end,
        # registers stepped with the index: no subtraction on the way from the index to the
        # run and the address it steps (the store walker's step was the routed 8x8's critical
        # path, 16.2 ns).
        to_lo = Signal(signed(widths[0] + 1))
        to_hi = Signal(signed(widths[0] + 1))
        rest = Signal(range(self.lanes + 1))
        before = to_lo > 0
        in_bounds = outer & ~before & (to_hi > 0)
        beat_rest = Signal(range(self.beat_bytes + 1))
        m.d.comb += beat_rest.eq(
            (self.beat_bytes - addr[0][:ceil_log2(self.beat_bytes)]) >> elem_log2)
        # The run: lanes to the next edge (the beat's end, hi, lo or the row's end).
        run = Signal(range(max(2**widths[0], self.beat_bytes) + 1))
        padding_to_lo = outer & before & lo_below_hi  # padding up to in-bounds lanes
        with m.If(~contiguous):
            m.d.comb += run.eq(1)
        with m.Elif(in_bounds):  # to_hi > 0 here and to_lo > 0 below: no sign bit to keep
            m.d.comb += run.eq(Mux(to_hi[:-1] < beat_rest, to_hi[:-1], beat_rest))
        with m.Elif(padding_to_lo):
            m.d.comb += run.eq(to_lo[:-1])
        with m.Else():
            m.d.comb += run.eq(rest)
        # The step ends the row when the run reaches its end (then it is the rest of the row):
        # run >= rest tested edge by edge, not on the run (the walkers' critical path ran
        # through the run into that compare and on to the outer indices, 14.9 ns at 8x8).
        last = Signal(walked)
        count = Signal(range(1, self.lanes + 1))
        m.d.comb += [
            last[0].eq(Mux(~contiguous, rest == 1,
                           Mux(in_bounds, hi_covers & (beat_rest >= rest),
                               Mux(padding_to_lo, lo_covers, 1)))),
            last[1:].eq(Cat(*ends.values())),
            count.eq(Mux(last[0], rest, run)),
        ]

        following = [Signal(range(spans[d] + 1), name=f"i{d}_next")  # i_d after a step
                     for d in range(walked)]
        m.d.comb += [following[0].eq(index[0] + count),
                     *(following[d].eq(index[d] + 1) for d in range(1, walked))]
        out = self.elements.payload
        m.d.comb += [
            out.in_bounds.eq(in_bounds),
            out.addr.eq(addr[0]),
            out.lane.eq(desc.lane + index[0]),
            out.count.eq(count),
            out.row.eq(row),
            out.last_in_row.eq(last[0]),
            out.last.eq(last.all()),
        ]

        # Each dim's next address, side by side (dim 0's by the run, the step's count when it
        # does not end the row): the step picks the one of the dim that advances, after the
        # adders rather than before one shared adder (that choice waits for the run's end test:
        # the ECP5 8x8 walker's critical path, 16.4 ns).
        stepped = [Signal(self.address_width, name=f"a{d}_next") for d in range(walked)]
        m.d.comb += [stepped[0].eq(addr[0] + Mux(contiguous, run << elem_log2, dims[0].stride)),
                     *(stepped[d].eq(addr[d] + dims[d].stride) for d in range(1, walked))]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.descriptor.ready.eq(1)
                with m.If(self.descriptor.valid):
                    d = self.descriptor.payload
                    first_extent = d.dims[0].extent[:widths[0]]
                    first_lo, first_hi = narrow(d.dims[0].lo, 0), narrow(d.dims[0].hi, 0)
                    m.d.sync += [*take, row.eq(d.sram_row), pool_row.eq(d.sram_row),
                                 *(a.eq(d.address) for a in addr),
                                 *(i.eq(0) for i in index),
                                 to_lo.eq(first_lo), to_hi.eq(first_hi), rest.eq(first_extent),
                                 *(r.eq(narrow(d.dims[k].lo, k)) for k, r in enumerate(lo)),
                                 *(r.eq(narrow(d.dims[k].hi, k)) for k, r in enumerate(hi)),
                                 *(f.eq(_starts_inside(d.dims[k].lo, d.dims[k].hi))
                                   for k, f in inside.items()),
                                 *(f.eq(d.dims[k].extent[:widths[k]] == 1)
                                   for k, f in ends.items()),
                                 contiguous.eq(d.dims[0].stride == Const(1, 4)
                                               << _elem_log2(d, self.elem_log2s)),
                                 hi_covers.eq(first_hi >= first_extent),
                                 lo_covers.eq(first_lo >= first_extent),
                                 lo_below_hi.eq(first_lo < first_hi),
                                 empty.eq(~Cat(_starts_inside(d.dims[k].lo, d.dims[k].hi)
                                               for k in range(walked, DIMS)).all())]
                    m.next = "WALK"
            with m.State("WALK"):
                m.d.comb += self.elements.valid.eq(1)
                with m.If(self.elements.ready):
                    # The dim that advances: dim 0 by the step's lanes (count is 1 unless
                    # contiguous), the others by one, restarting the dims inside it.
                    for d in range(walked):
                        with (m.If if d == 0 else m.Elif)(~last[d]):
                            m.d.sync += index[d].eq(following[d])
                            if d == 0:
                                m.d.sync += [to_lo.eq(to_lo - count), to_hi.eq(to_hi - count),
                                             rest.eq(rest - count)]
                            else:
                                m.d.sync += [to_lo.eq(lo[0]), to_hi.eq(hi[0]),
                                             rest.eq(extent[0])]
                            if d:
                                m.d.sync += [inside[d].eq((lo[d] <= following[d])
                                                          & (following[d] < hi[d])),
                                             ends[d].eq(following[d] + 1 == extent[d])]
                            m.d.sync += [a.eq(stepped[d]) for a in addr[:d + 1]]
                            m.d.sync += [i.eq(0) for i in index[:d]]
                            m.d.sync += [inside[k].eq(_starts_inside(lo[k], hi[k]))
                                         for k in range(1, d)]
                            m.d.sync += [ends[k].eq(extent[k] == 1) for k in range(1, d)]
                            if d == 1:
                                m.d.sync += row.eq(row + Mux(pool.enable, 2, 1))
                            elif d:
                                below = pool_row + (pool.pitch << 1)
                                m.d.sync += [row.eq(Mux(pool.enable, below, row + 1)),
                                             pool_row.eq(below)]
                    with m.Else():
                        m.next = "IDLE"
                with m.If(self.abort):
                    m.next = "IDLE"
        return m


def _starts_inside(lo, hi):
    """Index 0 of a dim is in its in-bounds range ``[lo, hi)``."""
    return (lo == 0) & (hi != 0)


def _sum(m, a, b, subtract=0, name="sum"):
    """``a + b`` (or ``a - b``) modulo 2**32, one adder with a carry-in (a helper signal driven
    in ``m``)."""
    total = Signal(34, name=name)  # [1:33]: the sum, a carry-in through bit 0
    flip = Const(subtract, 1) if isinstance(subtract, int) else subtract
    m.d.comb += total.eq(Cat(flip, a[:32]) + Cat(flip, b[:32] ^ flip.replicate(32)))
    return total[1:33]


class Im2colWalker(wiring.Component):
    """Walks an ``Im2colDescriptor`` element by element (steps of one lane), lanes fastest.

    Setup forms the step sizes, the start coordinates and the start offsets as a sequence of
    products through one shift-add adder, one cycle per significant bit of each multiplier (the
    stride, dilation and padding, then the start coordinates; at least one cycle each). Then
    one element per cycle, from registers: mixed-radix counters for the pixel (n, p, q) of the
    row and the kernel position (c, r, s) of the lane, each digit carrying its coordinate and
    its byte offset (modulo ``2**address_width``, as every DMA address), advance by additions
    only.
    The descriptor must have rows, lanes, kernel sizes and stride >= 1
    and its rows must fit ``rows``. ``abort`` returns to idle at once. The descriptor taken
    stays on the ``held`` input until the walk ends (the load engine's instruction register):
    no copy is kept here.
    """

    def __init__(self, lanes, rows, address_width=32):
        _check_int("lanes", lanes, 1, 65535)
        _check_int("rows", rows, 1, 65536)
        _check_address_width(address_width)
        self.lanes, self.rows, self.address_width = lanes, rows, address_width
        super().__init__(im2col_walker_signature(lanes, rows, address_width))

    def elaborate(self, platform):
        m = Module()
        desc = self.held

        # Step sizes: coordinate steps times byte strides; like every byte offset, only ever
        # added, so as wide as an address (modulo 2**address_width).
        offset = self.address_width
        csw, csh, dsw, dsh = (Signal(offset, name=n) for n in ("csw", "csh", "dsw", "dsh"))
        # Pixel digits: counter, coordinate contribution (h = hp + hr, w = wq + ws), and the
        # offset with the inner digits at 0 (ro_p: q = 0, ro_n: p = q = 0) or as they are (ro).
        i, q, p, n = (Signal(width, name=name) for width, name in
                      ((16, "i"), (16, "q"), (16, "p"), (17, "n")))
        hp, wq = Signal(signed(26), name="hp"), Signal(signed(26), name="wq")
        ro, ro_p, ro_n = (Signal(offset, name=name) for name in ("ro", "ro_p", "ro_n"))
        row = Signal(range(self.rows))
        # Kernel digits likewise (lane offsets: lo, lo_r at s = 0, lo_c at r = s = 0), and
        # their values at the first lane of a row.
        j, s, r, c = (Signal(width, name=name) for width, name in
                      ((16, "j"), (8, "s"), (8, "r"), (17, "c")))
        ws, hr, ws0, hr0 = (Signal(16, name=name) for name in ("ws", "hr", "ws0", "hr0"))
        lo, lo_r, lo_c, lo0, lo_r0, lo_c0 = (
            Signal(offset, name=name) for name in ("lo", "lo_r", "lo_c", "lo0", "lo_r0", "lo_c0"))

        # Setup: target = start + multiplier * multiplicand (or minus it), a product at a time;
        # a start of None goes on from the product before.
        def products(source):
            """(target, multiplier, multiplicand, start, subtract) of each product, with the
            descriptor fields of ``source``."""
            return [
                (csw, source.conv_stride, source.stride_w, 0, 0),
                (csh, source.conv_stride, source.stride_h, 0, 0),
                (dsw, source.dilation, source.stride_w, 0, 0),
                (dsh, source.dilation, source.stride_h, 0, 0),
                (hp, source.conv_stride, source.p0, -source.padding, 0),
                (wq, source.conv_stride, source.q0, -source.padding, 0),
                (hr0, source.dilation, source.r0, 0, 0),
                (ws0, source.dilation, source.s0, 0, 0),
                (None, source.padding, source.stride_h, source.base, 1),
                (None, source.padding, source.stride_w, None, 1),
                (ro_n, source.n0, source.stride_n, None, 0),  # base - padding * (sh + sw) + ..
                (ro_p, source.p0, csh, None, 0),
                (ro, source.q0, csw, None, 0),
                (lo_c0, source.c0, source.stride_c, 0, 0),
                (lo_r0, source.r0, dsh, None, 0),
                (lo0, source.s0, dsw, None, 0),
            ]

        count = len(products(desc))
        product = Signal(range(count))
        multiplier = Signal(16)        # its bits still to add
        # Whether the bit being added is the product's last (multiplier[1:] == 0), a register
        # set with the multiplier: the zero test on the way to the products' enables was the
        # routed 8x8's critical path at one placement (18.4 ns).
        last_bit = Signal()
        multiplicand = Signal(32)  # shifted left once per bit
        subtract = Signal()
        acc = Signal(32)
        acc_next = _sum(m, acc, Mux(multiplier[0], multiplicand, 0), subtract, "acc_next")

        def start_product(k, source):
            """Load product ``k`` with the fields of descriptor ``source``."""
            _, y, x, start, minus = products(source)[k]
            return [multiplier.eq(y), last_bit.eq(y[1:] == 0), subtract.eq(minus),
                    multiplicand.eq(x),
                    acc.eq(acc_next if start is None else start)]

        h = hp + hr
        w = wq + ws
        in_bounds = ((n < desc.batch) & (c < desc.channels) & (h >= 0) & (h < desc.height) &
                     (w >= 0) & (w < desc.width))
        addr = Signal(offset)
        m.d.comb += addr.eq(ro + lo)
        # Whether j, i and each limited digit is at its last value: registers set with their
        # counters, so no compare with the held instruction's fields is on the way from the
        # counters to their clock enables (the routed 8x8's critical path ran from the
        # instruction through ``j == lanes - 1`` into them, 18.4 ns).
        j_last, i_last, s_last, r_last, q_last, p_last = (
            Signal(name=f"{name}_last") for name in ("j", "i", "s", "r", "q", "p"))
        last_in_row = j_last
        last = j_last & i_last
        pending = Signal()  # the counters hold an element not yet in the output register
        load = pending & (~self.elements.valid | self.elements.ready)

        with m.If(self.elements.ready):
            m.d.sync += self.elements.valid.eq(0)
        with m.If(load):
            out = self.elements.payload
            m.d.sync += [
                self.elements.valid.eq(1),
                out.in_bounds.eq(in_bounds),
                out.addr.eq(addr),
                out.lane.eq(j),
                out.count.eq(1),
                out.row.eq(row),
                out.last_in_row.eq(last_in_row),
                out.last.eq(last),
                pending.eq(~last),
            ]

        def stop_on_abort():
            with m.If(self.abort):
                m.next = "IDLE"

        def first_lane():
            return [j.eq(0), s.eq(desc.s0), r.eq(desc.r0), c.eq(desc.c0), ws.eq(ws0),
                    hr.eq(hr0), lo.eq(lo0), lo_r.eq(lo_r0), lo_c.eq(lo_c0),
                    j_last.eq(desc.lanes == 1), s_last.eq(desc.s0 + 1 >= desc.kernel_w),
                    r_last.eq(desc.r0 + 1 >= desc.kernel_h)]

        def advance(digits):
            """Steps mixed-radix ``digits`` (innermost first): (counter, its limit (None: the
            last digit), whether it is at its last value (a register kept here), coordinate or
            None, its step, its value at counter 0, offsets (the digit's own, then those of the
            digits inside it), the offset's step)."""
            counter, limit, at_last, coordinate, by, first, offsets, offset_by = digits[0]

            def step():
                following = _sum(m, offsets[0], offset_by, name=f"{offsets[0].name}_next")
                m.d.sync += [counter.eq(counter + 1), *(o.eq(following) for o in offsets)]
                if coordinate is not None:
                    m.d.sync += coordinate.eq(coordinate + by)
                if at_last is not None:  # counter + 1 < limit here: >= is ==
                    m.d.sync += at_last.eq(counter + 2 == limit)

            if limit is None:
                step()
                return
            with m.If(~at_last):
                step()
            with m.Else():
                m.d.sync += [counter.eq(0), coordinate.eq(first), at_last.eq(limit <= 1)]
                advance(digits[1:])

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.descriptor.ready.eq(1)
                d = self.descriptor.payload
                with m.If(self.descriptor.valid):
                    m.d.sync += [i.eq(0), q.eq(d.q0), p.eq(d.p0), n.eq(d.n0),
                                 i_last.eq(d.rows == 1), q_last.eq(d.q0 + 1 >= d.out_width),
                                 p_last.eq(d.p0 + 1 >= d.out_height),
                                 row.eq(d.sram_row), product.eq(0), *start_product(0, d)]
                    m.next = "SETUP"
            with m.State("SETUP"):
                m.d.sync += [acc.eq(acc_next), multiplier.eq(multiplier >> 1),
                             last_bit.eq(multiplier[2:] == 0), multiplicand.eq(multiplicand << 1)]
                with m.If(last_bit):
                    with m.Switch(product):
                        for k, (target, *_) in enumerate(products(desc)):
                            with m.Case(k):
                                if target is not None:
                                    m.d.sync += target.eq(acc_next[:len(target)])
                                if k + 1 < count:
                                    m.d.sync += [product.eq(k + 1),
                                                 *start_product(k + 1, desc)]
                                else:
                                    m.next = "START"
                stop_on_abort()
            with m.State("START"):
                m.d.sync += [*first_lane(), pending.eq(1)]
                m.next = "WALK"
                stop_on_abort()
            with m.State("WALK"):
                with m.If(load & last_in_row):
                    m.d.sync += [*first_lane(), i.eq(i + 1), row.eq(row + 1),
                                 i_last.eq(i + 2 == desc.rows)]
                    advance([(q, desc.out_width, q_last, wq, desc.conv_stride, -desc.padding,
                              [ro], csw),
                             (p, desc.out_height, p_last, hp, desc.conv_stride, -desc.padding,
                              [ro_p, ro], csh),
                             (n, None, None, None, 0, 0, [ro_n, ro_p, ro], desc.stride_n)])
                with m.Elif(load):
                    m.d.sync += [j.eq(j + 1), j_last.eq(j + 2 == desc.lanes)]
                    advance([(s, desc.kernel_w, s_last, ws, desc.dilation, 0, [lo], dsw),
                             (r, desc.kernel_h, r_last, hr, desc.dilation, 0, [lo_r, lo], dsh),
                             (c, None, None, None, 0, 0, [lo_c, lo_r, lo], desc.stride_c)])
                with m.If(self.elements.valid & self.elements.ready & self.elements.payload.last):
                    m.next = "IDLE"
                stop_on_abort()
        with m.If(self.abort):
            m.d.sync += [self.elements.valid.eq(0), pending.eq(0)]
        return m


class ElementStage(wiring.Component):
    """A registered stage for walked elements, between a walker and the `BurstPlanner`, that
    also checks each element's bus beat against the windows with ``permission`` (`PERMISSIONS`;
    `window_ok`, ``in_window`` of `checked_element_layout`), so that the planner's
    take of an element waits on no compare. ``windows``: how many access windows there are
    (`CoreConfig.windows`); they must not change while elements are in the stage (the control
    registers freeze them while the core runs).

    It also compares each element's beat with the beat of the element before it
    (``same_beat``, ``next_beat``), which the planner took last: the planner's take waits on no
    address compare either (the routed 8x8's critical path ran from the stage through those
    compares into the planner's registers, 17.3 ns).

    A `SkidBuffer`: ``input.ready`` and ``output``'s payload and valid are flip-flops, so
    neither the planner's ready nor an element is a combinational path from the one to the
    other; on an iCE40 a `StreamRegister` (the planner's ready reaches ``input.ready``, at the
    18 MHz of the iCEBreaker). One element per cycle sustained, one cycle of latency.
    """

    def __init__(self, lanes, rows, beat_bytes, permission, windows=NUM_WINDOWS,
                 address_width=32):
        _check_beat_bytes(beat_bytes)
        _check_permission(permission)
        _check_int("windows", windows, 1, NUM_WINDOWS)
        _check_address_width(address_width)
        self.beat_bytes, self.permission = beat_bytes, permission
        elements = element_layout(lanes, rows, address_width)
        checked = checked_element_layout(lanes, rows, address_width)
        super().__init__({"input": In(stream.Signature(elements)),
                          "output": Out(stream.Signature(checked)),
                          "windows": In(data.ArrayLayout(window_layout(address_width), windows)),
                          **_permission_members(permission)})

    def elaborate(self, platform):
        m = Module()
        shift = ceil_log2(self.beat_bytes)
        checked = Signal(self.output.payload.shape())
        beat = self.input.payload.addr[shift:]
        previous = Signal.like(beat)  # the beat of the element before
        m.d.comb += [checked.eq(self.input.payload.as_value()),  # the same fields first
                     checked.in_window.eq(window_ok(
                         m, self.windows, Cat(Const(0, shift), beat),
                         self.beat_bytes, _permission_of(self), aligned=True)),
                     checked.same_beat.eq(beat == previous),
                     checked.next_beat.eq((beat == previous + 1) & (beat[:12 - shift] != 0))]
        with m.If(self.input.valid & self.input.ready):
            m.d.sync += previous.eq(beat)
        # (On an iCE40, whose boards' clocks leave time to spare, a plain register stage.)
        register = StreamRegister if fpga_family(platform) == "ice40" else SkidBuffer
        m.submodules.buffer = buffer = register(checked.shape())
        m.d.comb += [buffer.i.payload.eq(checked), buffer.i.valid.eq(self.input.valid),
                     self.input.ready.eq(buffer.i.ready)]
        wiring.connect(m, buffer.o, wiring.flipped(self.output))
        return m


def window_ok(m, windows, addr, size, permission, aligned=False):
    """``[addr, addr + size)`` lies inside a window with ``permission`` ("read", "write", or a
    1-bit value, 1 for write; helper signals driven in ``m``): per window two compares with its
    ``base`` and ``end`` (`isa.window_layout`, whose end the control registers add up when the
    window is written), one adder for ``addr + size``. With
    ``aligned`` (``size`` a power of two that divides ``addr``) no adder: ``addr + size <= end``
    is ``addr / size < floor(end / size)``."""
    start = Signal.like(addr, name="window_start")
    m.d.comb += start.eq(addr)
    if aligned:
        shift = ceil_log2(size)
        if size != 1 << shift:
            raise ValueError(f"size={size!r} is invalid with aligned: allowed a power of two")
        fits = [start[shift:] < w.end[shift:] for w in windows]
    else:
        stop = Signal.like(addr + size, name="window_stop")
        m.d.comb += stop.eq(addr + size)
        fits = [stop <= w.end for w in windows]
    def allows(w):
        return w[permission] if isinstance(permission, str) else Mux(permission, w.write, w.read)
    return Cat(allows(w) & (start >= w.base) & fit for w, fit in zip(windows, fits)).any()


class BurstPlanner(wiring.Component):
    """Groups walked steps into INCR bursts of bus beats, one step per cycle.

    An in-bounds step (its lanes within one beat) shares the beat of the previous one or extends
    the open burst by the next beat; otherwise (out-of-bounds step, other beat, 4 KiB boundary,
    ``max_steps`` or ``max_beats`` reached, end of walk) the burst closes and goes out on
    ``bursts``. ``steps`` gives every walked step, in order, one step late: it tells when a beat
    and a burst end. A burst is issued no earlier than the step that closes it. Each beat is
    checked against the windows before it joins a burst (``in_window``, from the `ElementStage`
    with ``same_beat`` and ``next_beat``, which compare it with the step before; ``permission``
    (`PERMISSIONS`) names the error, LOAD_WINDOW or STORE_WINDOW): on a failing beat ``error``
    is set and the planner stops (the open burst is dropped). ``abort`` stops it as well;
    ``steps`` and ``bursts`` still drain. With permission "either", ``max_steps`` and
    ``max_beats`` are pairs (for reads, for writes), chosen with the permission by ``write``.
    ``steps`` leaves through a skid register, so ``elements.ready`` does not depend on
    ``steps.ready``; on an iCE40 it does, and there is no skid register.
    """

    def __init__(self, lanes, rows, beat_bytes, max_steps, max_beats, permission,
                 address_width=32):
        _check_beat_bytes(beat_bytes)
        _check_permission(permission)
        _check_address_width(address_width)
        pairs = permission == "either"
        for name, value, high in (("max_steps", max_steps, 65535), ("max_beats", max_beats, 256)):
            if pairs and not (isinstance(value, tuple) and len(value) == 2):
                raise ValueError(f"{name}={value!r} is invalid: allowed a pair (reads, writes) "
                                 f'with permission "either"')
            for limit in value if pairs else (value,):
                _check_int(name, limit, 1, high)
        self.beat_bytes, self.max_steps, self.max_beats = beat_bytes, max_steps, max_beats
        self.permission = permission
        super().__init__({
            "elements": In(stream.Signature(checked_element_layout(lanes, rows, address_width))),
            "steps": Out(stream.Signature(step_layout(lanes, rows, beat_bytes))),
            "bursts": Out(stream.Signature(burst_layout(address_width))),
            "abort": In(1),
            "error": Out(ErrorCode),
            **_permission_members(permission),
        })

    def _limit(self, value):
        """``value`` (a limit, or a pair of them with permission "either") in this cycle."""
        if self.permission == "either":
            return Mux(self.write, value[1], value[0])
        return Const(value)

    def elaborate(self, platform):
        m = Module()
        shift = ceil_log2(self.beat_bytes)
        elem = self.elements.payload
        beat = elem.addr[shift:]
        pending = Signal(self.steps.payload.shape())  # the previous step, end flags unknown
        pending_valid = Signal()
        first_beat = Signal.like(beat)
        pairs = self.permission == "either"
        # The steps and beats the open burst may still take, counted down from the limits as
        # it opens, and whether either is left, registers: no compare on the way into the take
        # (the UP5K shared front's critical path alone ran from its owner through the compare
        # with a limit, which ``write`` chooses, into the walker, 40.5 ns).
        steps_left = Signal(range(max(self.max_steps) if pairs else self.max_steps))
        beats_left = Signal(range(max(self.max_beats) if pairs else self.max_beats))
        room, beat_room = Signal(name="room"), Signal(name="beat_room")
        beats = Signal(range((max(self.max_beats) if pairs else self.max_beats) + 1))
        flush = Signal()  # the last step is pending: close at the next cycle

        is_open = pending_valid & pending.in_bounds
        share = is_open & elem.same_beat & room
        extend = is_open & elem.next_beat & room & beat_room
        joins = ~flush & elem.in_bounds & (share | extend)
        bad = ~flush & elem.in_bounds & ~elem.in_window
        end_of_burst = is_open & ~joins

        # The steps leave through a skid register: the planner takes an element while it is
        # empty, not when ``steps.ready`` says so (the routed 8x8's critical path ran from the
        # store engine's stall through that ready into the planner's take, 23.6 ns). On an
        # iCE40 (an 18 MHz board) the take waits for that ready instead: no skid register.
        skid_buffer = fpga_family(platform) != "ice40"
        skid = Signal.like(self.steps.payload) if skid_buffer else None
        skid_valid = Signal()
        out_free = ~self.steps.valid | self.steps.ready
        event = ~self.abort & (self.error == ErrorCode.NONE) & (flush | self.elements.valid)
        advance = (event & ~bad & (~pending_valid | (~skid_valid if skid_buffer else out_free))
                   & (~end_of_burst | ~self.bursts.valid | self.bursts.ready))
        m.d.comb += self.elements.ready.eq(advance & ~flush)

        step = Signal.like(self.steps.payload)  # the pending step, leaving as it advances
        m.d.comb += [step.eq(pending),
                     step.end_of_beat.eq(pending.in_bounds & ~(joins & share)),
                     step.end_of_burst.eq(end_of_burst)]
        leaves = advance & pending_valid
        with m.If(out_free):
            m.d.sync += [self.steps.valid.eq(skid_valid | leaves),
                         self.steps.payload.eq(Mux(skid_valid, skid, step) if skid_buffer
                                               else step),
                         skid_valid.eq(0)]
        if skid_buffer:
            with m.Elif(leaves):
                m.d.sync += [skid.eq(step), skid_valid.eq(1)]
        with m.If(self.bursts.ready):
            m.d.sync += self.bursts.valid.eq(0)
        with m.If(event & bad):
            m.d.sync += self.error.eq(Mux(_writes(self), ErrorCode.STORE_WINDOW,
                                          ErrorCode.LOAD_WINDOW))
        with m.If(advance):
            with m.If(end_of_burst):
                m.d.sync += [self.bursts.valid.eq(1),
                             self.bursts.payload.addr.eq(Cat(Const(0, shift), first_beat)),
                             self.bursts.payload.len.eq(beats - 1)]
            with m.If(flush):
                m.d.sync += [pending_valid.eq(0), flush.eq(0)]
            with m.Else():
                m.d.sync += [
                    pending_valid.eq(1),
                    pending.in_bounds.eq(elem.in_bounds),
                    pending.lane.eq(elem.lane),
                    pending.count.eq(elem.count),
                    pending.row.eq(elem.row),
                    pending.last_in_row.eq(elem.last_in_row),
                    pending.last.eq(elem.last),
                    pending.offset.eq(elem.addr[:shift]),
                    flush.eq(elem.last),
                ]
                with m.If(joins):
                    m.d.sync += [steps_left.eq(steps_left - 1), room.eq(steps_left != 1)]
                    with m.If(~share):
                        m.d.sync += [beats.eq(beats + 1), beats_left.eq(beats_left - 1),
                                     beat_room.eq(beats_left != 1)]
                with m.Else():
                    steps, beat_limit = self._limit(self.max_steps), self._limit(self.max_beats)
                    m.d.sync += [first_beat.eq(beat), beats.eq(1),
                                 steps_left.eq(steps - 1), room.eq(steps != 1),
                                 beats_left.eq(beat_limit - 1), beat_room.eq(beat_limit != 1)]
        return m


def move_units(m, source, first, at, count, units, width):
    """A ``units``-unit vector holding ``count`` ``width``-bit units of ``source``, from unit
    ``first`` on, at unit ``at`` on (a multiplexer per unit, driven in ``m``), and its mask of
    them. Units outside the mask are unspecified."""
    moved = Signal(units * width)
    mask = Signal(units)
    units_in = Signal(len(source))
    offset, unit_mask = unit_move(first, at, count, units)
    m.d.comb += [units_in.eq(source),
                 moved.eq(select_units(units_in, offset, units, width)),
                 mask.eq(unit_mask)]
    return moved, mask


def unit_move(first, at, count, units):
    """``(offset, mask)`` of `move_units`: target unit k takes source unit ``offset + k`` (see
    `select_units`), and ``mask`` has the ``count`` targets from ``at`` on. Formed ahead of the
    data, they take the compares off its path."""
    return first - at, Cat((at <= k) & (k < at + count) for k in range(units))


def select_units(source, first, units, width):
    """Units ``first .. first + units - 1`` of ``source`` (``width``-bit units), a multiplexer
    per unit: cheaper than a barrel shift of all of ``source``. Units past the end of
    ``source`` are unspecified, and ``first`` is taken modulo a power of two."""
    index_bits = max(1, ceil_log2(len(source) // width))
    return Cat(source.word_select((first + k)[:index_bits], width) for k in range(units))
