"""Program fuzzing of the whole core: hypothesis strategies for cases.

A *case* is plain data (JSON): memory contents, access windows, PROGRAM_BASE, PROGRAM_LENGTH
and WATCHDOG, the outcomes the core may end with, a bound on its cycles (and the instructions
fetched) and, for valid programs, the expected bytes of the output window. `cases` draws them:
tiled matmuls and conv2d (padding, strides, epilogues) from the firmware, those programs
mutated (tokens flipped, instructions dropped, duplicated, swapped, corrupted, truncated),
random instructions from the encoder with mostly sensible and sometimes broken fields, single
LOADs and STOREs made to reach the errors that random programs rarely reach first, and raw
random bytes.

The outcome model, `predict`, is `sim/fuzz_model.py`.
"""
import functools

import numpy as np
from hypothesis import strategies as st

from ..arch import TOKEN_FLAGS, TOKEN_LIMIT, Engine, token_flag_bit
from ..firmware.epilogue import Epilogue
from ..firmware.conv2d import compile_conv2d, conv2d_lowering, conv2d_output_shape, conv2d_weights
from ..firmware.device import fit_windows
from ..firmware.matmul import compile_matmul
from ..firmware.program import Deps, Dim, Program, tensor
from ..isa import INSTRUCTION_BYTES, Opcode, SoftmaxInstruction, SoftmaxMode, TensorDescriptor
from .fuzz_model import DONE, MEMORY_SIZE, predict
from .golden import apply_epilogue, conv2d_int32, matmul_int32

__all__ = ["KINDS", "cases", "defect_cases"]

