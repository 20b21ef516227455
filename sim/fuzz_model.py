"""The outcome model of program fuzzing (`sim/fuzz.py` draws the cases; no hypothesis here).

`predict` is the model of the outcome. Each instruction's own result is exact: the descriptor
checks in the hardware's order (``TileCheck``, the MATMUL and SOFTMAX checks, the im2col
check), then a walk of every in-bounds element, in order, against the windows (every DMA
address, a tensor descriptor's or an im2col element's, wraps modulo 2**`CoreConfig.address_width`
and is checked there;
ADDRESS_OVERFLOW is retired and never predicted).
The controller is modelled as in-order queues of ``config.queue_depth`` instructions per
engine fed by an in-order fetcher, and VTA-style tokens between neighbouring engines. (An
engine runs what it takes to its end without waiting for anything, so whether its queue's slot
holds while it runs (without `CoreConfig.store_prefetch` or `CoreConfig.load_prefetch`) changes
when the next instruction is queued, not whether.) With one
consumer per token counter the model's final state does not depend on timing, so a program that
errs nowhere must end done, or with WATCHDOG blaming the oldest instruction waiting for a token.
When some reachable instruction errs, the core must stop with one of those errors (which one
comes first depends on timing), at that instruction's index.
"""
import functools
import itertools
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Shape
from amaranth.lib import data

from ..arch import (OPCODE_ENGINE, SOFTMAX_DIVIDE_CYCLES, Engine, block_query_cycles, opcode_of,
                    supported_opcodes)
from ..isa import DIMS, INSTRUCTION_BYTES, ErrorCode, Header, Opcode, SoftmaxMode, instruction_layout

__all__ = ["DONE", "FETCH_CYCLES", "MEMORY_SIZE", "Prediction", "im2col_elements",
           "predict"]

MEMORY_SIZE = 1 << 20
"""Bytes of the testbench's memory; addresses wrap around it."""
FETCH_CYCLES = 40
"""Upper bound of one instruction fetch and dispatch, in cycles."""
DONE = ("NONE", None)
"""The outcome of a program that reaches END."""


@dataclass(frozen=True)
class _Step:
    """One instruction as the controller sees it."""
    engine: Engine
    pop_prev: bool
    pop_next: bool
    push_prev: bool
    push_next: bool
    error: ErrorCode
    cycles: int
    written: tuple = ()  # (first, last) byte ranges a STORE writes before any error


@dataclass(frozen=True)
class Prediction:
    outcomes: frozenset
    """(ErrorCode name, error index) pairs the core may end with; ``DONE`` for done."""
    cycles: int
    """Upper bound of the cycles to the interrupt without memory stalls."""
    fetched: int
    """Instructions the fetcher may queue."""
    written: tuple
    """(first, last) byte ranges that STOREs may write (between them, nothing)."""
    tokens: int
    """The largest token count reached."""
    reaches_end: bool
    """The fetcher reaches END (or PROGRAM_LENGTH) unless an engine error stops it first."""


def _window_ok(windows, address, size, permission):
    """``hdl/walker.py`` window_ok: [address, address + size) inside an enabled window."""
    flag = 2 if permission == "read" else 3
    return any(w[1] != 0 and w[flag] and w[0] <= address and address + size <= w[0] + w[1]
               for w in windows)


def _walk(config, addresses, windows, permission):
    """The first error of a DMA walk over in-bounds element ``addresses`` (in order, already
    wrapped modulo ``2**config.address_width``: `_tensor_addresses`, `_im2col_addresses`), and
    the addresses that pass before it: each element's beat is checked against the windows at
    its wrapped address (a window past the address space has no address in it)."""
    passed = []
    beat_bytes = config.axi_data_width // 8
    for address in addresses:
        assert 0 <= address < 1 << config.address_width, address
        if not _window_ok(windows, address - address % beat_bytes, beat_bytes, permission):
            code = ErrorCode.LOAD_WINDOW if permission == "read" else ErrorCode.STORE_WINDOW
            return code, passed
        passed.append(address)
    return ErrorCode.NONE, passed


def _ranges(addresses, size):
    """(first, last) byte ranges covering ``size``-byte elements at ``addresses``: one per run of
    elements less than 64 bytes apart (a tile wrapped past 4 GiB writes at both ends)."""
    ranges = []
    for address in sorted(addresses):
        if ranges and address <= ranges[-1][1] + 64:
            ranges[-1][1] = max(ranges[-1][1], address + size - 1)
        else:
            ranges.append([address, address + size - 1])
    return tuple(map(tuple, ranges))


