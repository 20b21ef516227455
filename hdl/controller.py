"""Controller: fetches the program, dispatches to the engines under dependency tokens, watches."""
from amaranth.hdl import Array, Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ..arch import (ENGINE_OPCODES, TOKEN_BITS, TOKEN_FLAGS, TOKEN_LIMIT, Engine, pending_depth,
                    supported_opcodes, token_flag_bit)
from ..isa import (DIMS, INSTRUCTION_BITS, INSTRUCTION_BYTES, PARAMS_PER_INSTRUCTION, Dim,
                   EpilogueParams, ErrorCode, Header, Opcode, ParamsInstruction, defined_bits,
                   instruction_layout, window_layout)
from .axi import AXI_BURST_INCR, AXI_RESP_OKAY, axi_read_signature
from .engine import engine_members
from .execute import EXECUTE_INSTRUCTION
from .family import fpga_family
from .load import LOAD_INSTRUCTION, load_front_client
from .pipeline import pipeline_register, ring_next
from .store import STORE_INSTRUCTION, params_shift, store_front_client
from .walker import window_ok

__all__ = ["Controller", "ENGINES", "FETCH_ID", "InstructionQueue", "kept_bits", "queued",
           "saturated_fields"]

FETCH_ID = 1
"""ARID of instruction fetches (the load engine reads with ARID 0)."""

_ENGINE_LAYOUTS = {Engine.LOAD: LOAD_INSTRUCTION, Engine.EXECUTE: EXECUTE_INSTRUCTION,
                  Engine.STORE: STORE_INSTRUCTION}
ENGINES = {engine.name.lower(): (ENGINE_OPCODES[engine], _ENGINE_LAYOUTS[engine]) for engine in Engine}
"""Engine ports by name, in chain order (`arch.Engine`), with the opcodes each one runs and the
instruction layout it takes."""


def kept_bits(config, opcodes):
    """The bit offsets an engine's queue keeps of each instruction: those of the defined fields
    (`isa.defined_bits`) of the layouts among ``opcodes`` that a core of ``config`` runs (an
    im2col LOAD only with ``config.im2col``), less the strides of the tensor dims its walkers
    do not walk (``config.descriptor_dims``), the bits of addresses and strides from
    ``config.address_width`` on (addresses wrap below them), without the softmax unit a STORE's
    ``scale_row`` and without pooling its ``pool_pitch``, and the PARAMS entries the epilogue
    never reads (`_unread_params`). The engine reads the others as zero; it ignores them
    (reserved fields, those fields) or never gets an instruction that has them."""
    dropped = {offset + bit for (offset, width), k in saturated_fields(config, opcodes).items()
               for bit in range(k + 1, width)}
    return frozenset().union(*(_defined_bits(config, layout)
                               for _, layout in _queued_layouts(config, opcodes))) - dropped


def _queued_layouts(config, opcodes):
    """(opcode, layout) of each instruction layout of ``opcodes`` that a core of ``config``
    runs (an im2col LOAD only with ``config.im2col``)."""
    supported = supported_opcodes(config)
    return [(op, instruction_layout(op, im2col)) for op in opcodes if op in supported
            for im2col in sorted({False, op == Opcode.LOAD and config.im2col})]


def _defined_bits(config, layout):
    """The bit offsets of ``layout`` that a queue of a core of ``config`` keeps, before
    `saturated_fields`."""
    return (defined_bits(layout) - _unwalked_strides(config, layout)
            - _high_address_bits(config, layout) - _unused_epilogue_fields(config, layout)
            - _unread_params(config, layout))


def saturated_fields(config, opcodes):
    """{(offset, width): k}: the fields of the instructions of ``opcodes`` that an engine's
    queue keeps as ``min(value, 2**k)``, in ``k + 1`` bits, of a core of ``config``.

    An engine treats every value from ``2**k`` on as it treats ``2**k`` (`_saturations`: a
    row, lane, extent or bound past its SRAM is an error, or beyond every index), so an
    instruction runs as it does on a core with every bit. A field saturates only where no
    other layout of the queue keeps a bit (a PARAMS entry over a STORE's fields, an im2col
    LOAD over a LOAD's)."""
    layouts = _queued_layouts(config, opcodes)
    fields = {}
    for op, layout in layouts:
        others = frozenset().union(*(_defined_bits(config, other)
                                     for _, other in layouts if other is not layout))
        for (offset, width), limit in _saturations(config, op, layout).items():
            k = ceil_log2(limit)
            if k + 1 < width and not others & set(range(offset, offset + width)):
                fields[offset, width] = k
    return fields


