"""Instruction and descriptor formats: the one definition used by the HDL decoder and the firmware.

Every instruction is ``INSTRUCTION_BITS`` wide (64 bytes, little endian in memory). The header
says which engine runs it and which dependency tokens it waits on and signals, as in VTA: each
engine pops a token from its neighbour's queue before it starts and pushes one when it is done.
The engines form a chain load -> execute -> store, so "prev" and "next" are the neighbours.

Policies of every core (pinned by tests/test_limits_verilator.py):

* Token counters saturate, they never wrap. Each of the four counters (one per neighbour and
  direction) counts pushes completed and not yet popped. An instruction that pushes is
  dispatched only while its counter is below ``arch.TOKEN_LIMIT`` (247: the 8-bit
  counter's 255 less the 8 pushes that may still be pending), so 247 unconsumed pushes always
  complete, a few more already dispatched may land on top (at most 255 in all: the 8 pending
  and the one the controller registers a cycle before it counts it), and a program
  that needs more waits until the watchdog stops it with WATCHDOG, blaming the waiting push.
* Bits an opcode does not define are ignored: the fields named ``reserved``, the bits past the
  opcode's layout up to ``INSTRUCTION_BITS``, and the header flags that do not apply to it:
  ``pop_prev`` / ``push_prev`` of a LOAD (no engine before the load engine), ``pop_next`` /
  ``push_next`` of a STORE or PARAMS (none after the store engine), ``accumulate`` of all but
  MATMUL, ``im2col`` of all but LOAD, and every flag of END. The core neither checks them nor
  acts on them. `encode` writes them as zero and programs must keep them zero, so that a later
  version can give them a meaning. (A value that a defined field does not allow is an error
  instead: an opcode outside `Opcode` or a mode outside `SoftmaxMode` is UNKNOWN_OPCODE, and so
  on, see `ErrorCode`.)
* Addresses are ``A = CoreConfig.address_width`` bits (32 unless the core was generated
  narrower; `CONFIG2.address_bits_missing` is 32 - A) and wrap modulo ``2**A``. Instruction
  ``pc`` is fetched from ``(PROGRAM_BASE + INSTRUCTION_BYTES * pc) mod 2**A``: a program that
  runs past the top of the address space continues at address 0. Every fetch is checked
  against the access windows at that wrapped address, and a window does not wrap (it covers
  ``[base, min(base + size, 2**A))``, nothing if ``base >= 2**A``), so the fetch reads address
  0 only if a readable window covers it there, else the core stops with PROGRAM_WINDOW at that
  ``pc``. DMA element addresses wrap the same way (a tensor descriptor's ``address + sum(i_d *
  stride_d)``, an im2col element's ``base`` plus its offset, modulo 2**A: the bits of
  addresses and strides from A on are ignored; each access checked against the windows at the
  wrapped address); `encode_tile` and `encode_im2col` refuse a tile whose in-bounds elements
  leave the address space, so wrapping is never what a program built by the runtime asks for.
* Instruction indices (the ``pc``, ERROR_INDEX) are ``CoreConfig.index_width`` bits: 32, or
  on a core of fewer address bits ``A - 5`` (twice the instructions its address space holds),
  counting modulo ``2**index_width``. The program ends at ``pc == PROGRAM_LENGTH`` (or at END);
  a PROGRAM_LENGTH from ``2**index_width`` on is no limit: the program runs to END (or an
  error).
* A core walks the first ``CoreConfig.descriptor_dims`` (2..``DIMS``) dims of a tensor
  descriptor; the format keeps ``DIMS``. Each dim past them must have extent 1, else the LOAD
  or STORE is BAD_EXTENT (found before any access, like the other extents); its stride is
  ignored (its index is always 0) and its in-bounds range is not: ``lo`` 0 and ``hi`` above 0
  make its only index in bounds, anything else makes every element padding (a LOAD writes
  zeros, a STORE writes nothing), as where the dim is walked. So an instruction such a core
  runs does what it does on a core with every dim (pinned by tests/test_dma_pysim.py).
"""
import functools
from collections.abc import Mapping

from amaranth.hdl import Shape, signed
from amaranth.lib import data, enum

