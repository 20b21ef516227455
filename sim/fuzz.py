"""Program fuzzing of the whole core: hypothesis strategies for cases.

A *case* is plain data (JSON): memory contents, access windows, PROGRAM_BASE, PROGRAM_LENGTH
and WATCHDOG, the outcomes the core may end with, a bound on its cycles (and the instructions
fetched) and, for valid programs, the expected bytes of the output window. `cases` draws them:
tiled matmuls and conv2d (padding, strides, epilogues) from the firmware, those programs
mutated (tokens flipped, instructions dropped, duplicated, swapped, corrupted, truncated),
random instructions from the encoder with mostly sensible and sometimes broken fields (tiles
TMA-style through `isa.encode_tile`, then now and then raw ``lo`` / ``hi`` values it never
makes), single LOADs and STOREs made to reach the errors that random programs rarely reach
first, tensor tiles and im2col tiles that wrap past the top of the address space (4 GiB, or
`CoreConfig.address_width`) through W = I, and raw random bytes.

The outcome model, `predict`, is `sim/fuzz_model.py`.
"""
import functools
import json
import random
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from ..arch import TOKEN_FLAGS, TOKEN_LIMIT, Engine, token_flag_bit
from ..firmware.epilogue import Epilogue
from ..firmware.conv2d import compile_conv2d, conv2d_lowering, conv2d_output_shape, conv2d_weights
from ..firmware.device import fit_windows
from ..firmware.matmul import compile_matmul
from ..firmware.program import Deps, Dim, Program, tensor
from ..isa import (DIMS, INSTRUCTION_BYTES, LoadInstruction, Opcode, SoftmaxInstruction,
                   SoftmaxMode, StoreInstruction, TensorDescriptor, with_bits)
from .fuzz_model import DONE, MEMORY_SIZE, im2col_elements, predict
from .golden import apply_epilogue, conv2d_int32, matmul_int32

__all__ = ["KINDS", "cases", "defect_cases", "draw_cases", "draw_cases_apart", "limit_cases"]

PROGRAM, PROGRAM_SPACE = 0x00000, 0x2000
DATA, DATA_SPACE = 0x10000, 0x8000
OUTPUT, OUTPUT_SPACE = 0x20000, 0x8000
TOP_SPACE = 0x10000


def _space(config):
    """Bytes in the address space of a core of ``config`` (`CoreConfig.address_width`), where
    DMA and fetch addresses wrap."""
    return 1 << config.address_width


def _top(config):
    """(base, size) of the last 64 KiB of the address space: tensor and im2col tiles there run
    past its top and wrap to address 0 and on (each access checked against the windows there,
    as every DMA address)."""
    return _space(config) - TOP_SPACE, TOP_SPACE
WATCHDOGS = (256, 1024)
MAX_CYCLES = 60_000
"""Cases whose bound is larger are not drawn (they would slow the run down)."""


# --- Strategies ----------------------------------------------------------------------------

@functools.cache
def _one_in(count):
    # sampled_from draws about uniformly; one_of and integers lean to some branches and values.
    return st.sampled_from([True] + [False] * (count - 1))


@st.composite
def _rarely(draw, usual, rare, one_in):
    """``usual``, and about one draw in ``one_in`` ``rare``."""
    return draw(rare if draw(_one_in(one_in)) else usual)


_U32 = st.integers(0, (1 << 32) - 1)
_U16 = st.integers(0, (1 << 16) - 1)
DEFECTS = ("address", "shape", "sram", "element", "stride", "padding")
"""Kinds of fields a random instruction may have broken (see `_odds`)."""


def _odds(defect):
    """How rarely (one in so many draws) each kind of field takes an edge or broken value: one
    in two for the ``defect`` kind, one in 48 for the others."""
    return {kind: 2 if kind == defect else 48 for kind in DEFECTS}


def _address(inside_base, inside_size, span, one_in):
    """A byte address: mostly one where ``span`` more bytes stay inside the area, else at its
    edge, anywhere in 4 GiB, or just below 4 GiB (on a core of fewer address bits, the bits
    above them ignored: the top of its address space)."""
    last = max(inside_base, inside_base + inside_size - span - 1)
    end = inside_base + inside_size
    return _rarely(st.integers(inside_base, min(last, (1 << 32) - 1)), st.one_of(
        st.integers(end - 64, min(end + 64, (1 << 32) - 1)), _U32,
        st.integers((1 << 32) - 4096, (1 << 32) - 1)), one_in)


@st.composite
def _dims(draw, max_extent0, max_rows, elem_bytes, odds, walked):
    """TMA-style dims (`firmware.program.Dim`); those past the ``walked`` ones
    (`CoreConfig.descriptor_dims`) mostly extent 1 and start 0 (another start is no error:
    `isa.encode_tile` folds it into the address, or makes the tile padding)."""
    extents = [draw(_rarely(st.integers(1, max_extent0),
                            st.sampled_from([0, max_extent0 + 1, 0xFFFF]), odds["shape"]))]
    for d, limit in enumerate((6, 3, 2), 1):
        extent = _rarely(st.integers(1, limit), st.sampled_from([0, max_rows + 1, 0xFFFF]),
                         odds["shape"])
        extents.append(draw(extent if d < walked else _rarely(st.just(1), extent,
                                                              odds["shape"])))
    dims = []
    for d, extent in enumerate(extents):
        bound = draw(_rarely(st.integers(1, 8), st.sampled_from([0, 0x100, 0xFFFF]),
                             odds["padding"]))
        start = _rarely(st.integers(-2, max(bound - 1, 0)),
                        st.sampled_from([-0x8000, -0x100, bound, 0x7FFF]), odds["padding"])
        start = draw(start if d < walked else _rarely(st.just(0), start, odds["padding"]))
        usual = st.sampled_from([1, 1, 1, 2, 3, 8]) if d == 0 else st.integers(0, 48)
        stride = draw(_rarely(usual.map(lambda s: s * elem_bytes),
                              st.one_of(_U32, st.just(0xFFFFFFFF), st.integers(1, 7),
                                        st.integers(0x10000, 0x1000000)), odds["stride"]))
        dims.append(Dim(extent=extent, start=start, bound=bound, stride=stride))
    return dims