def _extents(desc):
    return [desc.dims[d].extent for d in range(DIMS)]


def _tensor_addresses(config, desc):
    """Addresses of the in-bounds elements of a tensor descriptor, dim 0 fastest: element
    (i0..i3) is in bounds when ``lo_d <= i_d < hi_d`` for every d (the raw 16-bit fields, so
    ``lo >= hi`` or ``lo >= extent`` makes every element padding) and sits at ``(address +
    sum(i_d * stride_d)) mod 2**config.address_width``. A dim past
    ``CoreConfig.descriptor_dims`` has extent 1 (else `_tile_check` refused the descriptor), so
    its index is 0 and its stride adds nothing: its only element is in bounds when ``lo == 0
    and hi != 0``, as the walker checks."""
    dims = [desc.dims[d] for d in range(DIMS)]
    for index in itertools.product(*(range(d.extent) for d in reversed(dims))):
        index = index[::-1]  # i0 first
        if all(d.lo <= i < d.hi for d, i in zip(dims, index)):
            yield ((desc.address + sum(i * d.stride for d, i in zip(dims, index)))
                   % (1 << config.address_width))


def _tile_check(config, desc, max_extent0, rows, elem_log2s, pool=False, pitch=0):
    """``hdl/walker.py`` TileCheck: the descriptor's error before any access. A dim past
    ``config.descriptor_dims`` must have extent 1 (whatever its lo, hi and stride); the
    address and the walked dims' strides must be multiples of the element size."""
    e = _extents(desc)
    walked = config.descriptor_dims
    if desc.elem_log2 not in elem_log2s:
        return ErrorCode.BAD_ELEMENT
    if (0 in e or desc.lane + e[0] > max_extent0 or pool and (e[3] != 1 or pitch == 0)
            or any(e[d] != 1 for d in range(walked, DIMS))):
        return ErrorCode.BAD_EXTENT
    used = pitch * (2 * e[2] - 1) * e[3] + 2 * e[1] if pool else e[1] * e[2] * e[3]
    if desc.sram_row + used > rows:
        return ErrorCode.SRAM_RANGE
    mask = (1 << desc.elem_log2) - 1
    if any(v & mask for v in [desc.address] + [desc.dims[d].stride for d in range(walked)]):
        return ErrorCode.MISALIGNED
    return ErrorCode.NONE


def im2col_elements(d, wrap=1 << 32):
    """(row, lane, address) of the in-bounds elements of an im2col tile ``d`` (a namespace of
    `Im2colDescriptor` fields), in walk order (``Im2colWalker``): row ``i`` and lane ``j`` of
    the tile, and ``base + n * stride_n + c * stride_c + h * stride_h + w * stride_w`` modulo
    ``wrap`` (2**32, as the core walks it; None: the exact sum)."""
    n, p, q = d.n0, d.p0, d.q0
    for i in range(d.rows):
        c, r, s = d.c0, d.r0, d.s0
        for j in range(d.lanes):
            h = p * d.conv_stride - d.padding + r * d.dilation
            w = q * d.conv_stride - d.padding + s * d.dilation
            if n < d.batch and c < d.channels and 0 <= h < d.height and 0 <= w < d.width:
                address = (d.base + n * d.stride_n + c * d.stride_c + h * d.stride_h
                           + w * d.stride_w)
                yield i, j, address % wrap if wrap else address
            s, r, c = ((s + 1, r, c) if s + 1 < d.kernel_w else
                       (0, r + 1, c) if r + 1 < d.kernel_h else (0, 0, c + 1))
        q, p, n = ((q + 1, p, n) if q + 1 < d.out_width else
                   (0, p + 1, n) if p + 1 < d.out_height else (0, 0, n + 1))


def _im2col_addresses(config, d):
    """The addresses of `im2col_elements` on a core of ``config``, in walk order."""
    return (address for _, _, address in im2col_elements(d, 1 << config.address_width))


def _load(config, instr, windows):
    if instr.header.im2col and not config.im2col:
        return ErrorCode.UNKNOWN_OPCODE, 40
    if instr.header.im2col:
        d = instr.im2col
        if (0 in (d.rows, d.lanes, d.kernel_h, d.kernel_w, d.conv_stride)
                or d.lanes > config.lanes):
            return ErrorCode.BAD_EXTENT, 40
        if d.sram_row + d.rows > config.scratchpad_rows:
            return ErrorCode.SRAM_RANGE, 40
        return _walk(config, _im2col_addresses(config, d), windows, "read")[0], \
            80 + 3 * d.rows * d.lanes
    desc = instr.tensor
    code = _tile_check(config, desc, config.lanes, config.scratchpad_rows, (0,))
    if code != ErrorCode.NONE:
        return code, 60
    e = _extents(desc)
    cycles = 60 + 3 * e[0] * e[1] * e[2] * e[3]
    return _walk(config, _tensor_addresses(config, desc), windows, "read")[0], cycles