__all__ = [
    "INSTRUCTION_BITS", "INSTRUCTION_BYTES", "DIMS", "ErrorCode", "Opcode", "Header", "Dim",
    "TensorDescriptor", "Im2colDescriptor", "LoadInstruction", "LoadIm2colInstruction",
    "MatmulInstruction", "StoreInstruction", "Epilogue", "EpilogueParams", "ParamsInstruction",
    "PARAMS_PER_INSTRUCTION", "PARAMS_RESET", "RowScale", "SoftmaxMode", "SoftmaxInstruction", "decode", "encode",
    "defined_bits", "encode_im2col", "encode_tile", "instruction_layout", "pack", "with_bits",
    "ADDRESS_WIDTHS", "NUM_WINDOWS", "Window", "window_end", "window_layout",
]

INSTRUCTION_BITS = 512
INSTRUCTION_BYTES = INSTRUCTION_BITS // 8
DIMS = 4
"""Dimensions of a tensor descriptor; dim 0 maps to the lanes of one SRAM row."""


class Opcode(enum.Enum, shape=4):
    """Zero is not an opcode, so a program running into zeroed memory stops with an error."""
    LOAD = 1     # external memory -> scratchpad (load engine)
    MATMUL = 2   # scratchpad -> array -> accumulator (execute engine)
    STORE = 3    # accumulator -> epilogue -> external memory (store engine)
    END = 4      # wait for every engine, then done + irq
    PARAMS = 5   # per-lane epilogue parameters (store engine)
    SOFTMAX = 6  # online-softmax step or final normalization on accumulator rows (execute engine)


class ErrorCode(enum.Enum, shape=4):
    NONE = 0
    UNKNOWN_OPCODE = 1
    LOAD_WINDOW = 2       # a read outside every readable access window
    STORE_WINDOW = 3      # a write outside every writable access window
    BAD_EXTENT = 4        # zero extent, or a tile larger than the SRAM row or region, or a
                          # dim the core does not walk with extent or start other than 1 or 0
    MISALIGNED = 5        # base or stride not a multiple of the element size
    SRAM_RANGE = 6        # scratchpad or accumulator row out of range
    WATCHDOG = 7          # no progress for WATCHDOG cycles (e.g. a token that never comes)
    PROGRAM_WINDOW = 8    # an instruction fetch outside every readable window
    BUS_ERROR = 9         # SLVERR / DECERR on the memory bus
    BAD_ELEMENT = 10      # unsupported element size for this engine
    ADDRESS_OVERFLOW = 11 # retired with descriptor format 2 (DMA addresses wrap modulo
                          # 2**address_width and are checked there): never raised, its number kept


Header = data.StructLayout({
    "opcode": Opcode,
    "pop_prev": 1,    # wait for a token from the previous engine
    "pop_next": 1,    # wait for a token from the next engine
    "push_prev": 1,   # when done, give a token to the previous engine
    "push_next": 1,   # when done, give a token to the next engine
    "accumulate": 1,  # MATMUL: add to the accumulator rows instead of overwriting them
    "im2col": 1,      # LOAD: the descriptor is an Im2colDescriptor
    "reserved": 22,
})

Dim = data.StructLayout({
    "extent": 16,        # tile elements in this dimension (>= 1)
    "lo": 16,            # tile indices [lo, hi) are inside the tensor; the others are padding
    "hi": 16,            # (read as zero, not stored): lo >= hi makes the whole tile padding
    "stride": 32,        # bytes between consecutive indices
})

TensorDescriptor = data.StructLayout({
    "address": 32,       # byte address of tile element (0, 0, 0, 0), in bounds or not
    "elem_log2": 2,      # element size is 1 << elem_log2 bytes
    "sram_row": 16,      # first scratchpad (LOAD) or accumulator (STORE) row
    "lane": 6,           # lane of element i0 = 0 (lanes below it: LOAD keeps them)
    "reserved": 8,
    "dims": data.ArrayLayout(Dim, DIMS),  # dim 0 first; a core walks the first
                                          # CoreConfig.descriptor_dims (see the policies)
})
"""A tile in the form the DMA walks (an affine loop nest, as VTA's ``TensorDataCtrl``): element
(i0, i1, i2, i3) sits at ``(address + sum(i_d * stride_d)) mod 2**A`` (the policies), is in
bounds when ``lo_d <= i_d < hi_d`` for every d, and goes to (LOAD) or comes from (STORE) lane
``lane + i0`` of SRAM row ``sram_row + i1 + extent1 * (i2 + extent2 * i3)``; ``lane + extent0``
must not exceed the row's lanes (else BAD_EXTENT). A LOAD writes lanes ``lane`` to the end of
each row (zero for padding and past ``extent0``) and keeps the lanes below ``lane``. Programs
describe tiles TMA-style (a tensor's base, bounds and strides, the tile's start coordinates) and
`encode_tile` turns that into this form; the hardware has no multiplier and no coordinates."""