PROGRAM, PROGRAM_SPACE = 0x00000, 0x2000
DATA, DATA_SPACE = 0x10000, 0x8000
OUTPUT, OUTPUT_SPACE = 0x20000, 0x8000
TOP, TOP_SPACE = (1 << 32) - 0x10000, 0x10000
"""The last 64 KiB of the address space: tiles there run past 4 GiB (ADDRESS_OVERFLOW)."""
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
    edge, anywhere in 4 GiB, or just below 4 GiB."""
    last = max(inside_base, inside_base + inside_size - span - 1)
    end = inside_base + inside_size
    return _rarely(st.integers(inside_base, min(last, (1 << 32) - 1)), st.one_of(
        st.integers(end - 64, min(end + 64, (1 << 32) - 1)), _U32,
        st.integers((1 << 32) - 4096, (1 << 32) - 1)), one_in)


@st.composite
def _dims(draw, max_extent0, max_rows, elem_bytes, odds, walked):
    """Dims past the ``walked`` ones (`CoreConfig.descriptor_dims`) mostly extent 1, start 0."""
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
def _epilogue_fields(draw):
    requant = draw(st.booleans())
    pool = draw(_rarely(st.just(False), st.just(True), 6))
    return {"bias": int(draw(st.booleans())), "requant": int(requant),
            "relu": int(draw(st.booleans())), "pool": int(pool),
            "pool_pitch": draw(st.integers(0, 6)) if pool else 0,
            "per_row": int(draw(_rarely(st.just(False), st.just(True), 4)))}


def _with_bits(raw, offset, width, value):
    """Instruction bytes ``raw`` with bits [offset, offset + width) set to ``value``."""
    bits = int.from_bytes(raw, "little")
    mask = ((1 << width) - 1) << offset
    bits = bits & ~mask | (value << offset) & mask
    return bits.to_bytes(len(raw), "little")


@st.composite
def _instruction(draw, config, density):
    """Encoded bytes of one random instruction: sensible fields, edge values now and then, and
    in half of them one kind of field (`DEFECTS`) often broken."""
    kind = draw(st.sampled_from(["load"] * 6 + ["im2col", "params", "softmax", "end"] * 2
                                + ["matmul", "store"] * 4 + ["unknown"]))
    odds = _odds(draw(st.sampled_from([None] * len(DEFECTS) + list(DEFECTS))))
    deps = draw(_deps(density))
    program = Program()
    sp_rows, acc_rows = config.scratchpad_rows, config.accumulator_rows

    def rows(limit, used):
        return draw(_rarely(st.integers(0, max(limit - used, 0)), _U16, odds["sram"]))

    if kind == "load":
        elem = draw(_rarely(st.just(1), _ELEMENTS, odds["element"]))
        area = draw(_rarely(st.just((DATA, DATA_SPACE)), st.just((TOP, TOP_SPACE)), 8))
        program.load(draw(_descriptor(config.lanes, sp_rows, area, elem, odds,
                                      config.descriptor_dims)), deps)
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
        epilogue = draw(_epilogue_fields())
        elem = draw(_rarely(st.just(1 if epilogue["requant"] else 4), _ELEMENTS, odds["element"]))
        area = draw(_rarely(st.just((OUTPUT, OUTPUT_SPACE)), st.just((TOP, TOP_SPACE)), 8))
        program.store(draw(_descriptor(config.cols, acc_rows, area, elem, odds,
                                       config.descriptor_dims)), epilogue, deps)
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
            program.instructions[0] = _with_bits(program.instructions[0],
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
def _windows(draw):
    """The standard program, data and output windows, sometimes shrunk, disabled, shifted or
    with other permissions, and sometimes a fourth: random, or ``TOP``."""
    windows = []
    for base, size, readable, writable in _STANDARD_WINDOWS:
        if draw(_rarely(st.just(False), st.just(True), 6)):
            base = (base + draw(st.sampled_from([0, 0, 4, 8, 64, -64]))) % (1 << 32)
            size = draw(st.sampled_from([0, 64, 192, size // 2, size - 4, size + 64]))
            readable, writable = draw(st.sampled_from([(True, False), (False, True), (True, True),
                                                       (False, False)]))
        windows.append((base, size, readable, writable))
    if draw(_rarely(st.just(False), st.just(True), 4)):
        base, size = draw(st.one_of(st.just((TOP, TOP_SPACE)),
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


def _case(config, name, *, program, windows, base, length, watchdog, memory=(), check=(),
          soft_reset=True):
    """A case dict, or None when it is not fit to run (too long, tokens past their counters,
    or stores that could overwrite instructions)."""
    writes = []  # (offset, bytes) inside the memory, which addresses wrap around
    for address, content in [(base, program), *memory]:
        at = address % MEMORY_SIZE
        writes += [(at, content[:MEMORY_SIZE - at])] + ([(0, content[MEMORY_SIZE - at:])]
                                                         if len(content) > MEMORY_SIZE - at else [])
    image = bytearray(MEMORY_SIZE)
    for at, content in writes:
        image[at:at + len(content)] = content
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
    epilogue = Epilogue.from_options(n, **options)
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
    epilogue = Epilogue.from_options(k, **options)
    lowering = draw(st.sampled_from([None, "im2col"])) or conv2d_lowering(config, x_shape, w_shape,
                                                                        epilogue)
    x, w = _random_bytes(draw, x_shape), _random_bytes(draw, w_shape)
    w_addr = DATA + -(-x.size // 64) * 64
    program = compile_conv2d(config, x_shape, w_shape, **conv, x_addr=DATA, w_addr=w_addr,
                             y_addr=OUTPUT, epilogue=epilogue, lowering=lowering)
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
            instructions[i] = _with_bits(instructions[i], bit, 1, instructions[i][0] >> bit ^ 1)
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
                 program=b"".join(instructions), windows=draw(_windows()), base=base,
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
                 program=b"".join(instructions) + tail, windows=draw(_windows()), base=base,
                 length=length, watchdog=draw(st.sampled_from(WATCHDOGS)), memory=memory,
                 soft_reset=draw(st.booleans()))


@st.composite
def defect_cases(draw, config):
    """One LOAD or STORE made to stop the core with an error that random programs rarely reach
    first (each is checked before most others, or needs a tile placed just so): BAD_ELEMENT, an
    element size the engine does not move; ADDRESS_OVERFLOW, a tile that runs past 4 GiB inside
    a window at the top of the address space; STORE_WINDOW, a STORE into a read-only window.
    Sizes, places and the rest of the program are random."""
    target = draw(st.sampled_from(["element", "overflow", "store window"]))
    store = target == "store window" or draw(st.booleans())
    elem = 4 if store else 1
    if target == "element":
        elem = draw(st.sampled_from([1, 2, 8] if store else [2, 4, 8]))
    lanes = config.cols if store else config.lanes
    extent, rows = draw(st.integers(1, lanes)), draw(st.integers(2, 3))
    dims = [Dim(extent=extent, bound=extent, stride=elem),
            Dim(extent=rows, bound=rows, stride=extent * elem)]
    if target == "overflow":  # some of the tile's elements lie past 2**32
        base = (1 << 32) - elem * draw(st.integers(1, extent * rows - 1))
    else:  # a store into DATA is outside every writable window
        area = OUTPUT if store and target == "element" else DATA
        base = area + elem * draw(st.integers(0, 256))
    descriptor = tensor(base, elem, draw(st.integers(0, 8)), dims)
    program = Program()
    if store:
        program.store(descriptor)
    else:
        program.load(descriptor)
    program.end()
    return _case(config, f"defects {target} ({'STORE' if store else 'LOAD'} of {elem}-byte "
                 f"elements at {base:#x})", program=program.to_bytes(),
                 windows=_STANDARD_WINDOWS + [(TOP, TOP_SPACE, True, True)], base=PROGRAM,
                 length=len(program), watchdog=draw(st.sampled_from(WATCHDOGS)),
                 memory=[(DATA, draw(st.binary(min_size=64, max_size=256)))],
                 soft_reset=draw(st.booleans()))


@st.composite
def raw_cases(draw, config):
    """Raw random bytes as a program."""
    count = draw(st.integers(1, 8))
    size = count * INSTRUCTION_BYTES
    program = draw(st.binary(min_size=size, max_size=size))
    base, length = draw(_program_registers(count))
    return _case(config, f"raw bytes ({count} instructions)", program=program,
                 windows=draw(_windows()), base=base, length=length,
                 watchdog=draw(st.sampled_from(WATCHDOGS)), soft_reset=draw(st.booleans()))


KINDS = {"matmul": (matmul_cases, 1), "conv2d": (conv2d_cases, 1), "raw": (raw_cases, 1),
         "mutated": (mutated_cases, 2), "random": (random_cases, 3), "defects": (defect_cases, 1)}
"""Kinds of case (see the module docstring): the strategy of each, and its share of `cases`."""


def cases(config):
    """Cases of every kind in their shares of `KINDS`: a ninth each valid matmuls, valid
    conv2d, raw bytes and `defect_cases`, two ninths mutated firmware programs, a third random
    ones."""
    kinds = [kind for kind, share in KINDS.values() for _ in range(share)]
    return (st.sampled_from([kind(config) for kind in kinds]).flatmap(lambda kind: kind)
            .filter(lambda case: case is not None))