def _span(dims):
    """Bytes from the base to past the furthest in-bounds element (0 when all are padding)."""
    return sum(max(d.bound - 1, 0) * d.stride for d in dims) + 8


@st.composite
def _descriptor(draw, max_extent0, rows, area, elem_bytes, odds, walked):
    dims = draw(_dims(max_extent0, rows, elem_bytes, odds, walked))
    used = dims[1].extent * dims[2].extent * dims[3].extent
    sram_row = draw(_rarely(st.integers(0, max(rows - used, 0)), _U16, odds["sram"]))
    base = draw(_address(*area, span=_span(dims), one_in=odds["address"]))
    if draw(_rarely(st.just(True), st.just(False), odds["stride"])):
        base -= base % elem_bytes
    lane = draw(_rarely(st.integers(0, max(max_extent0 - dims[0].extent, 0)),
                        st.integers(0, (1 << TensorDescriptor["lane"].width) - 1),
                        odds["shape"]))
    return tensor(base, elem_bytes, sram_row, dims, lane=lane)


_ELEMENTS = st.sampled_from([1, 2, 4, 8])


@st.composite
def _im2col(draw, config, odds):
    def field(low, high, width):
        return draw(_rarely(st.integers(low, high), st.integers(0, (1 << width) - 1),
                            3 * odds["shape"]))

    batch, channels, height, width = (field(1, 2, 16), field(1, 3, 16), field(1, 6, 16),
                                      field(1, 6, 16))
    strides = [1, width, width * height, width * height * channels]
    rows = field(1, 8, 16)
    return {"base": draw(_address(DATA, DATA_SPACE, span=strides[3] * batch,
                                  one_in=odds["address"])),
            "sram_row": draw(_rarely(st.integers(0, max(config.scratchpad_rows - rows, 0)), _U16,
                                     odds["sram"])),
            "rows": rows, "lanes": field(1, config.lanes, 16),
            "batch": batch, "channels": channels, "height": height, "width": width,
            "out_height": field(1, 6, 16), "out_width": field(1, 6, 16),
            "kernel_h": field(1, 3, 8), "kernel_w": field(1, 3, 8),
            "conv_stride": field(1, 2, 8), "dilation": field(1, 2, 8), "padding": field(0, 2, 8),
            "n0": field(0, 1, 16), "p0": field(0, 5, 16), "q0": field(0, 5, 16),
            "c0": field(0, 2, 16), "r0": field(0, 2, 8), "s0": field(0, 2, 8),
            "stride_n": field(strides[3], strides[3], 32),
            "stride_c": field(strides[2], strides[2], 32),
            "stride_h": field(strides[1], strides[1], 32), "stride_w": field(1, 1, 32)}


@st.composite
def _deps(draw, density):
    flag = st.sampled_from([True] + [False] * density) if density else st.just(False)
    return Deps(pop_prev=draw(flag), pop_next=draw(flag), push_prev=draw(flag),
                push_next=draw(flag))


@st.composite
def _epilogue_fields(draw, softmax):
    requant = draw(st.booleans())
    pool = draw(_rarely(st.just(False), st.just(True), 6))
    # Row scales: on a core without the softmax unit rarer (each is UNKNOWN_OPCODE there).
    row_scale = draw(_rarely(st.just(False), st.just(True), 4 if softmax else 40))
    return {"bias": int(draw(st.booleans())), "requant": int(requant),
            "relu": int(draw(st.booleans())), "pool": int(pool),
            "pool_pitch": draw(st.integers(0, 6)) if pool else 0,
            "per_row": int(draw(_rarely(st.just(False), st.just(True), 4))),
            "row_scale": int(row_scale), "scale_row": draw(st.integers(0, 40)) if row_scale else 0}


_DIM = TensorDescriptor["dims"].shape.elem_shape
_RANGE_VALUES = st.one_of(st.integers(0, 9), st.sampled_from(
    sorted({min((1 << k) + o, 0xFFFF) for k in range(1, 17) for o in (-1, 0, 1)})))
"""Raw ``lo`` / ``hi`` values: around the extents drawn, and around each power of two (the
walker compares them narrowed to the widths of its indices)."""


@st.composite
def _raw_ranges(draw, raw, tensor_offset, one_in):
    """Instruction bytes ``raw`` of a LOAD or STORE (its descriptor at bit ``tensor_offset``),
    about one draw in ``one_in`` with the ``lo`` or ``hi`` of some dims set to raw values, which
    `isa.encode_tile` never makes: past the extent, ``lo`` above ``hi``, 0xFFFF..."""
    if not draw(_one_in(one_in)):
        return raw
    for d in sorted(draw(st.sets(st.integers(0, DIMS - 1), min_size=1))):
        first = tensor_offset + TensorDescriptor["dims"].offset + d * _DIM.size
        for name in draw(st.sampled_from([("lo",), ("hi",), ("lo", "hi")])):
            raw = with_bits(raw, first + _DIM[name].offset, _DIM[name].width,
                             draw(_RANGE_VALUES))
    return raw