def encode_tile(tile, walked=DIMS, wrap=False, address_width=32):
    """`TensorDescriptor` fields of a TMA-style ``tile``: ``{"base", "elem_log2", "sram_row",
    "lane", "dims": DIMS x {"extent", "start", "bound", "stride"}}``, element (i0..i3) at tensor
    coordinate ``start_d + i_d``, padding outside ``[0, bound_d)``. ``walked``: the dims the
    core walks (`CoreConfig.descriptor_dims`); each one past them must have extent 1 (ValueError
    naming ``descriptor_dims``). ValueError if an in-bounds element's address is outside the
    address space of ``address_width`` bits (`CoreConfig.address_width`), unless ``wrap`` (the
    hardware's wrapping addresses, for tests)."""
    dims = tile["dims"]
    for d in range(walked, DIMS):
        if dims[d]["extent"] != 1:
            raise ValueError(f"this tile needs dim {d} (extent {dims[d]['extent']}): the core "
                             f"walks only {walked} (CoreConfig.descriptor_dims={walked})")
    ranges = [(min(max(-d["start"], 0), d["extent"]),
               min(max(d["bound"] - d["start"], 0), d["extent"])) for d in dims]
    address = tile["base"] + sum(d["start"] * d["stride"] for d in dims)
    if not wrap and all(lo < hi for lo, hi in ranges):
        last = address + sum((hi - 1) * d["stride"] for (_, hi), d in zip(ranges, dims))
        if last >= 1 << address_width:
            raise ValueError(f"the tile's last in-bounds element, at {last:#x}, is outside the "
                             f"{address_width}-bit address space")
    return {"address": address % (1 << 32), "elem_log2": tile["elem_log2"],
            "sram_row": tile["sram_row"], "lane": tile["lane"],
            "dims": [{"extent": d["extent"], "lo": lo, "hi": hi, "stride": d["stride"]}
                     for (lo, hi), d in zip(ranges, dims)]}


Im2colDescriptor = data.StructLayout({
    "base": 32,          # byte address of x[0, 0, 0, 0] of an (N, C, H, W) int8 tensor
    "sram_row": 16,      # first scratchpad row
    "rows": 16,          # output pixels in the tile (SRAM rows), >= 1
    "lanes": 16,         # kernel positions in the tile (lanes of each row), 1..lanes
    "batch": 16,         # N, C, H, W: the tensor's bounds
    "channels": 16,
    "height": 16,
    "width": 16,
    "out_height": 16,    # P, Q: output pixels per image
    "out_width": 16,
    "kernel_h": 8,       # R, S
    "kernel_w": 8,
    "conv_stride": 8,    # coordinate step between neighbouring output pixels
    "dilation": 8,       # coordinate step between neighbouring kernel taps
    "padding": 8,        # zeros before the first row / column
    "n0": 16,            # first output pixel (n0, p0, q0) of the tile
    "p0": 16,
    "q0": 16,
    "c0": 16,            # first kernel position (c0, r0, s0) of the tile
    "r0": 8,
    "s0": 8,
    "stride_n": 32,      # byte strides of the tensor
    "stride_c": 32,
    "stride_h": 32,
    "stride_w": 32,
})
"""Implicit GEMM: a tile of the lowered (im2col) matrix, generated on the fly.

Row ``i`` is output pixel ``m0 + i`` with m = (n, p, q), q fastest; lane ``j`` is kernel
position ``k0 + j`` with k = (c, r, s), s fastest. The element is ``x[n, c, h, w]`` with
``h = p * conv_stride + r * dilation - padding`` and ``w = q * conv_stride + s * dilation -
padding``, zero outside the tensor (padding) and past the last pixel or kernel position."""