def _store(config, instr, windows):
    desc, epilogue = instr.tensor, instr.epilogue
    if (epilogue.row_scale and not config.softmax
            or epilogue.pool and not config.epilogue_pool):
        return ErrorCode.UNKNOWN_OPCODE, 10, ()
    if not (desc.elem_log2 == 2 or epilogue.requant and desc.elem_log2 == 0):
        return ErrorCode.BAD_ELEMENT, 10, ()
    e = _extents(desc)
    two_d = all(e[d] == 1 for d in range(2, config.descriptor_dims))
    if (epilogue.per_row and (epilogue.pool or e[1] > config.cols or not two_d)
            or epilogue.row_scale and (not epilogue.requant or epilogue.pool
                                       or epilogue.per_row or not two_d)):
        return ErrorCode.BAD_EXTENT, 10, ()
    code = _tile_check(config, desc, config.cols, config.accumulator_rows, (0, 2),
                       bool(epilogue.pool), epilogue.pool_pitch)
    if code == ErrorCode.NONE and epilogue.row_scale and (
            epilogue.scale_row + e[1] > config.probability_rows):
        code = ErrorCode.SRAM_RANGE
    if code != ErrorCode.NONE:
        return code, 60, ()
    code, passed = _walk(config, _tensor_addresses(config, desc), windows, "write")
    written = _ranges(passed, 1 << desc.elem_log2)
    return code, 60 + 6 * e[0] * e[1] * e[2] * e[3], written


def _matmul(config, instr):
    act_rows = config.probability_rows if instr.act_probabilities else config.scratchpad_rows
    if instr.count == 0:
        code = ErrorCode.BAD_EXTENT
    elif (instr.weight_row + config.rows > config.scratchpad_rows
          or instr.act_row + ((instr.count - 1) << instr.act_stride_log2) >= act_rows
          or instr.acc_row + instr.count > config.accumulator_rows):
        code = ErrorCode.SRAM_RANGE
    elif instr.act_probabilities and not config.softmax:  # no probability buffer
        code = ErrorCode.UNKNOWN_OPCODE
    else:
        code = ErrorCode.NONE
    return code, 40 + 2 * (instr.count + config.rows + config.cols)


def _softmax(config, instr):
    mode = instr.mode
    block = mode == SoftmaxMode.BLOCK.value
    acc_rows, prob_rows = config.accumulator_rows, config.probability_rows
    if mode not in (SoftmaxMode.BLOCK.value, SoftmaxMode.NORMALIZE.value):
        code = ErrorCode.UNKNOWN_OPCODE
    elif instr.count == 0 or block and (instr.o_tiles == 0 or instr.tiles == 0):
        code = ErrorCode.BAD_EXTENT
    elif (instr.state_row + instr.count > prob_rows
          or block and (instr.o_row + instr.o_tiles * instr.count > acc_rows
                        or instr.score_row + instr.tiles * instr.count > acc_rows
                        or instr.p_row + instr.tiles * instr.count > prob_rows)):
        code = ErrorCode.SRAM_RANGE
    else:
        code = ErrorCode.NONE
    per_query = (block_query_cycles(instr.tiles, instr.o_tiles, first=False, hit=False) if block
                 else SOFTMAX_DIVIDE_CYCLES)
    return code, 60 + 2 * instr.count * per_query


@functools.cache
def _unpacker(layout):
    """A function from bits to the fields of ``layout`` as plain integers (namespaces and lists
    for structs and arrays): `isa.decode`'s views are too slow for fuzzing."""
    if isinstance(layout, data.StructLayout):
        fields = [(name, field.offset, _unpacker(field.shape)) for name, field in layout]
        return lambda bits: SimpleNamespace(**{name: unpack(bits >> offset)
                                               for name, offset, unpack in fields})
    if isinstance(layout, data.ArrayLayout):
        unpack, size = _unpacker(layout.elem_shape), Shape.cast(layout.elem_shape).width
        return lambda bits: [unpack(bits >> (i * size)) for i in range(layout.length)]
    shape = Shape.cast(layout)
    mask, sign = (1 << shape.width) - 1, 1 << (shape.width - 1)
    if shape.signed:
        return lambda bits: ((bits & mask) ^ sign) - sign
    return lambda bits: bits & mask