@st.composite
def _instruction(draw, config, density):
    """Encoded bytes of one random instruction: sensible fields, edge values now and then, and
    in half of them one kind of field (`DEFECTS`) often broken."""
    # A kind the core lacks (an im2col LOAD, a SOFTMAX) is as rare as an unknown opcode.
    lacks = {"im2col": not config.im2col, "softmax": not config.softmax}
    kind = draw(st.sampled_from(["load"] * 6
                                + [k for k in ("im2col", "params", "softmax", "end")
                                   if not lacks.get(k)] * 2
                                + ["matmul", "store"] * 4 + ["unknown"]
                                + [k for k, lacking in lacks.items() if lacking]))
    odds = _odds(draw(st.sampled_from([None] * len(DEFECTS) + list(DEFECTS))))
    deps = draw(_deps(density))
    program = Program(wrap=True)  # every dim encoded, tiles past the top wrapped as walked
    sp_rows, acc_rows = config.scratchpad_rows, config.accumulator_rows

    def rows(limit, used):
        return draw(_rarely(st.integers(0, max(limit - used, 0)), _U16, odds["sram"]))

    if kind == "load":
        elem = draw(_rarely(st.just(1), _ELEMENTS, odds["element"]))
        area = draw(_rarely(st.just((DATA, DATA_SPACE)), st.just(_top(config)), 8))
        program.load(draw(_descriptor(config.lanes, sp_rows, area, elem, odds,
                                      config.descriptor_dims)), deps)
        program.instructions[0] = draw(_raw_ranges(program.instructions[0],
                                                   LoadInstruction["tensor"].offset,
                                                   odds["padding"]))
    elif kind == "im2col":
        program.load_im2col(draw(_im2col(config, odds)), deps)
    elif kind == "matmul":
        count = draw(_rarely(st.integers(1, 16), _U16, odds["shape"]))
        probabilities = draw(_rarely(st.just(False), st.just(True), odds["element"]))
        stride_log2 = draw(_rarely(st.integers(0, 2), st.integers(0, 15), odds["stride"]))
        act_rows = config.probability_rows if probabilities else sp_rows
        program.matmul(rows(sp_rows, config.rows),
                       rows(act_rows, ((count - 1) << stride_log2) + 1), rows(acc_rows, count),
                       count, accumulate=draw(st.booleans()), act_probabilities=probabilities,
                       act_stride_log2=stride_log2, deps=deps)
    elif kind == "store":
        epilogue = draw(_epilogue_fields(config.softmax))
        elem = draw(_rarely(st.just(1 if epilogue["requant"] else 4), _ELEMENTS, odds["element"]))
        area = draw(_rarely(st.just((OUTPUT, OUTPUT_SPACE)), st.just(_top(config)), 8))
        program.store(draw(_descriptor(config.cols, acc_rows, area, elem, odds,
                                       config.descriptor_dims)), epilogue, deps)
        program.instructions[0] = draw(_raw_ranges(program.instructions[0],
                                                   StoreInstruction["tensor"].offset,
                                                   odds["padding"]))
    elif kind == "params":
        entries = draw(st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), _U16,
                                          st.integers(0, 63)), min_size=1, max_size=8))
        program.params(entries, first_lane=draw(st.integers(0, config.cols + 4)),
                       broadcast=draw(st.booleans()))
    elif kind == "softmax":
        count, tiles, o_tiles = (draw(_rarely(st.integers(1, 4), st.integers(0, 255),
                                              odds["shape"])) for _ in range(3))
        program.softmax(draw(st.sampled_from(list(SoftmaxMode))), count=count, tiles=tiles,
                        o_tiles=o_tiles, first=draw(st.booleans()), causal=draw(st.booleans()),
                        keys=draw(st.integers(0, 16)), causal_offset=draw(st.integers(-8, 8)),
                        score_row=rows(acc_rows, tiles * count),
                        p_row=rows(config.probability_rows, tiles * count),
                        o_row=rows(acc_rows, o_tiles * count),
                        state_row=rows(config.probability_rows, count),
                        frac=draw(st.integers(0, 31)),
                        deps=deps)
        if draw(_rarely(st.just(False), st.just(True), odds["element"])):
            program.instructions[0] = with_bits(program.instructions[0],
                                                 SoftmaxInstruction["mode"].offset, 2,
                                                 draw(st.integers(2, 3)))
    elif kind == "end":
        program.end()
    else:
        unknown = [v for v in range(16) if v not in {op.value for op in Opcode}]
        return bytes([draw(st.sampled_from(unknown))]) + draw(st.binary(min_size=63, max_size=63))
    return program.instructions[0]


_STANDARD_WINDOWS = [(PROGRAM, PROGRAM_SPACE, True, False), (DATA, DATA_SPACE, True, False),
                     (OUTPUT, OUTPUT_SPACE, False, True)]