def encode_im2col(descriptor, wrap=False, address_width=32):
    """``descriptor`` (`Im2colDescriptor` fields), checked: ValueError if the tensor's last
    element, ``x[N-1, C-1, H-1, W-1]``, is outside the address space of ``address_width``
    bits (the core would wrap addresses past it), unless ``wrap`` (for tests of that wrap)."""
    d = descriptor
    last = d["base"] + sum(max(d[bound] - 1, 0) * d[stride] for bound, stride in (
        ("batch", "stride_n"), ("channels", "stride_c"), ("height", "stride_h"),
        ("width", "stride_w")))
    if not wrap and last >= 1 << address_width:
        raise ValueError(f"the im2col tensor's last element, at {last:#x}, is outside the "
                         f"{address_width}-bit address space")
    return descriptor


LoadInstruction = data.StructLayout({"header": Header, "tensor": TensorDescriptor})
LoadIm2colInstruction = data.StructLayout({"header": Header, "im2col": Im2colDescriptor})
"""A LOAD with ``header.im2col`` set: the same bits as LoadInstruction, read this way."""
Epilogue = data.StructLayout({
    "bias": 1,           # add the lane's bias
    "requant": 1,        # scale by the lane's multiplier and shift, to int8 or int32
    "relu": 1,           # max(y, 0)
    "pool": 1,           # 2x2 / stride-2 max pooling of output pixels (see below)
    "pool_pitch": 16,    # accumulator rows between vertically neighbouring output pixels
    "per_row": 1,        # tile row i1 (every lane) uses parameter entry i1, not lane i0's
    "row_scale": 1,      # tile row i1 takes multiplier and shift from row scale scale_row + i1
    "scale_row": 16,     # (the softmax unit's NORMALIZE writes them, see `RowScale`)
})
"""The store path's per-element function of an accumulator value ``acc`` of lane ``j``:
``t = acc + bias[j]`` (if ``bias``), then ``y = sat(round_half_even(t * multiplier[j] /
2**shift[j]))`` (ties to even) if ``requant`` else ``y = sat_int32(t)``, then ``max(y, 0)`` if
``relu``. Without ``requant`` elements are int32 (``elem_log2`` 2); with it int8 (``elem_log2``
0, ``sat`` to int8) or int32 (``elem_log2`` 2, ``sat`` to int32); any other element size is
BAD_ELEMENT.

With ``row_scale`` (cores with the softmax unit; on others UNKNOWN_OPCODE) element (i0, i1)
takes its multiplier and shift from row scale ``scale_row + i1`` instead of lane i0's parameters
(its bias stays the lane's): ``requant`` must be set and the tile 2-D and not pooled or
``per_row``, else BAD_EXTENT; a row past the row scales (``CoreConfig.probability_rows``) is
SRAM_RANGE. Flash attention stores O / l so: NORMALIZE writes each query's 1 / l as a row scale.

With ``pool`` (cores with pooling, `CoreConfig.epilogue_pool`; on others UNKNOWN_OPCODE) the
tile's dim 3 extent must be 1, and tile element (i0, i1, i2) is the maximum over the accumulator
rows ``r, r + 1, r + pool_pitch, r + pool_pitch + 1`` with ``r = sram_row + 2 * i1 + 2 *
pool_pitch * i2`` (raster-ordered output pixels, ``pool_pitch`` of them per image row).

With ``per_row`` element (i0, i1) uses the parameters of entry ``i1`` instead of lane ``i0``
(output channels on the accumulator rows); the tile must be 2-D (dim 2 and 3 extents 1), at
most ``cols`` rows (dim 1 extent), and not pooled: else BAD_EXTENT."""

StoreInstruction = data.StructLayout({"header": Header, "tensor": TensorDescriptor,
                                      "epilogue": Epilogue})

EpilogueParams = data.StructLayout({
    "bias": signed(32),
    "multiplier": 16,    # unsigned
    "shift": 6,
})