def _saturations(config, opcode, layout):
    """{(offset, width): limit}, a power of two, of the fields of ``layout`` (of ``opcode``)
    whose values from ``limit`` on a core of ``config`` treats as ``limit``: each engine's
    checks are monotonic in them (a larger value is the same error) and a value that passes
    is below ``limit``, so ``min(value, limit)`` runs the same.

    * A LOAD's or STORE's tensor (its SRAM's rows and row lanes, `FrontClient`): ``sram_row``
      past the rows and ``lane`` past the lanes are SRAM_RANGE and BAD_EXTENT; a walked dim's
      ``extent`` past the lanes (dim 0) or rows is BAD_EXTENT or SRAM_RANGE, and its ``lo``
      and ``hi`` compare only with indices below its extent (the walker's `narrow` clips them
      too); a dim past the walked ones is BAD_EXTENT unless its extent is 1, and pads unless
      ``lo`` is 0 and ``hi`` is not. A STORE's ``pool_pitch`` past the rows is SRAM_RANGE.
    * A MATMUL's rows past their memories and a count past the accumulator's rows are
      SRAM_RANGE (a count of 0 stays 0: BAD_EXTENT).
    """
    def power(value):
        return 1 << ceil_log2(value)

    def field(*path):
        return _field(layout, *path)

    limits = {}
    if "tensor" in layout.members:
        client = load_front_client(config) if opcode == Opcode.LOAD else \
            store_front_client(config)
        limits[field("tensor", "sram_row")] = power(client.rows)
        limits[field("tensor", "lane")] = power(client.lanes)
        for d in range(DIMS):
            walked = d < config.descriptor_dims
            span = client.lanes if d == 0 else client.rows
            for name, limit in (("extent", power(span + 1) if walked else 2),
                                ("lo", power(span + 1) if walked else 1),
                                ("hi", power(span + 1) if walked else 1)):
                limits[field("tensor", "dims", d, name)] = limit
        if "epilogue" in layout.members and config.epilogue_pool:
            limits[field("epilogue", "pool_pitch")] = power(client.rows)
    if opcode == Opcode.MATMUL:
        # (An act_row of the probability buffer is SRAM_RANGE past it on every core, then
        # UNKNOWN_OPCODE on one without the softmax unit.)
        limits[field("weight_row")] = power(config.scratchpad_rows)
        limits[field("act_row")] = power(max(config.scratchpad_rows, config.probability_rows))
        limits[field("acc_row")] = power(config.accumulator_rows)
        limits[field("count")] = power(config.accumulator_rows + 1)
    return limits


def queued(config, opcodes, raw):
    """What an engine's queue of a core of ``config`` gives of instruction ``raw`` (bytes or
    an int) of one of ``opcodes``: its `kept_bits`, the `saturated_fields` at their limits."""
    value = int.from_bytes(raw, "little") if isinstance(raw, bytes) else raw
    for (offset, width), k in saturated_fields(config, opcodes).items():
        field = value >> offset & ((1 << width) - 1)
        value = value & ~(((1 << width) - 1) << offset) | min(field, 1 << k) << offset
    return value & sum(1 << bit for bit in kept_bits(config, opcodes))


def _field(layout, *path):
    """(offset, width) of the field of ``layout`` at ``path`` (names, and indices of arrays)."""
    offset, shape = 0, layout
    for name in path:
        offset, shape = offset + shape[name].offset, shape[name].shape
    return offset, Shape.cast(shape).width


def _strides(layout, dims):
    """The bit offsets of the strides of ``dims`` in the ``tensor`` of ``layout`` (none if it
    has none)."""
    if "tensor" not in layout.members:
        return []
    return [_field(layout, "tensor", "dims", d, "stride")[0] for d in dims]


def _unwalked_strides(config, layout):
    """The bit offsets of the strides of the dims past ``config.descriptor_dims`` in the
    ``tensor`` of ``layout``, if it has one."""
    return {stride + bit for stride in _strides(layout, range(config.descriptor_dims, DIMS))
            for bit in range(Dim["stride"].width)}


def _high_address_bits(config, layout):
    """The bit offsets of ``layout``'s byte addresses and strides (a ``tensor``'s address and
    dim strides, an ``im2col``'s base and strides) from ``config.address_width`` on: DMA
    addresses wrap modulo ``2**address_width``, so no element's address depends on them."""
    fields = _strides(layout, range(DIMS))
    if "tensor" in layout.members:
        fields.append(_field(layout, "tensor", "address")[0])
    if "im2col" in layout.members:
        fields += [_field(layout, "im2col", name)[0]
                   for name in ("base", "stride_n", "stride_c", "stride_h", "stride_w")]
    return {offset + bit for offset in fields for bit in range(config.address_width, 32)}


def _unused_epilogue_fields(config, layout):
    """The bit offsets of the ``epilogue.scale_row`` of ``layout``, if it has one, on a core
    without the softmax unit (whose STORE with ``row_scale`` is UNKNOWN_OPCODE), and of its
    ``epilogue.pool_pitch`` on a core without pooling (likewise with ``pool``)."""
    if "epilogue" not in layout.members:
        return set()
    unused = [name for name, present in (("scale_row", config.softmax),
                                         ("pool_pitch", config.epilogue_pool)) if not present]
    return {offset + bit for offset, width in (_field(layout, "epilogue", name)
                                               for name in unused) for bit in range(width)}


def _unread_params(config, layout):
    """The bit offsets of a PARAMS ``layout``'s entries from ``config.cols`` on (they would set
    lanes past the last, which `LaneParams` ignores) and, without the epilogue's multiplier,
    of every entry's ``multiplier``."""
    if layout is not ParamsInstruction:
        return set()
    entries = layout["entries"].offset
    unread = set(range(entries + min(config.cols, PARAMS_PER_INSTRUCTION) * EpilogueParams.size,
                       entries + PARAMS_PER_INSTRUCTION * EpilogueParams.size))
    if not config.epilogue_multiplier:
        multiplier = EpilogueParams["multiplier"]
        unread |= {entries + e * EpilogueParams.size + multiplier.offset + bit
                   for e in range(PARAMS_PER_INSTRUCTION) for bit in range(multiplier.width)}
    return unread