@st.composite
def _windows(draw, config):
    """The standard program, data and output windows, sometimes shrunk, disabled, shifted or
    with other permissions, and sometimes a fourth: random (on a core of fewer address bits
    than 32 mostly past its address space: enabled for nothing), or `_top`."""
    windows = []
    for base, size, readable, writable in _STANDARD_WINDOWS:
        if draw(_rarely(st.just(False), st.just(True), 6)):
            base = (base + draw(st.sampled_from([0, 0, 4, 8, 64, -64]))) % (1 << 32)
            size = draw(st.sampled_from([0, 64, 192, size // 2, size - 4, size + 64]))
            readable, writable = draw(st.sampled_from([(True, False), (False, True), (True, True),
                                                       (False, False)]))
        windows.append((base, size, readable, writable))
    if draw(_rarely(st.just(False), st.just(True), 4)):
        base, size = draw(st.one_of(st.just(_top(config)),
                                    st.tuples(st.one_of(_U32, st.just(0)),
                                              st.one_of(_U32, st.just(0xFFFFFFFF)))))
        windows.append((base, size, draw(st.booleans()), draw(st.booleans())))
    return windows


@st.composite
def _program_registers(draw, instructions):
    """PROGRAM_BASE and PROGRAM_LENGTH for a program of ``instructions``."""
    base = draw(_rarely(st.just(PROGRAM), st.one_of(
        st.integers(1, 63).map(lambda k: PROGRAM + k),
        st.integers(1, 64).map(lambda k: PROGRAM + PROGRAM_SPACE - INSTRUCTION_BYTES * k),
        st.just(0x80000), _U32), 8))
    length = draw(_rarely(st.just(instructions), st.one_of(
        st.just(0), st.integers(0, instructions + 4), st.just(0xFFFFFFFF), _U32), 4))
    return base, length


def _aliases(a, b):
    """Byte ranges ``a`` and ``b`` (first, last) share a byte of the memory."""
    if a[1] - a[0] >= MEMORY_SIZE or b[1] - b[0] >= MEMORY_SIZE:
        return True
    a_first, b_first = a[0] % MEMORY_SIZE, b[0] % MEMORY_SIZE
    return any(a_first <= b_first + shift + b[1] - b[0] and b_first + shift <= a_first + a[1] - a[0]
               for shift in (-MEMORY_SIZE, 0, MEMORY_SIZE))


def _image(contents):
    """The memory with ``contents``, (address, bytes) written in order, and those writes as
    (offset, bytes) inside the memory, which addresses wrap around."""
    writes = []
    for address, content in contents:
        at = address % MEMORY_SIZE
        writes += [(at, content[:MEMORY_SIZE - at])] + ([(0, content[MEMORY_SIZE - at:])]
                                                         if len(content) > MEMORY_SIZE - at else [])
    image = bytearray(MEMORY_SIZE)
    for at, content in writes:
        image[at:at + len(content)] = content
    return image, writes


def _case(config, name, *, program, windows, base, length, watchdog, memory=(), check=(),
          soft_reset=True):
    """A case dict, or None when it is not fit to run (too long, tokens past their counters,
    or stores that could overwrite instructions)."""
    image, writes = _image([(base, program), *memory])
    prediction = predict(config, image, windows, base, length, watchdog)
    queued = len(Engine) * config.queue_depth + 1  # and one in the overflow memory or dropped
    fetched = (base, base + (prediction.fetched + queued) * INSTRUCTION_BYTES)
    overwrites = any(_aliases(fetched, written) for written in prediction.written)
    if prediction.cycles > MAX_CYCLES or prediction.tokens > TOKEN_LIMIT or overwrites:
        return None
    return {"name": name, "memory": [[at, bytes(content).hex()] for at, content in writes],
            "windows": [list(w) for w in windows], "program_base": base, "program_length": length,
            "watchdog": watchdog, "expect": sorted(map(list, prediction.outcomes)),
            "reaches_end": prediction.reaches_end, "cycles": prediction.cycles,
            "fetched": prediction.fetched,
            "check": [[address, content.hex()] for address, content in check],
            "soft_reset": soft_reset}


def _output_check(expected):
    """The output window for ``expected`` (an array stored at OUTPUT) and its bytes after the
    run: the array, then zeros to the window's end."""
    content = np.ascontiguousarray(expected).astype(expected.dtype.newbyteorder("<")).tobytes()
    size = -(-len(content) // 64) * 64
    return (OUTPUT, size, False, True), [(OUTPUT, content + bytes(size - len(content)))]


@st.composite
def _epilogue_options(draw, channels, pool_allowed):
    if not draw(st.booleans()):
        return {}
    per = st.sampled_from(["tensor", "channel"])
    options = {}
    if draw(st.booleans()):
        options["bias"] = (draw(st.integers(-5000, 5000)) if draw(per) == "tensor" else
                           np.array(draw(st.lists(st.integers(-5000, 5000), min_size=channels,
                                                  max_size=channels))))
    if draw(st.booleans()):
        if draw(per) == "tensor":
            options["requant"] = (draw(st.integers(0, 65535)), draw(st.integers(0, 24)))
        else:
            options["requant"] = tuple(np.array(draw(st.lists(values, min_size=channels,
                                                              max_size=channels)))
                                       for values in (st.integers(0, 65535), st.integers(0, 24)))
    options["relu"] = draw(st.booleans())
    options["pool"] = pool_allowed and draw(st.booleans())
    return options


def _on_core(config, channels, options):
    """The `Epilogue` of ``options`` that a core of ``config`` applies, and the options of its
    golden model: as `Device` runs it (`Epilogue.on_core`), a core without the epilogue's
    multiplier takes a power-of-two multiplier folded into the shift (the same results) and
    stores any other requantization's (pooled) accumulators as int32 for the host; a core
    without pooling stores every pixel for the host to pool."""
    epilogue = Epilogue.from_options(channels, **options)
    core, host = epilogue.on_core(config) if epilogue is not None else (None, None)
    if host is not None and host.requant:
        options = {"pool": True} if core is not None and core.pool else {}
    elif host is not None:
        options = {**options, "pool": False}
    return core, options


def _random_bytes(draw, shape):
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)


@st.composite
def matmul_cases(draw, config):
    """A tiled matmul from the firmware, maybe with an epilogue: bit-exact against numpy."""
    m, k, n = draw(st.integers(1, 40)), draw(st.integers(1, 24)), draw(st.integers(1, 20))
    a, b = _random_bytes(draw, (m, k)), _random_bytes(draw, (k, n))
    options = draw(_epilogue_options(n, pool_allowed=False))
    options.pop("pool", None)
    epilogue, options = _on_core(config, n, options)
    b_addr = DATA + -(-a.size // 64) * 64
    program = compile_matmul(config, m, k, n, a_addr=DATA, b_addr=b_addr, c_addr=OUTPUT,
                             epilogue=epilogue)
    expected = apply_epilogue(matmul_int32(a, b), channel_axis=1, **options)
    output, check = _output_check(expected)
    name = f"matmul {m}x{k}x{n} {sorted(options)}"
    return _valid_case(config, name, program, [(DATA, a.tobytes()), (b_addr, b.tobytes())],
                       output, check, draw(_run_options()))


@st.composite
def conv2d_cases(draw, config):
    """A conv2d from the firmware (either lowering, padding, strides, dilation, epilogues)."""
    n, c, k = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    x_shape = (n, c, draw(st.integers(2, 8)), draw(st.integers(2, 8)))
    w_shape = (k, c, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    conv = {"stride": draw(st.integers(1, 2)), "padding": draw(st.integers(0, 2)),
            "dilation": draw(st.integers(1, 2))}
    try:
        p, q = conv2d_output_shape(x_shape, w_shape, **conv)[2:]
    except ValueError:
        return None
    options = draw(_epilogue_options(k, pool_allowed=p >= 2 and q >= 2))
    epilogue, options = _on_core(config, k, options)
    lowering = draw(st.sampled_from([None, "im2col"] if config.im2col else [None])) or \
        conv2d_lowering(config, x_shape, w_shape, epilogue)
    x, w = _random_bytes(draw, x_shape), _random_bytes(draw, w_shape)
    w_addr = DATA + -(-x.size // 64) * 64
    try:
        program = compile_conv2d(config, x_shape, w_shape, **conv, x_addr=DATA, w_addr=w_addr,
                                 y_addr=OUTPUT, epilogue=epilogue, lowering=lowering)
    except ValueError:
        if config.im2col:
            raise
        return None  # a convolution a core without the im2col walker does not run
    expected = apply_epilogue(conv2d_int32(x, w, **conv), channel_axis=1, spatial_axes=(2, 3),
                              **options)
    output, check = _output_check(expected)
    name = f"conv2d {lowering} x{x_shape} w{w_shape} {conv} {sorted(options)}"
    memory = [(DATA, x.tobytes()), (w_addr, conv2d_weights(w, lowering).tobytes())]
    return _valid_case(config, name, program, memory, output, check, draw(_run_options()))


@st.composite
def _run_options(draw):
    """PROGRAM_LENGTH past the END of a valid program, WATCHDOG, and a soft reset after."""
    return (draw(_rarely(st.just(0), st.integers(1, 1000), 8)), draw(st.sampled_from(WATCHDOGS)),
            draw(st.booleans()))


def _valid_case(config, name, program, memory, output, check, options):
    extra_length, watchdog, soft_reset = options
    if PROGRAM + program.size > DATA:
        return None
    windows = fit_windows([(PROGRAM, max(PROGRAM_SPACE, program.size), True, False),
                           _STANDARD_WINDOWS[1], output], config.windows)
    case = _case(config, name, program=program.to_bytes(), windows=windows, base=PROGRAM,
                 length=len(program) + extra_length, watchdog=watchdog, memory=memory,
                 check=check, soft_reset=soft_reset)
    if case is not None and case["expect"] != [list(DONE)]:
        raise AssertionError(f"the model expects {case['expect']} from a valid program: {name}")
    return case


@st.composite
def mutated_cases(draw, config):
    """A firmware matmul program with tokens flipped, instructions dropped, duplicated, swapped
    or corrupted, or cut short; windows and registers maybe broken as well."""
    m, k, n = draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    b_addr = DATA + -(-m * k // 64) * 64
    instructions = list(compile_matmul(config, m, k, n, a_addr=DATA, b_addr=b_addr,
                                       c_addr=OUTPUT).instructions)
    names = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "flip", "drop", "duplicate", "swap", "byte", "cut"]))
        i = draw(st.integers(0, len(instructions) - 1))
        if kind == "flip":
            bit = token_flag_bit(draw(st.sampled_from(TOKEN_FLAGS)))
            instructions[i] = with_bits(instructions[i], bit, 1, instructions[i][0] >> bit ^ 1)
        elif kind == "drop" and len(instructions) > 1:
            del instructions[i]
        elif kind == "duplicate":
            instructions.insert(i, instructions[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(instructions) - 1))
            instructions[i], instructions[j] = instructions[j], instructions[i]
        elif kind == "byte":
            at = draw(st.integers(0, INSTRUCTION_BYTES - 1))
            instructions[i] = (instructions[i][:at] + bytes([draw(st.integers(0, 255))])
                               + instructions[i][at + 1:])
        elif kind == "cut":
            instructions = instructions[:i + 1]
        names.append(f"{kind}@{i}")
    memory = [(DATA, draw(st.binary(min_size=m * k, max_size=m * k))),
              (b_addr, draw(st.binary(min_size=k * n, max_size=k * n)))]
    base, length = draw(_program_registers(len(instructions)))
    return _case(config, f"mutated matmul {m}x{k}x{n} {' '.join(names)}",
                 program=b"".join(instructions), windows=draw(_windows(config)), base=base,
                 length=length, watchdog=draw(st.sampled_from(WATCHDOGS)), memory=memory,
                 soft_reset=draw(st.booleans()))


@st.composite
def random_cases(draw, config):
    """Random instructions from the encoder: mostly sensible fields, sometimes broken ones,
    with no, few or many dependency tokens; maybe without END, or with garbage after it."""
    density = draw(st.sampled_from([0, 2, 4, 8]))
    instructions = draw(st.lists(_instruction(config, density), min_size=1, max_size=16))
    if draw(st.booleans()):
        instructions.append(Program().end().instructions[0])
    tail = draw(_rarely(st.just(b""), st.binary(min_size=64, max_size=512), 8))
    base, length = draw(_program_registers(len(instructions)))
    memory = [(DATA, draw(st.binary(min_size=64, max_size=256)))]
    return _case(config, f"random ({len(instructions)} instructions, token density {density})",
                 program=b"".join(instructions) + tail, windows=draw(_windows(config)), base=base,
                 length=length, watchdog=draw(st.sampled_from(WATCHDOGS)), memory=memory,
                 soft_reset=draw(st.booleans()))


@st.composite
def defect_cases(draw, config):
    """One LOAD or STORE made to stop the core with an error that random programs rarely reach
    first (each is checked before most others, or needs a tile placed just so): BAD_ELEMENT, an
    element size the engine does not move; STORE_WINDOW, a STORE into a read-only window. Or
    tiles that run past the top and wrap (`_wrap_case`): tensor tiles, or (on a core with the
    im2col walker) an im2col tile (`_wrapped_im2col`). Sizes, places and the rest of the program
    are random."""
    target = draw(st.sampled_from(["element", "store window", "wrap"]
                                  + ["im2col wrap"] * config.im2col))
    if target in ("wrap", "im2col wrap"):
        return draw(_wrap_case(config, im2col=target == "im2col wrap"))
    store = target == "store window" or target == "element" and draw(st.booleans())
    elem = 4 if store else 1
    if target == "element":
        elem = draw(st.sampled_from([1, 2, 8] if store else [2, 4, 8]))
    program = Program(config)
    lanes = config.cols if store else config.lanes
    extent, rows = draw(st.integers(1, lanes)), draw(st.integers(2, 3))
    dims = [Dim(extent=extent, bound=extent, stride=elem),
            Dim(extent=rows, bound=rows, stride=extent * elem)]
    # a store into DATA is outside every writable window
    area = OUTPUT if store and target == "element" else DATA
    base = area + elem * draw(st.integers(0, 256))
    descriptor = tensor(base, elem, draw(st.integers(0, 8)), dims)
    if store:
        program.store(descriptor)
    else:
        program.load(descriptor)
    what = f"{'STORE' if store else 'LOAD'} of {elem}-byte elements"
    program.end()
    return _case(config, f"defects {target} ({what} at {base:#x})", program=program.to_bytes(),
                 windows=_STANDARD_WINDOWS + [(*_top(config), True, True)], base=PROGRAM,
                 length=len(program), watchdog=draw(st.sampled_from(WATCHDOGS)),
                 memory=[(DATA, draw(st.binary(min_size=64, max_size=256)))],
                 soft_reset=draw(st.booleans()))


@st.composite
def _wrapped_im2col(draw, config, rows, low, low_space):
    """Im2colDescriptor fields of a ``rows``-row tile (``sram_row`` 0) of a convolution (stride
    and dilation 1, padding 0 or 1) over an (N, C, H, W) int8 tensor in NCHW order whose
    in-bounds elements run past the top of the address space (`_space`) and wrap
    (`isa.encode_im2col(wrap=True)`): either two
    images, image 0 in the last bytes of the address space and image 1 wrapped to ``low`` (in
    ``[low, low + low_space)``, or now and then elsewhere), the tile's rows from the last pixels
    of image 0 on into image 1 from a random kernel position; or the first tile of a contiguous
    tensor in the last bytes of the address space that crosses its top (its end at address
    0..). At least one in-bounds element of the tile lies past the top. Returns (fields, how
    it wraps)."""
    space = _space(config)
    two_images = draw(st.booleans())
    batch, channels, height, width = (2 if two_images else draw(st.integers(1, 2)),
                                      draw(st.integers(1, 3)), draw(st.integers(1, 6)),
                                      draw(st.integers(1, 6)))
    kernel_h, kernel_w = draw(st.integers(1, height)), draw(st.integers(1, width))
    padding = draw(st.integers(0, 1))
    out_height, out_width = height + 2 * padding - kernel_h + 1, width + 2 * padding - kernel_w + 1
    pixels, taps = out_height * out_width, channels * kernel_h * kernel_w
    image = channels * height * width
    m0, k0 = ((draw(st.integers(max(0, pixels - rows + 1), pixels - 1)),
               draw(st.integers(0, taps - 1))) if two_images else (0, 0))
    n0, (p0, q0) = m0 // pixels, divmod(m0 % pixels, out_width)
    c0, (r0, s0) = k0 // (kernel_h * kernel_w), divmod(k0 % (kernel_h * kernel_w), kernel_w)
    fields = {"base": 0, "sram_row": 0, "rows": rows,
              "lanes": draw(st.integers(1, config.lanes)),
              "batch": batch, "channels": channels, "height": height, "width": width,
              "out_height": out_height, "out_width": out_width, "kernel_h": kernel_h,
              "kernel_w": kernel_w, "conv_stride": 1, "dilation": 1, "padding": padding,
              "n0": n0, "p0": p0, "q0": q0, "c0": c0, "r0": r0, "s0": s0,
              "stride_n": image, "stride_c": height * width, "stride_h": width, "stride_w": 1}
    if two_images:
        top = space - image - draw(_rarely(st.integers(0, 16), st.integers(0, 0x3000), 4))
        target = draw(_rarely(st.integers(0, low_space - image).map(lambda k: low + k),
                              st.sampled_from([0x80000, OUTPUT, DATA, PROGRAM]), 4))
        fields.update(base=top, stride_n=(target - top) % space)
        how = f"images at {top:#x} and {target:#x}"
    else:
        furthest = _furthest(fields)
        assume(furthest > 0)  # else no element can lie past the top
        fields["base"] = space - draw(st.integers(1, furthest))
        how = f"contiguous from {fields['base']:#x}"
    # image 1 may be all padding in the tile's rows
    assume(_furthest(fields) >= space)
    return fields, f"im2col {kernel_h}x{kernel_w} pad {padding}, {how}"


def _furthest(fields):
    """The exact address (not wrapped) of the furthest in-bounds element of im2col ``fields``,
    0 if there is none."""
    return max((address for *_, address in im2col_elements(SimpleNamespace(**fields), wrap=None)),
               default=0)


@st.composite
def _wrapped_tile(draw, space, elem, extent, low, low_space, repeats):
    """A TMA-style tile of ``elem``-byte elements, ``extent`` x 2 x ``repeats``, whose
    in-bounds elements run past the top of the ``space``-byte address space and wrap: either
    its rows i1 = 0 in the last bytes of the address space and its rows i1 = 1 wrapped to
    ``low`` (in ``[low, low + low_space)``, or elsewhere), or a contiguous tile that crosses
    the top inside a row (its end at address 0..);
    sometimes with padding at its edges. Returns (tile fields, how it wraps)."""
    if draw(st.booleans()):  # rows i1 = 0 at the top, rows i1 = 1 low
        row_stride = elem * draw(st.sampled_from([extent, extent + 1, 8, 16]))
        span = extent * elem + (repeats - 1) * row_stride  # of the rows at either end
        top = space - span - elem * draw(_rarely(st.integers(0, 16),
                                                 st.integers(0, 0x3000), 4))
        target = draw(_rarely(st.integers(0, (low_space - span) // elem).map(
            lambda k: low + elem * k), st.sampled_from([0x80000, OUTPUT, DATA, PROGRAM]), 4))
        dims = [Dim(extent=extent, bound=extent, stride=elem),
                Dim(extent=2, bound=2, stride=(target - top) % space),
                Dim(extent=repeats, bound=repeats, stride=row_stride)]
        how = f"rows at {top:#x} and {target:#x}"
    else:  # contiguous, crossing the top after k elements
        count = extent * 2 * repeats
        top = space - elem * draw(st.integers(1, count - 1))
        dims = [Dim(extent=extent, bound=extent, stride=elem),
                Dim(extent=2, bound=2, stride=extent * elem),
                Dim(extent=repeats, bound=repeats, stride=2 * extent * elem)]
        how = f"contiguous from {top:#x}"
    if draw(_one_in(4)):  # padding: start a dim before the tensor, or bound it inside the tile
        d = draw(st.integers(0, 2))
        shift = draw(st.integers(1, 2))
        dim = dims[d]
        if draw(st.booleans()):
            dims[d] = Dim(extent=dim.extent, start=-shift, bound=dim.bound, stride=dim.stride)
            top = (top + shift * dim.stride) % space  # the tile stays where it was
        else:
            dims[d] = Dim(extent=dim.extent, bound=max(dim.extent - shift, 0), stride=dim.stride)
        how += f", padded in dim {d}"
    return tensor(top, elem, 0, dims), how


@st.composite
def _wrap_case(draw, config, im2col=False):
    """Tiles past the top of the address space (`isa.encode_tile(wrap=True)`,
    `isa.encode_im2col(wrap=True)`), whose addresses the core wraps modulo `_space` and checks
    against the windows there: a LOAD of
    weights W = I, a LOAD of activations (`_wrapped_tile`, or with ``im2col`` an im2col LOAD,
    `_wrapped_im2col`) and a STORE of the MATMUL's result (`_wrapped_tile`), between the window
    at the top of the address space (readable and writable) and DATA (the LOAD) or OUTPUT (the
    STORE), or address 0 (the program's window, at random writable or not; the program sits
    past the bytes a tile wraps to), and now and then to a window without the permission or to
    none. The model decides the outcome; where it expects done, the bytes of and around every
    element of the STORE's tile (padding or not) are checked: numpy's result, or what they were."""
    rows, cols, space = config.rows, config.cols, _space(config)
    repeats = draw(st.integers(1, 3))
    count = 2 * repeats  # tile rows: i1 + 2 * i2
    weights = DATA + 0x4000
    if im2col:
        act, act_how = draw(_wrapped_im2col(config, count, DATA, 0x1000))
    else:
        act, act_how = draw(_wrapped_tile(space, 1, draw(st.integers(1, config.lanes)), DATA,
                                          0x1000, repeats))
    out, out_how = draw(_wrapped_tile(space, 4, draw(st.integers(1, cols)), OUTPUT, 0x1000,
                                      repeats))
    act["sram_row"] = rows
    program = Program(config, wrap=True)
    program.load(tensor(weights, 1, 0, [Dim(extent=cols, bound=cols, stride=1),
                                         Dim(extent=rows, bound=rows, stride=cols)]))
    if im2col:
        program.load_im2col(act, Deps(push_next=True))
    else:
        program.load(act, Deps(push_next=True))
    program.matmul(0, rows, 0, count, deps=Deps(pop_prev=True, push_next=True))
    program.store(out, deps=Deps(pop_prev=True))
    program.end()
    base = PROGRAM + 0x1000
    # Random bytes wherever the activations may be read from: the top of the address space,
    # DATA and the bytes from address 0 on.
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    memory = [(space - 0x3100, rng.integers(0, 256, 0x3100, dtype=np.uint8).tobytes()),
              (DATA, rng.integers(0, 256, 0x1000, dtype=np.uint8).tobytes()),
              (PROGRAM, rng.integers(0, 256, 0x100, dtype=np.uint8).tobytes()),
              (weights, np.eye(rows, cols, dtype=np.int8).tobytes())]
    low_writable = draw(st.booleans())
    windows = [(PROGRAM, PROGRAM_SPACE, True, low_writable), *_STANDARD_WINDOWS[1:],
               (*_top(config), True, True)]
    case = _case(config, f"defects {'im2col ' if im2col else ''}wrap (LOAD {act_how}; "
                 f"STORE {out_how}; "
                 f"{'writable' if low_writable else 'read-only'} at 0)",
                 program=program.to_bytes(), windows=windows, base=base, length=len(program),
                 watchdog=draw(st.sampled_from(WATCHDOGS)), memory=memory,
                 soft_reset=draw(st.booleans()))
    if case is None or case["expect"] != [list(DONE)]:
        return case
    image, _ = _image([(base, program.to_bytes()), *memory])
    loaded = np.zeros((count, config.lanes), dtype=np.int64)  # zero: padding and past extent0
    if im2col:
        elements = im2col_elements(SimpleNamespace(**act), space)  # (row, lane, address)
    else:
        elements = ((i1 + 2 * i2, i0, address)
                    for (i0, i1, i2), address in _tile_elements(act, space))
    for i, j, address in elements:
        loaded[i, j] = (image[address % MEMORY_SIZE] ^ 0x80) - 0x80  # int8
    result = np.zeros((count, cols), dtype=np.int64)  # through W = I: lanes below min(rows, cols)
    usable = min(rows, cols)
    result[:, :usable] = loaded[:, :usable]
    for (i0, i1, i2), address in _tile_elements(out, space):
        at = address % MEMORY_SIZE
        image[at:at + 4] = int(result[i1 + 2 * i2, i0]).to_bytes(4, "little", signed=True)
    checked = []  # [first, end) around each run of the tile's elements, 64 bytes either side
    for address in sorted(address for _, address in _tile_elements(out, space, padding=True)):
        if checked and address < checked[-1][1] + 64:
            checked[-1][1] = min(address + 4 + 64, space)
        else:
            checked.append([max(address - 64, 0), min(address + 4 + 64, space)])
    case["check"] = [[first % MEMORY_SIZE,  # the memory's offsets: it wraps
                      bytes(image[first % MEMORY_SIZE:(end - 1) % MEMORY_SIZE + 1]).hex()]
                     for first, end in checked]
    return case


def _tile_elements(tile, space, padding=False):
    """((i0, i1, i2), address) of the in-bounds elements (and with ``padding`` the others) of a
    TMA-style ``tile`` of three dims (the fourth extent 1, start 0), addresses modulo
    ``space``."""
    dims = tile["dims"]
    for i2 in range(dims[2]["extent"]):
        for i1 in range(dims[1]["extent"]):
            for i0 in range(dims[0]["extent"]):
                coords = [d["start"] + i for d, i in zip(dims, (i0, i1, i2))]
                if padding or all(0 <= c < d["bound"] for c, d in zip(coords, dims)):
                    yield (i0, i1, i2), (tile["base"] + sum(
                        c * d["stride"] for c, d in zip(coords, dims))) % space


@st.composite
def raw_cases(draw, config):
    """Raw random bytes as a program."""
    count = draw(st.integers(1, 8))
    size = count * INSTRUCTION_BYTES
    program = draw(st.binary(min_size=size, max_size=size))
    base, length = draw(_program_registers(count))
    return _case(config, f"raw bytes ({count} instructions)", program=program,
                 windows=draw(_windows(config)), base=base, length=length,
                 watchdog=draw(st.sampled_from(WATCHDOGS)), soft_reset=draw(st.booleans()))


def limit_cases(config):
    """For each field an engine's queue saturates on a core of ``config``
    (`hdl.controller.saturated_fields`), one-instruction programs (a valid LOAD, STORE or
    MATMUL, then END) with that field at values around its limit ``2**k`` and at its largest:
    the core must end as the model, which reads every bit, says."""
    # Imported here: Hypothesis mixes the constants of every imported module into its draws
    # (`draw_cases`), and the other kinds' cases stay the same without the HDL's.
    from ..hdl.controller import ENGINES, saturated_fields
    program = Program(config)
    lanes, cols = config.lanes, config.cols
    program.load(tensor(DATA, 1, 0, [Dim(extent=lanes, bound=lanes, stride=1),
                                     Dim(extent=2, bound=2, stride=lanes)]))
    program.matmul(0, 0, 0, config.rows)
    program.store(tensor(OUTPUT, 4, 0, [Dim(extent=cols, bound=cols, stride=4),
                                        Dim(extent=2, bound=2, stride=4 * cols)]))
    valid = dict(zip(ENGINES, program.instructions))  # in chain order, as arch.Engine
    end = Program().end().instructions[0]
    windows = fit_windows(_STANDARD_WINDOWS, config.windows)
    cases = []
    for name, (opcodes, _) in ENGINES.items():
        for (offset, width), k in sorted(saturated_fields(config, opcodes).items()):
            for value in sorted({(1 << k) - 1, 1 << k, (1 << k) + 1, (1 << width) - 1}):
                raw = with_bits(valid[name], offset, width, value)
                case = _case(config, f"limit {name} bits {offset}+{width} = {value}",
                             program=raw + end, windows=windows, base=PROGRAM, length=2,
                             watchdog=WATCHDOGS[-1], memory=[(DATA, bytes(range(256)))])
                if case is not None:
                    cases.append(case)
    return cases


KINDS = {"matmul": (matmul_cases, 1), "conv2d": (conv2d_cases, 1), "raw": (raw_cases, 1),
         "mutated": (mutated_cases, 2), "random": (random_cases, 3), "defects": (defect_cases, 1)}
"""Kinds of case (see the module docstring): the strategy of each, and its share of `cases`."""


def _draw_kind(strategy, count):
    drawn = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy.filter(lambda case: case is not None))
    def collect(case):
        drawn.append(case)

    if count:
        collect()
    return drawn


def draw_cases(count, config):
    """About ``count`` cases for ``config``, each kind of `KINDS` in its share and drawn on its
    own (drawn together, hypothesis leans to some kinds and may leave one out), in a fixed mixed
    order. Hypothesis draws the same cases each time (``derandomize``) only among the same
    imported modules: it mixes the constants of the project's modules imported so far into its
    draws. `draw_cases_apart` draws in a process of its own."""
    total = sum(share for _, share in KINDS.values())
    drawn = [case for kind, share in KINDS.values()
             for case in _draw_kind(kind(config), round(count * share / total))]
    random.Random(count).shuffle(drawn)
    return drawn


def draw_cases_apart(count, config):
    """`draw_cases` in a new Python process, which imports only this module: the same cases for
    the same ``count``, ``config`` and tpugen, whatever the caller imported or ran before (a
    fuzz case that fails in a whole test run fails when its test runs alone)."""
    script = ("import json, sys; from tpugen import CoreConfig; "
              "from tpugen.sim.fuzz import draw_cases; "
              "print(json.dumps(draw_cases(int(sys.argv[1]), CoreConfig.from_json(sys.argv[2]))))")
    result = subprocess.run([sys.executable, "-c", script, str(count), config.to_json()],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"drawing fuzz cases failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


def cases(config):
    """Cases of every kind in their shares of `KINDS`: a ninth each valid matmuls, valid
    conv2d, raw bytes and `defect_cases`, two ninths mutated firmware programs, a third random
    ones."""
    kinds = [kind for kind, share in KINDS.values() for _ in range(share)]
    return (st.sampled_from([kind(config) for kind in kinds]).flatmap(lambda kind: kind)
            .filter(lambda case: case is not None))