PARAMS_PER_INSTRUCTION = 8
PARAMS_RESET = {"bias": 0, "multiplier": 1, "shift": 0}
"""A lane's epilogue parameters after reset: the identity."""

ParamsInstruction = data.StructLayout({
    "header": Header,
    "first_lane": 16,    # entry e sets lane first_lane + e (lanes >= cols are ignored)
    "broadcast": 1,      # entry 0 sets every lane
    "reserved": 15,
    "entries": data.ArrayLayout(EpilogueParams, PARAMS_PER_INSTRUCTION),
})
"""Sets the store engine's per-lane epilogue parameters, kept until changed (reset: bias 0,
multiplier 1, shift 0: ``PARAMS_RESET``). Runs in order with the STOREs; entry j is for lane j
of a tile (output column j), or tile row j with ``Epilogue.per_row``."""

MatmulInstruction = data.StructLayout({
    "header": Header,
    "weight_row": 16,    # scratchpad row of W[0, :]; the tile is `rows` rows, lanes 0..cols-1
    "act_row": 16,       # row of the first activation vector (lanes 0..rows-1)
    "acc_row": 16,       # accumulator row of the first result vector
    "count": 16,         # activation vectors (>= 1)
    "act_probabilities": 1,  # act_row is in the probability buffer (unsigned 8-bit), not the
                             # scratchpad (int8)
    "act_stride_log2": 4,    # activation vector i is row act_row + (i << act_stride_log2)
})


class SoftmaxMode(enum.Enum, shape=2):
    BLOCK = 0       # online-softmax update with one block of scores; rescale O
    NORMALIZE = 1   # the row scales of 1 / l, for a STORE of O with `Epilogue.row_scale`


RowScale = data.StructLayout({
    "multiplier": 16,    # unsigned
    "shift": 6,
})
"""A query's scale for the store epilogue (``Epilogue.row_scale``): NORMALIZE writes row scale
``state_row + i`` of query i, ``multiplier / 2**shift`` ~ ``2**(OUT_FRAC + LF) / l`` (see
``hdl/softmax.py``); the scales are ``CoreConfig.probability_rows`` entries, like the state."""


SoftmaxInstruction = data.StructLayout({
    "header": Header,
    "mode": SoftmaxMode,
    "first": 1,          # BLOCK: the first block of these queries (state starts at m=-inf, l=0)
    "causal": 1,         # mask key k of query q when k > q + causal_offset
    "reserved": 4,
    "count": 16,         # queries (>= 1)
    "tiles": 8,          # key tiles in the block (>= 1), `cols` keys each
    "o_tiles": 8,        # BLOCK: O tiles (>= 1), `cols` output columns each
    "keys": 16,          # valid keys in the block; lanes past them are masked
    "causal_offset": signed(32),
    "score_row": 16,     # accumulator row of S[query i, key tile t] = score_row + t * count + i
    "p_row": 16,         # probability-buffer row of P[i, t] = p_row + t * count + i
    "o_row": 16,         # BLOCK: accumulator row of O[i, tile u] = o_row + u * count + i
    "state_row": 16,     # softmax state (m, l) and row scale of query i = state_row + i
    "frac": 5,           # scores are log2-domain fixed point: x = s / 2**frac
})
"""One step of flash attention on the softmax unit (see ``hdl/softmax.py`` for the numerics)."""

_LAYOUTS = {Opcode.LOAD: LoadInstruction, Opcode.MATMUL: MatmulInstruction,
            Opcode.STORE: StoreInstruction, Opcode.END: data.StructLayout({"header": Header}),
            Opcode.PARAMS: ParamsInstruction, Opcode.SOFTMAX: SoftmaxInstruction}

assert all(layout.size <= INSTRUCTION_BITS for layout in (*_LAYOUTS.values(), LoadIm2colInstruction))


def instruction_layout(opcode, im2col=False):
    """The layout of an instruction with ``opcode`` (and, for a LOAD, header flag ``im2col``)."""
    if opcode == Opcode.LOAD and im2col:
        return LoadIm2colInstruction
    return _LAYOUTS[opcode]