def _instruction_step(config, raw, windows):
    """The `_Step` of instruction bytes ``raw`` (an opcode of an engine)."""
    opcode = opcode_of(raw)
    bits = int.from_bytes(raw, "little")
    header = _unpacker(Header)(bits)
    instr = _unpacker(instruction_layout(opcode, header.im2col))(bits)
    written = ()
    if opcode == Opcode.LOAD:
        code, cycles = _load(config, instr, windows)
    elif opcode == Opcode.STORE:
        code, cycles, written = _store(config, instr, windows)
    elif opcode == Opcode.MATMUL:
        code, cycles = _matmul(config, instr)
    elif opcode == Opcode.SOFTMAX:
        code, cycles = _softmax(config, instr)
    else:
        code, cycles = ErrorCode.NONE, 10
    engine = OPCODE_ENGINE[opcode]
    return _Step(engine=engine, error=code, cycles=cycles, written=written,
                 pop_prev=engine != Engine.LOAD and bool(header.pop_prev),
                 pop_next=engine != Engine.STORE and bool(header.pop_next),
                 push_prev=engine != Engine.LOAD and bool(header.push_prev),
                 push_next=engine != Engine.STORE and bool(header.push_next))


def predict(config, image, windows, program_base, program_length, watchdog):
    """What the core must do with the memory ``image`` (MEMORY_SIZE bytes), ``windows`` (base,
    size, readable, writable) and the program registers: a `Prediction`. A core has only the
    first ``config.windows`` windows; the others' registers ignore what the host writes."""
    windows = windows[:config.windows]
    supported = supported_opcodes(config)
    queues = [deque() for _ in Engine]
    forward = [0] * (len(Engine) - 1)   # forward[i]: tokens from engine i to i + 1
    backward = [0] * (len(Engine) - 1)  # backward[i]: tokens from engine i + 1 to i
    errors = set()
    written = []
    pc, fetching, ended = 0, True, False
    cycles = most_tokens = 0
    moved = True
    while moved:
        moved = False
        for engine, queue in enumerate(queues):
            while queue:
                index, step = queue[0]
                if (step.pop_prev and forward[engine - 1] == 0
                        or step.pop_next and backward[engine] == 0):
                    break
                queue.popleft()
                moved = True
                if step.pop_prev:
                    forward[engine - 1] -= 1
                if step.pop_next:
                    backward[engine] -= 1
                # An instruction that errs also "completes" here: the model then reaches every
                # instruction the core could reach before its first error.
                if step.push_prev:
                    backward[engine - 1] += 1
                if step.push_next:
                    forward[engine] += 1
                most_tokens = max(most_tokens, *forward, *backward)
                cycles += step.cycles
                if step.error != ErrorCode.NONE:
                    errors.add((step.error.name, index))
                written += step.written
        if not fetching:
            continue
        address = (program_base + pc * INSTRUCTION_BYTES) % (1 << config.address_width)
        fault = None
        if pc == program_length < 1 << config.index_width:  # a longer length is no limit
            fetching, ended = False, True
        elif program_base % INSTRUCTION_BYTES:
            fault = ErrorCode.MISALIGNED
        elif not _window_ok(windows, address, INSTRUCTION_BYTES, "read"):
            fault = ErrorCode.PROGRAM_WINDOW
        else:
            offset = address % MEMORY_SIZE
            raw = bytes(image[offset:offset + INSTRUCTION_BYTES])
            opcode = opcode_of(raw)
            if opcode == Opcode.END:
                fetching, ended = False, True
            elif opcode not in supported:  # no opcode, or one the core lacks
                fault = ErrorCode.UNKNOWN_OPCODE
            else:
                step = _instruction_step(config, raw, windows)
                if len(queues[step.engine]) < config.queue_depth:  # else the fetcher waits
                    queues[step.engine].append((pc, step))
                    pc += 1
                    cycles += FETCH_CYCLES
                    moved = True
        if fault is not None:
            errors.add((fault.name, pc))
            fetching = False
        if not fetching:
            moved = True  # one more pass for the engines, without the fetcher
    cycles += FETCH_CYCLES + 500
    if errors:  # at the indices the core counts (none of its runs here reaches the wrap)
        outcomes = {(name, index % (1 << config.index_width)) for name, index in errors}
    elif ended and not any(queues):
        outcomes = {DONE}
    else:
        outcomes = {(ErrorCode.WATCHDOG.name, min(q[0][0] for q in queues if q))}
        cycles += watchdog
    return Prediction(outcomes=frozenset(outcomes), cycles=cycles, fetched=pc,
                      written=tuple(written), tokens=most_tokens, reaches_end=ended)