def _beat_runs(bits, beat_bits):
    """{beat: [(first, end) bit offsets in the instruction]}: the runs of offsets ``bits``,
    split at the beats of ``beat_bits``."""
    runs = {}
    for bit in sorted(bits):
        beat_runs = runs.setdefault(bit // beat_bits, [])
        if beat_runs and beat_runs[-1][1] == bit:
            beat_runs[-1] = (beat_runs[-1][0], bit + 1)
        else:
            beat_runs.append((bit, bit + 1))
    return runs


class InstructionQueue(wiring.Component):
    """``depth`` instructions of one engine (`CoreConfig.queue_depth`) in memories (LUT RAM on
    ECP5, flip-flops on iCE40), each written a bus beat at a time (``beat_en``: rdata
    ``beat_data`` is beat ``beat`` of the instruction) and queued by ``commit`` with its index.
    Only the bits ``kept`` of ``layout`` are stored, a memory per beat that has any; the rest of
    ``head`` is zero. ``tokens``: the head's token flags (`arch.TOKEN_FLAGS`, which ``kept``
    must hold, in the first beat) from a register, read a cycle ahead: the dispatch reads no
    memory (the routed 8x8's critical path ran from the load queue's LUT RAM through the
    dispatch into the engine's index register, 17.4 ns). With more than one slot the head's
    index (``index_width`` bits, `CoreConfig.index_width`) is read a cycle ahead into a
    register too. ``saturated`` ({(offset, width): k}, `saturated_fields`): fields written as
    ``min(value, 2**k)``, whose bits from ``k + 1`` on ``kept`` leaves out.

    One slot is flip-flops. With ``shift`` ``(offset, stride, count)`` (one slot only) an
    input ``shift`` moves the ``count`` entries of ``stride`` bits from ``offset`` down by one
    entry for the next cycle (each kept bit takes the bit ``stride`` above it, or 0 past the
    last entry): `store.params_shift`.
    """

    def __init__(self, layout, kept, beat_bits, depth, index_width=32, saturated=None,
                 shift=None):
        self.flag_bits = [token_flag_bit(name) for name in TOKEN_FLAGS]
        if not all(bit in kept and bit < beat_bits for bit in self.flag_bits):
            raise ValueError("an instruction queue keeps the token flags, in the first beat")
        self.saturated = dict(saturated or {})
        if any(offset // beat_bits != (offset + width - 1) // beat_bits
               for offset, width in self.saturated):
            raise ValueError("an instruction queue saturates fields inside one beat")
        if shift is not None and depth != 1:
            raise ValueError(f"shift={shift!r} is invalid with depth={depth!r}: allowed with 1")
        self.kept, self.shift_entries = frozenset(kept), shift
        self.runs = _beat_runs(kept, beat_bits)
        self.beat_bits, self.depth, self.index_width = beat_bits, depth, index_width
        self.beats = max(self.runs) + 1
        """Beats of an instruction up to the last one the queue keeps bits of."""
        super().__init__({
            "beat": In(range(INSTRUCTION_BITS // beat_bits)),
            "beat_data": In(beat_bits),
            "beat_en": In(1),
            "commit": In(1),
            "commit_index": In(index_width),
            "full": Out(1),
            "head": Out(stream.Signature(data.StructLayout({"instr": layout,
                                                           "index": index_width}))),
            "tokens": Out(data.StructLayout({name: 1 for name in TOKEN_FLAGS})),
            **({"shift": In(1)} if shift is not None else {}),
        })

    def elaborate(self, platform):
        m = Module()
        w_ptr, r_ptr = Signal(range(self.depth)), Signal(range(self.depth))
        level = Signal(range(self.depth + 1))
        pop = self.head.valid & self.head.ready
        instr = self.head.payload.instr.as_value()

        def advance(ptr):
            return ptr.eq(ring_next(ptr, self.depth))

        # The head's index, read a cycle ahead like the token flags (below) when there is more
        # than one slot: the watchdog's compares of the heads' indices take no memory read
        # (the routed 8x8's critical path ran from the store queue's LUT RAM through them,
        # 15.5 ns).
        m.submodules.indices = indices = memory.Memory(shape=self.index_width, depth=self.depth,
                                                       init=[])
        index_write = indices.write_port()
        if self.depth > 1:
            index_read = indices.read_port(transparent_for=(index_write,))
            m.d.comb += index_read.addr.eq(Mux(pop, ring_next(r_ptr, self.depth), r_ptr))
        else:
            index_read = indices.read_port(domain="comb")
            m.d.comb += index_read.addr.eq(r_ptr)
        m.d.comb += [
            index_write.addr.eq(w_ptr),
            index_write.data.eq(self.commit_index),
            index_write.en.eq(self.commit),
            self.head.payload.index.eq(index_read.data),
            self.head.valid.eq(level != 0),
            self.full.eq(level == self.depth),
        ]
        slot = Signal(len(instr)) if self.depth == 1 else None  # its kept bits: flip-flops
        for beat, runs in self.runs.items():
            base = beat * self.beat_bits
            written = Signal(self.beat_bits, name=f"written{beat}")  # the beat, saturated
            m.d.comb += written.eq(self.beat_data)
            for (offset, width), k in self.saturated.items():
                if offset // self.beat_bits == beat:
                    value = self.beat_data[offset - base:offset - base + width]
                    high = value[k:].any()
                    m.d.comb += written[offset - base:offset - base + k + 1].eq(
                        Mux(high, 1 << k, value[:k]))
            if slot is not None:
                with m.If(self.beat_en & (self.beat == beat)):
                    m.d.sync += [slot[first:end].eq(written[first - base:end - base])
                                 for first, end in runs]
                continue
            entries = memory.Memory(shape=sum(end - first for first, end in runs),
                                    depth=self.depth, init=[])
            m.submodules[f"beat{beat}"] = entries
            write, read = entries.write_port(), entries.read_port(domain="comb")
            m.d.comb += [
                write.addr.eq(w_ptr),
                write.data.eq(Cat(written[first - base:end - base] for first, end in runs)),
                write.en.eq(self.beat_en & (self.beat == beat)),
                read.addr.eq(r_ptr),
            ]
            offset = 0
            for first, end in runs:
                m.d.comb += instr[first:end].eq(read.data[offset:offset + end - first])
                offset += end - first
        if slot is not None:
            m.d.comb += instr.eq(slot)
        if self.shift_entries is not None:
            start, stride, count = self.shift_entries
            with m.If(self.shift):
                m.d.sync += [slot[bit].eq(slot[bit + stride] if bit + stride in self.kept and
                                          bit + stride < start + stride * count else 0)
                             for bit in sorted(self.kept) if start <= bit < start + stride * count]

        # The token flags (all in the first beat) read at the head the next cycle will have. The
        # read sees a write in the same cycle: a queue that keeps one beat of an instruction
        # copied from the overflow memory writes and commits it in one cycle.
        m.submodules.token_flags = token_flags = memory.Memory(
            shape=len(TOKEN_FLAGS), depth=self.depth, init=[])
        flags_write = token_flags.write_port()
        flags_read = token_flags.read_port(transparent_for=(flags_write,))
        m.d.comb += [
            flags_write.addr.eq(w_ptr),
            flags_write.data.eq(Cat(self.beat_data[bit] for bit in self.flag_bits)),
            flags_write.en.eq(self.beat_en & (self.beat == 0)),
            flags_read.addr.eq(Mux(pop, ring_next(r_ptr, self.depth), r_ptr)),
            self.tokens.eq(flags_read.data),
        ]

        m.d.sync += level.eq(level + self.commit - pop)
        with m.If(self.commit):
            m.d.sync += advance(w_ptr)
        with m.If(pop):
            m.d.sync += advance(r_ptr)
        return m


def _overflow_memory(m, platform, rdata, depth, write, beat, copying, copy_beat):
    """The controller's overflow memory of ``depth`` beats: ``write`` stores ``rdata`` as beat
    ``beat``; returns beat ``copy_beat`` while ``copying`` (beats are copied in order from 0).
    LUT RAM, but a shift register on an iCE40 (no LUT RAM, its block RAMs are taken): shifted
    in at the top, out at the bottom, it needs no read multiplexer and no write decoder."""
    if fpga_family(platform) == "ice40":
        shift = Signal(depth * len(rdata))
        with m.If(write | copying):
            m.d.sync += shift.eq(Cat(shift[len(rdata):], rdata))
        return shift[:len(rdata)]
    m.submodules.overflow = overflow = memory.Memory(shape=len(rdata), depth=depth, init=[])
    write_port, read_port = overflow.write_port(), overflow.read_port(domain="comb")
    m.d.comb += [write_port.addr.eq(beat), write_port.data.eq(rdata), write_port.en.eq(write),
                 read_port.addr.eq(copy_beat)]
    return read_port.data


def _oldest(waiting):
    """The index of the oldest waiting instruction (0 if none waits): the watchdog blames it.
    ``waiting`` is (waits, index) per engine; the pairwise compares run side by side, not as a
    chain through the engines (the routed 8x8's critical path at 64b1ecc), and indices of
    different engines differ. The indices count modulo ``2**width`` (`CoreConfig.index_width`)
    and the instructions in the queues are far fewer than ``2**(width - 1)``, so an index is
    earlier than another when their difference modulo ``2**width`` is negative."""
    width = len(waiting[0][1])
    earlier = {(i, j): (waiting[i][1] - waiting[j][1])[width - 1]  # one subtraction per pair
               for i in range(len(waiting)) for j in range(i + 1, len(waiting))}
    oldest = Const(0, width)
    for i, (wait, index) in enumerate(waiting):
        older = [~other_wait | (earlier[i, j] if i < j else ~earlier[j, i])
                 for j, (other_wait, _) in enumerate(waiting) if j != i]
        oldest = oldest | Mux(wait & Cat(*older).all(), index, 0)
    return oldest


def engine_signature(layout, shifting=False):
    """The controller's side of one engine, plus ``stall``: the next instruction waits for a
    dependency token (a performance counter)."""
    members = {name: member.flip() for name, member in engine_members(layout, shifting).items()}
    return wiring.Signature({**members, "stall": Out(1)})


class Controller(wiring.Component):
    """Fetches 64-byte instructions from ``program_base`` over AXI, queues them per engine, and
    dispatches each when the tokens it pops are available (VTA-style semaphores between
    neighbouring engines). END waits for every engine to finish, then ``done_event``.

    The fetcher decodes the opcode from the header in an instruction's first beat and writes
    each beat straight into its engine's `InstructionQueue`. RREADY stays high during a fetch
    (the load engine's beats may be behind it on an in-order bus): when the queue is full, the
    beats go to a one-instruction overflow memory instead (`_overflow_memory`), and are copied
    into the queue, a beat a cycle, once it has room; with one-instruction queues
    (``queue_depth`` 1) they are dropped instead and the instruction is fetched again then.
    Either way an instruction is queued once its queue has room and the next fetch starts then,
    as with a staging register. A queue counts as full while its engine is ``holding`` the
    instruction it took (it runs from the queue's slot, `CoreConfig.store_prefetch` and
    `CoreConfig.load_prefetch`).

    The first error (an engine's, a bad fetch, an unknown opcode, or the watchdog seeing no
    progress for ``watchdog_limit`` cycles) stops fetching and dispatching; once the engines are
    idle ``error_event`` fires with ``error_code`` and the faulting instruction's ``error_index``,
    which hold until the next ``start`` (the control registers read them, no copy).
    """

    def __init__(self, config):
        self.config = config
        members = {
            "start": In(1),
            "program_base": In(32),
            "program_length": In(32),
            "windows": In(data.ArrayLayout(window_layout(config.address_width), config.windows)),
            "watchdog_limit": In(32),
            "busy": Out(1),
            "done_event": Out(1),
            "error_event": Out(1),
            "error_code": Out(ErrorCode),
            "error_index": Out(config.index_width),
            "axi": Out(axi_read_signature(config.axi_data_width)),
        }
        members.update({name: Out(engine_signature(layout, name == "store"
                                                     and params_shift(config) is not None))
                        for name, (_, layout) in ENGINES.items()})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        beat_bits = self.config.axi_data_width
        beats = INSTRUCTION_BITS // beat_bits
        assert beats > 1  # the first beat's decisions are registered for the others
        engines = [getattr(self, name) for name in ENGINES]
        supported = supported_opcodes(self.config)

        running = Signal()
        stopping = Signal()  # an error is latched; waiting for the engines to go idle
        index_width = self.config.index_width  # instruction indices count modulo its power
        pc = Signal(index_width)
        error = Signal(ErrorCode)
        error_index = Signal(index_width)
        progress = Signal()
        raise_error = Signal(ErrorCode)
        raise_index = Signal(index_width)

        # Dependency tokens between neighbours: tokens[i] goes forward (engine i -> i+1),
        # back_tokens[i] goes backward (engine i+1 -> i).
        tokens = [Signal(TOKEN_BITS, name=f"tokens_{i}_{i + 1}") for i in range(len(engines) - 1)]
        back_tokens = [Signal(TOKEN_BITS, name=f"tokens_{i + 1}_{i}")
                       for i in range(len(engines) - 1)]
        token_changes = {id(s): ([], []) for s in tokens + back_tokens}
        # Whether each counter has a token to pop and room for a push, registers set with it:
        # the dispatch compares no counter (the routed 8x8's critical path ran from a counter
        # through these compares, the dispatch and the token adder back into it, 17.0 ns), and
        # its next value and flags are formed for each step (-1, 0, +1) from the registers, so
        # that an engine's take or done only selects among them (16.4 ns with the adder).
        has_token = {id(s): Signal(name=f"{s.name}_nonzero") for s in tokens + back_tokens}
        has_room = {id(s): Signal(name=f"{s.name}_room", init=1) for s in tokens + back_tokens}

        queues = []
        queue_full = []  # no instruction can be queued for the engine now
        waiting = []  # (stall, queue head's index) of each engine, for the watchdog's blame
        for i, (name, (opcodes, layout)) in enumerate(ENGINES.items()):
            port = engines[i]
            shift = params_shift(self.config) if name == "store" else None
            queue = InstructionQueue(layout, kept_bits(self.config, opcodes), beat_bits,
                                     self.config.queue_depth, index_width,
                                     saturated_fields(self.config, opcodes), shift)
            if shift is not None:
                m.d.comb += queue.shift.eq(port.shift)
            pending = SyncFIFO(width=2, depth=pending_depth(self.config))  # push_prev, push_next
            m.submodules[f"{name}_queue"] = queue
            m.submodules[f"{name}_pending"] = pending
            queues.append(queue)
            # An engine that runs from its queue's slot keeps the slot full while it reads it.
            queue_full.append(queue.full | port.holding)
            head = queue.head.payload.instr
            flags = queue.tokens  # the head's token flags, registered
            head_index = queue.head.payload.index
            index = Signal(index_width, name=f"{name}_index")

            pop_prev = tokens[i - 1] if i > 0 else None
            pop_next = back_tokens[i] if i < len(engines) - 1 else None
            ready = Signal(name=f"{name}_tokens_ready")
            checks = [1]
            if pop_prev is not None:
                checks.append(~flags.pop_prev | has_token[id(pop_prev)])
            if pop_next is not None:
                checks.append(~flags.pop_next | has_token[id(pop_next)])
            # A push waits while its counter could overflow with the pushes still pending: the
            # watchdog then reports the program instead of the count wrapping to zero.
            if i > 0:
                checks.append(~flags.push_prev | has_room[id(back_tokens[i - 1])])
            if i < len(engines) - 1:
                checks.append(~flags.push_next | has_room[id(tokens[i])])
            m.d.comb += ready.eq(Cat(*checks).all())

            dispatch = Signal(name=f"{name}_dispatch")
            m.d.comb += [
                port.instr.payload.eq(head),
                port.instr.valid.eq(queue.head.valid & ready & ~stopping & pending.w_rdy),
                dispatch.eq(port.instr.valid & port.instr.ready),
                queue.head.ready.eq(dispatch),
                pending.w_en.eq(dispatch),
                pending.w_data.eq(Cat(flags.push_prev, flags.push_next)),
                pending.r_en.eq(port.done),
                port.stall.eq(queue.head.valid & ~ready & ~stopping),
            ]
            with m.If(dispatch):
                m.d.sync += index.eq(head_index)
            waiting.append((port.stall, head_index))
            if pop_prev is not None:
                token_changes[id(pop_prev)][1].append(dispatch & flags.pop_prev)
            if pop_next is not None:
                token_changes[id(pop_next)][1].append(dispatch & flags.pop_next)
            # An engine's done gives its tokens a cycle later, from a register: the done is
            # late in its cycle (the routed 8x8's critical path ran from the softmax unit's
            # done through the pending flags into a token counter, 17.3 ns).
            gives = pipeline_register(m, port.done.replicate(2) & pending.r_data,
                                      f"{name}_gives")
            if i > 0:
                token_changes[id(back_tokens[i - 1])][0].append(gives[0])
            if i < len(engines) - 1:
                token_changes[id(tokens[i])][0].append(gives[1])
            with m.If(port.error != ErrorCode.NONE):
                m.d.comb += [raise_error.eq(port.error), raise_index.eq(index)]

        # A program starts with no tokens, whatever the previous one left behind. On an iCE40
        # (a board clock of 18 MHz, and logic cells its scarcest resource) the flags are the
        # counter's compares, and it steps by one adder: the same values in every cycle.
        starting = Signal()
        for token in tokens + back_tokens:
            (give,), (take,) = token_changes[id(token)]  # one engine gives, one takes
            if fpga_family(platform) == "ice40":
                m.d.comb += [has_token[id(token)].eq(token != 0),
                             has_room[id(token)].eq(token < TOKEN_LIMIT)]
                m.d.sync += token.eq(Mux(starting, 0, token + give - take))
                continue
            # The give is a register: the value and flags with and without a take are formed
            # from registers, and the take (late: an engine's dispatch) only selects (through
            # the step's compare and three-way select it was the routed 8x8's critical path,
            # 15.0 ns).
            outcomes = []
            for took in (0, 1):
                value = Signal.like(token, name=f"{token.name}_{('kept', 'taken')[took]}")
                m.d.comb += value.eq(token + give - took)
                outcomes.append((value, value != 0, value < TOKEN_LIMIT))
            (kept, kept_token, kept_room), (taken, taken_token, taken_room) = outcomes
            with m.If(starting):
                m.d.sync += [token.eq(0), has_token[id(token)].eq(0),
                             has_room[id(token)].eq(1)]
            with m.Else():
                m.d.sync += [token.eq(Mux(take, taken, kept)),
                             has_token[id(token)].eq(Mux(take, taken_token, kept_token)),
                             has_room[id(token)].eq(Mux(take, taken_room, kept_room))]

        # Fetch: one instruction at a time, as one INCR burst of `beats` beats.
        # program_base + pc * INSTRUCTION_BYTES, modulo 2**address_width
        address = Signal(self.config.address_width)
        m.d.comb += [
            self.axi.arid.eq(FETCH_ID),
            self.axi.araddr.eq(address),
            self.axi.arlen.eq(beats - 1),
            self.axi.arsize.eq(exact_log2(beat_bits // 8)),
            self.axi.arburst.eq(AXI_BURST_INCR),
        ]
        # Whether the instruction at `address` is in a window and whether `pc` is past the
        # program, registered (the routed 8x8's critical path ran from the window compares
        # through ARVALID into the memory): for the first instruction in state CHECK, for the
        # next one as the current one is fetched (`address` holds then), taken at its commit.
        # Used only when the program base is aligned (else MISALIGNED first): no adder.
        checking = Signal()
        probe = Signal.like(address)  # wrapping, as `address` steps
        m.d.comb += probe.eq(Mux(checking, address, address + INSTRUCTION_BYTES))
        probe_ok = window_ok(m, self.windows, probe, INSTRUCTION_BYTES, "read", aligned=True)
        # A length the indices cannot count is no limit (`CoreConfig.index_width`).
        probe_pc = Mux(checking, pc, pc + 1)[:index_width]
        probe_end = ((probe_pc == self.program_length[:index_width])
                     & ~self.program_length[index_width:].any())
        next_ok, next_end, fetch_ok, fetch_end = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [next_ok.eq(probe_ok), next_end.eq(probe_end)]
        bus_error = Signal()
        ar_waiting = Signal()
        # The program base is not a multiple of an instruction: set at START (the base is
        # frozen while the core runs), not a compare with the register on the fetch's path
        # (from it into the error index was the routed 8x8's critical path, 16.3 ns).
        misaligned = Signal()
        # A burst the watchdog gave up on: its beats are taken and dropped when they come, and
        # no fetch is issued until then (one fetch burst in flight, never a stale instruction).
        fetch_draining = Signal()
        with m.If(fetch_draining):
            m.d.comb += self.axi.rready.eq(1)
            with m.If(self.axi.rvalid & (self.axi.rid == FETCH_ID) & self.axi.rlast):
                m.d.sync += fetch_draining.eq(0)
        engines_idle = Cat(~port.busy for port in engines).all() & \
            Cat(~q.head.valid for q in queues).all()

        # The instruction being fetched: its beat, its engine (decoded from the first beat),
        # and whether it goes straight into that engine's queue or to `overflow`.
        beat = Signal(range(beats))
        target = Signal(range(len(queues)))
        known = Signal()     # its opcode runs on an engine of this core
        ended = Signal()     # it is END
        direct = Signal()    # its queue had room at the first beat (nothing else fills it)
        first = data.View(Header, self.axi.rdata[:Header.size])
        first_target = Signal.like(target)
        first_known = Signal()
        for i, (opcodes, _) in enumerate(ENGINES.values()):
            with m.If(Cat(first.opcode == op for op in opcodes if op in supported).any()):
                m.d.comb += [first_target.eq(i), first_known.eq(1)]
        is_first = beat == 0
        full = Array(queue_full)
        target_full = full[target]

        # With one-instruction queues there is no overflow memory: an instruction whose queue
        # is full is dropped and fetched again once it has room.
        refetch = self.config.queue_depth == 1
        queue_beat, queue_data = beat, self.axi.rdata
        if not refetch:
            overflow_beats = max(q.beats for q in queues)
            overflow_write = Signal()  # beat `beat` of rdata into the overflow memory
            copy_beat = Signal(range(overflow_beats))
            copying = Signal()  # beat `copy_beat` of the overflow memory into `target`'s queue
            overflow_data = _overflow_memory(m, platform, self.axi.rdata, overflow_beats,
                                             overflow_write, beat, copying, copy_beat)
            target_beats = Array(Const(q.beats, range(beats + 1)) for q in queues)[target]
            queue_beat = Mux(copying, copy_beat, beat)
            queue_data = Mux(copying, overflow_data, self.axi.rdata)
        for i, queue in enumerate(queues):
            m.d.comb += [
                queue.beat.eq(queue_beat),
                queue.beat_data.eq(queue_data),
                queue.commit_index.eq(pc),
            ]

        def commit():
            """Queue the instruction in `target`'s queue and go on to the next one."""
            m.d.comb += [progress.eq(1), Array(q.commit for q in queues)[target].eq(1)]
            m.d.sync += [pc.eq(pc + 1), address.eq(address + INSTRUCTION_BYTES),
                         fetch_ok.eq(next_ok), fetch_end.eq(next_end)]
            m.next = "FETCH"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += starting.eq(self.start)
                with m.If(self.start):
                    m.d.sync += [pc.eq(0), address.eq(self.program_base), running.eq(1),
                                 misaligned.eq(self.program_base[:exact_log2(INSTRUCTION_BYTES)]
                                               != 0),
                                 error.eq(ErrorCode.NONE),
                                 stopping.eq(0), bus_error.eq(0)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += checking.eq(1)
                m.d.sync += [fetch_ok.eq(probe_ok), fetch_end.eq(probe_end)]
                m.next = "FETCH"
            with m.State("FETCH"):
                with m.If(ar_waiting):  # AXI: a request, once made, is held until accepted
                    m.d.comb += self.axi.arvalid.eq(1)
                    with m.If(self.axi.arready):
                        m.d.comb += progress.eq(1)
                        m.d.sync += [ar_waiting.eq(0), beat.eq(0)]
                        m.next = "BEATS"
                with m.Elif(stopping):
                    m.next = "STOP"
                with m.Elif(fetch_draining):
                    pass
                with m.Elif(fetch_end):
                    m.next = "END"
                with m.Elif(misaligned):
                    m.d.comb += [raise_error.eq(ErrorCode.MISALIGNED), raise_index.eq(pc)]
                with m.Elif(~fetch_ok):
                    m.d.comb += [raise_error.eq(ErrorCode.PROGRAM_WINDOW), raise_index.eq(pc)]
                with m.Else():
                    m.d.comb += self.axi.arvalid.eq(1)
                    with m.If(self.axi.arready):
                        m.d.comb += progress.eq(1)
                        m.d.sync += beat.eq(0)
                        m.next = "BEATS"
                    with m.Else():
                        m.d.sync += ar_waiting.eq(1)
            with m.State("BEATS"):
                m.d.comb += self.axi.rready.eq(1)
                with m.If(stopping & (error == ErrorCode.WATCHDOG)):  # a memory that never answers
                    m.d.sync += fetch_draining.eq(1)
                    m.next = "STOP"
                with m.Elif(self.axi.rvalid & (self.axi.rid == FETCH_ID)):
                    # The first beat goes to every queue with room and to the overflow memory,
                    # whatever its opcode: no write enable waits on the decode (the routed 8x8's
                    # critical path ran from R through it into the queues' enables, 17.8 ns).
                    # A queue's free slot is not read before a commit, and the instruction's
                    # own queue, or the overflow memory, has its first beat when it commits.
                    m.d.comb += progress.eq(1)
                    for i, queue in enumerate(queues):
                        m.d.comb += queue.beat_en.eq(Mux(is_first, ~queue_full[i],
                                                         known & direct & (target == i)))
                    if not refetch:
                        m.d.comb += overflow_write.eq(Mux(is_first, 1, known & ~direct)
                                                      & (beat < overflow_beats))
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(is_first):
                        m.d.sync += [target.eq(first_target), known.eq(first_known),
                                     ended.eq(first.opcode == Opcode.END),
                                     direct.eq(~full[first_target])]
                    failed = bus_error | (self.axi.rresp != AXI_RESP_OKAY)
                    m.d.sync += bus_error.eq(failed)
                    with m.If(self.axi.rlast):
                        m.d.sync += bus_error.eq(0)
                        with m.If(failed):
                            m.d.comb += [raise_error.eq(ErrorCode.BUS_ERROR), raise_index.eq(pc)]
                            m.next = "FETCH"
                        with m.Elif(stopping):
                            m.next = "STOP"
                        with m.Elif(ended):
                            m.next = "END"
                        with m.Elif(~known):
                            m.d.comb += [raise_error.eq(ErrorCode.UNKNOWN_OPCODE),
                                         raise_index.eq(pc)]
                            m.next = "FETCH"
                        with m.Elif(direct):
                            commit()
                        with m.Else():
                            m.next = "OVERFLOW"
            with m.State("OVERFLOW"):  # waiting for room in the queue
                if not refetch:
                    m.d.sync += copy_beat.eq(0)
                with m.If(stopping):
                    m.next = "STOP"
                with m.Elif(~target_full):
                    m.next = "FETCH" if refetch else "COPY"
            if not refetch:
                with m.State("COPY"):
                    m.d.comb += [copying.eq(1), progress.eq(1),
                                 Array(q.beat_en for q in queues)[target].eq(1)]
                    m.d.sync += copy_beat.eq(copy_beat + 1)
                    with m.If(stopping):
                        m.next = "STOP"
                    with m.Elif(copy_beat == target_beats - 1):
                        commit()
            with m.State("END"):
                # An engine that fails now is idle in this same cycle: its error wins over done.
                with m.If(stopping | (raise_error != ErrorCode.NONE)):
                    m.next = "STOP"
                with m.Elif(engines_idle):
                    m.d.comb += self.done_event.eq(1)
                    m.d.sync += running.eq(0)
                    m.next = "IDLE"
            with m.State("STOP"):
                with m.If(Cat(~port.busy for port in engines).all() | (error == ErrorCode.WATCHDOG)):
                    m.d.comb += self.error_event.eq(1)
                    m.d.sync += running.eq(0)
                    m.next = "IDLE"

        # Watchdog: cycles without any progress while running. Whether the last cycle restarted
        # the count is registered (`was_reset`), which takes the engines' progress pulses off
        # the counter's path; the count then restarts a cycle later, so wherever the watchdog
        # can fire (the last cycle did not restart it) the count is exact. On iCE40 it counts
        # down from the limit (`left`, the limit less the cycles since, plus 1), with no compare
        # against the limit (30 logic cells on micro); elsewhere up (`idle_cycles`), as the
        # count-down's load multiplexer beside the carry chain costs ECP5 91 cells on the 8x8.
        was_reset = Signal(init=1)
        any_progress = progress | Cat(p.progress | p.done | p.instr.valid & p.instr.ready
                                      for p in engines).any()
        m.d.sync += was_reset.eq(~running | any_progress)
        # The instruction it blames, registered (a chain of 32-bit compares over the engines'
        # queue heads): the watchdog fires after a cycle without progress, in which no queue,
        # token or stall changed, so last cycle's blame is this cycle's.
        blamed, blamed_index = Signal(), Signal(index_width)
        m.d.sync += [blamed.eq(Cat(stall for stall, _ in waiting).any()),
                     blamed_index.eq(_oldest(waiting))]
        # Whether the limit is reached, registered a cycle ahead from the count's next value
        # (the limit is frozen while the core runs): no compare on the way into the error and
        # the controller's state (the routed 8x8's critical path ran from the limit through
        # it, 15.4 ns).
        expired = Signal()
        limit = self.watchdog_limit
        if fpga_family(platform) == "ice40":
            left = Signal(32)  # may wrap only once the watchdog has fired or an error stops
            m.d.sync += [left.eq(Mux(was_reset, limit, left - 1)),
                         expired.eq(limit.any() & Mux(was_reset, ~limit[1:].any(),
                                                      ~left[2:].any() & ~left[:2].all()))]
        else:
            idle_cycles = Signal(32)
            m.d.sync += [idle_cycles.eq(Mux(was_reset, 1, idle_cycles + 1)),
                         expired.eq(limit.any() & Mux(was_reset, limit == 1,
                                                      idle_cycles + 1 >= limit))]
        with m.If(running & ~stopping & ~was_reset & expired):
            m.d.comb += [raise_error.eq(ErrorCode.WATCHDOG),
                         raise_index.eq(Mux(blamed, blamed_index, pc))]

        with m.If(running & ~stopping & (raise_error != ErrorCode.NONE)):
            m.d.sync += [stopping.eq(1), error.eq(raise_error), error_index.eq(raise_index)]
        m.d.comb += [
            self.busy.eq(running),
            self.error_code.eq(error),
            self.error_index.eq(error_index),
        ]
        return m