def encode(opcode, **fields):
    """Instruction bytes for ``opcode`` with ``fields`` (nested dicts, as the layouts name them)."""
    opcode = Opcode(opcode)
    fields.setdefault("header", {})
    fields["header"] = {**fields["header"], "opcode": opcode}
    bits = pack(instruction_layout(opcode, fields["header"].get("im2col")), fields)
    return bits.to_bytes(INSTRUCTION_BYTES, "little")


def pack(layout, init):
    """The bits of ``layout.const(init).as_bits()`` (nested mappings or sequences; fields not
    named are zero, values are truncated to their field), without building Amaranth constants:
    the compilers encode an instruction in microseconds rather than a third of a millisecond."""
    bits = 0
    for key, value in init.items() if isinstance(init, Mapping) else enumerate(init):
        offset, width, shape = _fields(layout)[key]
        if isinstance(shape, data.Layout):
            value = pack(shape, value)
        elif isinstance(shape, enum.EnumMeta):
            value = shape(value).value
        mask = ((1 << width) - 1) << offset
        bits = (bits & ~mask) | ((int(value) << offset) & mask)
    return bits


@functools.cache
def _fields(layout):
    """{key: (offset, width, shape)} of the fields of ``layout``."""
    return {key: (field.offset, Shape.cast(field.shape).width, field.shape)
            for key, field in layout}


def defined_bits(layout, offset=0):
    """The set of bit offsets of ``layout`` (from ``offset``) in fields not named ``reserved``:
    the core ignores the others (see the module's policies)."""
    bits = set()
    for key, field in layout:
        if isinstance(field.shape, data.Layout):
            bits |= defined_bits(field.shape, offset + field.offset)
        elif key != "reserved":
            width = Shape.cast(field.shape).width
            bits |= set(range(offset + field.offset, offset + field.offset + width))
    return bits


def with_bits(raw, offset, width, value):
    """Instruction bytes ``raw`` with bits [offset, offset + width) set to ``value`` (for tools
    and tests that make instructions no encoder would)."""
    bits = int.from_bytes(raw, "little")
    mask = ((1 << width) - 1) << offset
    bits = bits & ~mask | (value << offset) & mask
    return bits.to_bytes(len(raw), "little")


def decode(raw):
    """A view of instruction bytes through the layout of its opcode (for tools and tests)."""
    bits = int.from_bytes(raw[:INSTRUCTION_BYTES], "little")
    header = Header.from_bits(bits & ((1 << Header.size) - 1))
    layout = instruction_layout(header.opcode, header.im2col)
    return layout.from_bits(bits & ((1 << layout.size) - 1))

ADDRESS_WIDTHS = range(16, 33)
"""The address widths a core may have (`CoreConfig.address_width`, the policies above)."""

NUM_WINDOWS = 4
"""Access windows of the register map; every DMA must fall inside one of them. A core builds
the first `CoreConfig.windows` of them (the others' registers read 0)."""

def window_layout(address_width=32):
    """An access window as the DMA engines and the fetch check it, on a core of
    ``address_width``-bit addresses (`CoreConfig.address_width`): ``[base, end)``. The host
    writes ``WINDOWn_BASE``, ``_SIZE`` and ``_FLAGS``; the control registers derive the end and
    the enabled permissions from them when they are written (`hdl.csr.ControlRegisters`), so a
    check is two compares per window and no adder. A window covers
    ``[base, min(base + size, 2**address_width))``: it does not wrap, and one whose base is
    beyond the address space is not enabled (`window_end`)."""
    return data.StructLayout({
        "base": address_width,     # byte address; checked at the granularity of the bus beat
        "end": address_width + 1,  # `window_end`
        "read": 1,                 # enabled (size not 0, base inside) and readable
        "write": 1,                # enabled and writable
    })


def window_end(base, size, address_width=32):
    """The ``end`` of `window_layout` for a window's ``base`` and ``size`` registers: ``base +
    size`` (one past the last byte) in ``address_width + 1`` bits, its top bit set if the window
    reaches past the address space (``base + size >= 2**address_width``: then no address is past
    its end). Exact at 32 bits; no multiplexer at any width."""
    total = base + size
    low = total & ((1 << address_width) - 1)
    return low | (1 << address_width) if total >> address_width else low


Window = window_layout()
"""`window_layout` of a core of 32-bit addresses."""
