"""amaranth.sim test of the controller's fetch path: instructions written a beat at a time into
the engines' queues, and through the overflow memory when a queue is full (with one-instruction
queues: fetched again)."""
import dataclasses
import random

import pytest
from amaranth.hdl import Elaboratable, Fragment, Module, Signal
from amaranth.sim import Simulator
from amaranth.utils import ceil_log2

from tpugen import CoreConfig
from tpugen.arch import (OPCODE_ENGINE, QUEUE_DEPTH, TOKEN_BITS, TOKEN_FLAGS, TOKEN_LIMIT,
                         opcode_of, pending_depth, token_flag_bit)
from tpugen.hdl.controller import (ENGINES, FETCH_ID, Controller, InstructionQueue, _oldest,
                                   kept_bits, queued, saturated_fields)
from tpugen.hdl.store import params_shift
from tpugen.isa import (INSTRUCTION_BYTES, NUM_WINDOWS, PARAMS_PER_INSTRUCTION, Dim, Epilogue,
                        EpilogueParams, ErrorCode, Header, LoadInstruction, Opcode,
                        ParamsInstruction, StoreInstruction, TensorDescriptor, defined_bits,
                        encode)
from tpugen.sim.pysim_axi import AxiMemory

HOLD = 300
"""Cycles the engines take nothing at first: the fetcher fills the load queue and waits."""


def _program(rng, config):
    """Random instruction bytes (no tokens, random reserved bits) for every engine, the first
    three LOADs, then END."""
    opcodes = [Opcode.LOAD] * 3 + [rng.choice([op for ops, _ in ENGINES.values() for op in ops
                                               if op != Opcode.SOFTMAX or config.softmax])
                                   for _ in range(21)]
    header = ~sum(1 << bit for bit in defined_bits(Header)) & ((1 << Header.size) - 1)
    program = [(int.from_bytes(encode(op)[:4], "little") | rng.getrandbits(32) & header)
               .to_bytes(4, "little") + rng.randbytes(INSTRUCTION_BYTES - 4) for op in opcodes]
    return program + [encode(Opcode.END)]


class _ForFamily(Elaboratable):
    """``dut`` elaborated as for synthesis on FPGA ``family`` (`hdl.family.fpga_family`)."""

    def __init__(self, dut, family):
        self.dut, self.family = dut, family

    def elaborate(self, platform):
        return Fragment.get(self.dut, self)


def _fetch_window(ctx, dut):
    """Window 0 readable over the test's 4 KiB of memory, the others off."""
    ctx.set(dut.windows[0], {"base": 0, "end": 1 << 12, "read": 1, "write": 0})
    for i in range(1, NUM_WINDOWS):
        ctx.set(dut.windows[i], {"base": 0, "end": 0, "read": 0, "write": 0})


def _run_to_end(dut, memory, length, engine, family=None):
    """Start `Controller` ``dut`` on the ``length`` instructions at 0 of ``memory``, with the
    fake engine process ``engine(name)`` of each engine, and run until END (failing on an
    error): elaborated for FPGA ``family``."""
    async def host(ctx):
        _fetch_window(ctx, dut)
        ctx.set(dut.program_length, length)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(50_000):
            _, _, done, error = await ctx.tick().sample(dut.done_event, dut.error_event)
            assert not error
            if done:
                return
        raise AssertionError("no END")

    _simulate(dut, memory, engine, host, family)


def _simulate(dut, memory, engine, host, family):
    """Simulate `Controller` ``dut`` elaborated for FPGA ``family``: ``memory`` answering its
    fetches, the fake engine process ``engine(name)`` of each engine, until ``host`` returns."""
    sim = Simulator(_ForFamily(dut, family))
    sim.add_clock(1e-6)
    sim.add_testbench(memory.read_process(dut.axi), background=True)
    for name in ENGINES:
        sim.add_testbench(engine(name), background=True)
    sim.add_testbench(host)
    sim.run()


def _run_program(config, family, seed, busy_cycles=None, holding=()):
    """Run a random `_program` through a `Controller` of ``config`` with fake engines taking
    instructions at random; ``busy_cycles(rng)``: how long an engine stays busy after each take
    (default: done at once), the engines named in ``holding`` holding the instruction meanwhile
    (`engine_members`). Returns what each engine received, the fetches made in the first
    `HOLD` cycles, all fetches, and the expected instructions (their kept bits)."""
    rng = random.Random(seed)
    program = _program(rng, config)
    dut = Controller(config)
    memory = AxiMemory(1 << 12, config.axi_data_width, allowed=[(0, 1 << 12)], seed=seed,
                       ident=FETCH_ID)
    memory.mem[:len(program) * INSTRUCTION_BYTES] = b"".join(program)
    expected = {name: [] for name in ENGINES}
    for raw in program[:-1]:
        name = next(name for name, (ops, _) in ENGINES.items() if opcode_of(raw) in ops)
        expected[name].append(queued(config, ENGINES[name][0], raw))
    received = {name: [] for name in ENGINES}
    fetched_in_hold = []

    def engine(name):
        port = getattr(dut, name)

        async def process(ctx):
            await ctx.tick().repeat(HOLD)
            fetched_in_hold.append(memory.ar)
            while True:
                ctx.set(port.instr.ready, rng.random() < 0.4)
                _, _, valid, ready, payload = await ctx.tick().sample(
                    port.instr.valid, port.instr.ready, port.instr.payload.as_value())
                if valid and ready:
                    received[name].append(payload)
                    ctx.set(port.instr.ready, 0)
                    ctx.set(port.busy, 1)
                    ctx.set(port.holding, name in holding)
                    for _ in range(busy_cycles(rng) if busy_cycles else 0):
                        # What the engine runs from: without prefetch, the queue's slot.
                        received[name].append(ctx.get(port.instr.payload.as_value()))
                        await ctx.tick()
                    ctx.set(port.busy, 0)
                    ctx.set(port.holding, 0)
                    ctx.set(port.done, 1)
                    await ctx.tick()
                    ctx.set(port.done, 0)
        return process

    _run_to_end(dut, memory, len(program), engine, family)
    return received, fetched_in_hold, memory.ar, expected, len(program)


@pytest.mark.parametrize("width,family,depth", [(32, None, 2), (128, None, 2), (32, "ice40", 2),
                                               (64, None, 1), (32, "ice40", 1)])
def test_every_instruction_reaches_its_engine_intact_in_order(width, family, depth):
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=width,
                        softmax=width == 128, im2col=width == 128, queue_depth=depth,
                        descriptor_dims=2 if family else 4)
    received, fetched_in_hold, fetched, expected, length = _run_program(config, family, width)
    # `depth` LOADs queued, the next waits in the overflow memory (depth 1: it was dropped, to
    # be fetched again): no further fetch.
    assert fetched_in_hold == [depth + 1] * len(ENGINES)
    assert received == expected
    if depth > 1:
        assert fetched == length  # every instruction fetched once
    else:
        assert fetched > length


@pytest.mark.parametrize("family", [None, "ice40"])
def test_a_queue_takes_nothing_while_its_engine_holds_what_it_took(family):
    """An engine ``holding`` the instruction it took runs from its queue's slot (the store
    engine without `CoreConfig.store_prefetch`): the slot keeps that instruction until the
    engine lets go (no later one is written over it); another engine's queue takes the next
    one meanwhile."""
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        softmax=False, im2col=False, queue_depth=1, store_prefetch=False,
                        descriptor_dims=3)
    busy = [3, 40]  # long enough for the next instruction's fetch to come meanwhile

    received, fetched_in_hold, fetched, expected, length = _run_program(
        config, family, 7, busy_cycles=lambda rng: rng.randint(*busy), holding={"store"})
    assert fetched_in_hold == [2] * len(ENGINES)  # one queued, the next dropped
    assert fetched > length

    def runs(name):  # each take, then the slot as it was while the engine was busy
        taken = [received[name][0]]
        for payload in received[name][1:]:
            if payload != taken[-1]:
                taken.append(payload)
        return taken

    assert len(received["store"]) > 10 * len(expected["store"])
    assert runs("store") == expected["store"]
    assert runs("load") != expected["load"]  # its engine has a copy: the slot takes the next


@pytest.mark.parametrize("depth", [1, QUEUE_DEPTH])
def test_an_engine_gets_at_most_pending_depth_instructions_ahead_of_its_dones(depth):
    """Engines that take every instruction at once and are done with each much later (as the
    execute engine's MATMULs overlap) have at most `pending_depth` dispatched and not done:
    the controller keeps their token pushes until the dones. The bound is reached, and every
    instruction still arrives, in order."""
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        softmax=False, im2col=False, queue_depth=depth, descriptor_dims=2)
    rng = random.Random(depth)
    program = _program(rng, config)
    program = program[:-1] * 2 + program[-1:]  # 49 instructions: 3 KiB
    dut = Controller(config)
    memory = AxiMemory(1 << 12, 32, allowed=[(0, 1 << 12)], seed=depth, ident=FETCH_ID)
    memory.mem[:len(program) * INSTRUCTION_BYTES] = b"".join(program)
    expected = {name: [queued(config, ENGINES[name][0], raw) for raw in program[:-1]
                       if opcode_of(raw) in ENGINES[name][0]] for name in ENGINES}
    received = {name: [] for name in ENGINES}
    most = dict.fromkeys(ENGINES, 0)

    def engine(name):
        port = getattr(dut, name)

        async def process(ctx):
            ctx.set(port.instr.ready, 1)
            taken = []  # the cycle each instruction not yet done was taken
            cycle = 0
            async for _, _, valid, payload, done in ctx.tick().sample(
                    port.instr.valid, port.instr.payload.as_value(), port.done):
                cycle += 1
                if done:
                    taken.pop(0)
                if valid:
                    received[name].append(payload)
                    taken.append(cycle)
                most[name] = max(most[name], len(taken))
                ctx.set(port.busy, bool(taken))
                ctx.set(port.done, bool(taken) and cycle - taken[0] >= 500)
        return process

    _run_to_end(dut, memory, len(program), engine)
    assert received == expected
    assert max(most.values()) == pending_depth(config)
    assert all(count <= pending_depth(config) for count in most.values())


@pytest.mark.parametrize("name,depth,family,width", [
    ("execute", 1, None, 32), ("execute", 2, None, 32), ("execute", 3, "ice40", 32),
    ("load", 2, None, 32), ("store", 1, "ice40", 32), ("execute", 2, None, 128)])
def test_the_queue_registers_its_heads_token_flags(name, depth, family, width):
    # Instructions written a beat a cycle (the first with random token flags), committed with
    # the last and a random index, popped at random: whenever the head is valid its registered
    # `tokens` are the head's header flags and its index (registered too with more than one
    # slot) the one committed with it. A 128-bit bus's MATMUL is one beat, committed with its
    # first (as the controller copies one from its overflow memory).
    config = CoreConfig(rows=2, cols=2, axi_data_width=width, queue_depth=depth, softmax=False)
    opcodes, layout = ENGINES[name]
    dut = InstructionQueue(layout, kept_bits(config, opcodes), width, depth)
    assert (dut.beats == 1) == (width == 128)
    rng = random.Random(depth)
    flag_bits = [token_flag_bit(flag) for flag in TOKEN_FLAGS]
    checked = []

    async def testbench(ctx):
        queued, writing = [], None  # flags of committed instructions; beats left to write
        for _ in range(1500):
            ctx.set(dut.head.ready, rng.random() < 0.4)
            if writing is None and not ctx.get(dut.full) and rng.random() < 0.5:
                flags = rng.getrandbits(len(TOKEN_FLAGS))
                writing = [0, (flags, rng.getrandbits(32))]
            if writing is not None:
                beat, (flags, index) = writing
                data = rng.getrandbits(width)
                if beat == 0:
                    for k, bit in enumerate(flag_bits):
                        data = data & ~(1 << bit) | ((flags >> k) & 1) << bit
                last = beat == dut.beats - 1
                ctx.set(dut.beat, beat)
                ctx.set(dut.beat_data, data)
                ctx.set(dut.beat_en, 1)
                ctx.set(dut.commit, last)
                ctx.set(dut.commit_index, index)
            else:
                ctx.set(dut.beat_en, 0)
                ctx.set(dut.commit, 0)
            valid, ready = ctx.get(dut.head.valid), ctx.get(dut.head.ready)
            if valid:
                header = ctx.get(dut.head.payload.instr.header)
                expected = [queued[0][0] >> k & 1 for k in range(len(TOKEN_FLAGS))]
                assert [ctx.get(getattr(dut.tokens, flag)) for flag in TOKEN_FLAGS] == \
                    expected == [getattr(header, flag) for flag in TOKEN_FLAGS]
                assert ctx.get(dut.head.payload.index) == queued[0][1]
                checked.append(expected)
            await ctx.tick()
            if valid and ready:
                queued.pop(0)
            if writing is not None:
                if writing[0] == dut.beats - 1:
                    queued.append(writing[1])
                    writing = None
                else:
                    writing[0] += 1

    sim = Simulator(_ForFamily(dut, family))
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert len(checked) > 100 and len({tuple(flags) for flags in checked}) > 2


@pytest.mark.parametrize("dims", [2, 3, 4])
def test_the_load_queue_drops_the_strides_the_walkers_do_not_use(dims):
    # Of a dim past descriptor_dims only extent, lo and hi are kept (the check and the padding
    # a tile gets where lo != 0 or hi == 0), as 2, 1 and 1 bits; of a walked dim every field,
    # extent, lo and hi up to the power of two above the scratchpad's lanes (dim 0) or rows.
    config = CoreConfig(im2col=False, descriptor_dims=dims)
    kept = kept_bits(config, ENGINES["load"][0])
    saturated = saturated_fields(config, ENGINES["load"][0])
    for d in range(4):
        first = LoadInstruction["tensor"].offset + TensorDescriptor["dims"].offset + d * Dim.size
        for name, field in Dim:
            bits = set(range(first + field.offset, first + field.offset + field.width))
            span = config.lanes if d == 0 else config.scratchpad_rows
            if name == "stride":
                width = 32 if d < dims else 0
            elif d < dims:
                width = ceil_log2(span + 1) + 1
            else:
                width = 2 if name == "extent" else 1
            assert bits & kept == set(range(first + field.offset,
                                            first + field.offset + width)), (d, name)
            assert (name != "stride") == ((first + field.offset, field.width) in saturated)


def test_a_queue_saturates_only_fields_no_other_layout_keeps():
    # A load queue with im2col keeps its LOAD's fields whole (the im2col descriptor's are over
    # them); a store queue's STORE fields under a PARAMS entry the epilogue reads are whole,
    # the others saturate (the pooling pitch only on a core that pools: micro keeps none of
    # it); the execute queue's MATMUL rows and count saturate without the softmax unit only.
    micro = CoreConfig.preset("micro")
    assert saturated_fields(CoreConfig(im2col=True), ENGINES["load"][0]) == {}
    store = saturated_fields(micro, ENGINES["store"][0])
    dims = StoreInstruction["tensor"].offset + TensorDescriptor["dims"].offset
    pitch = StoreInstruction["epilogue"].offset + Epilogue["pool_pitch"].offset
    unwalked = {(dims, 16): 3, (dims + 2 * Dim.size + 32, 16): 0,  # unwalked: 0, 1, more
                (dims + 3 * Dim.size, 16): 1, (dims + 3 * Dim.size + 16, 16): 0,
                (dims + 3 * Dim.size + 32, 16): 0}
    assert store == unwalked
    assert not set(range(pitch, pitch + 16)) & kept_bits(micro, ENGINES["store"][0])
    pooling = dataclasses.replace(micro, epilogue_pool=True)
    assert saturated_fields(pooling, ENGINES["store"][0]) == {**unwalked, (pitch, 16): 8}
    assert len(saturated_fields(micro, ENGINES["execute"][0])) == 4
    assert saturated_fields(CoreConfig(softmax=True), ENGINES["execute"][0]) == {}


async def _queue_instruction(ctx, dut, raw):
    """Write instruction ``raw`` (an int) into `InstructionQueue` ``dut`` a 32-bit beat a cycle
    and commit it with its last beat."""
    for beat in range(dut.beats):
        ctx.set(dut.beat, beat)
        ctx.set(dut.beat_data, raw >> 32 * beat & 0xFFFF_FFFF)
        ctx.set(dut.beat_en, 1)
        ctx.set(dut.commit, beat == dut.beats - 1)
        await ctx.tick()
    ctx.set(dut.beat_en, 0)
    ctx.set(dut.commit, 0)


@pytest.mark.parametrize("name", ["load", "execute", "store"])
def test_a_queued_field_is_its_value_up_to_its_limit(name):
    # `queued` of a random instruction (and of values around each limit) keeps the kept bits
    # and gives a saturated field min(value, 2**k); the queue's hardware gives the same.
    config = CoreConfig.preset("micro")
    opcodes, layout = ENGINES[name]
    saturated = saturated_fields(config, opcodes)
    rng = random.Random(len(name))
    raws = []
    for _ in range(40):
        raw = rng.getrandbits(INSTRUCTION_BYTES * 8)
        raw = raw & ~0xF | opcodes[0].value  # an opcode of the engine
        for (offset, width), k in saturated.items():
            value = rng.choice([(1 << k) - 1, 1 << k, (1 << k) + 1, (1 << width) - 1, 0,
                                rng.getrandbits(width)])
            raw = raw & ~(((1 << width) - 1) << offset) | value << offset
        raws.append(raw)
    for raw in raws:
        got = queued(config, opcodes, raw)
        for (offset, width), k in saturated.items():
            assert got >> offset & ((1 << width) - 1) == min(raw >> offset & ((1 << width) - 1),
                                                             1 << k)
    dut = InstructionQueue(layout, kept_bits(config, opcodes), 32, 1, 32, saturated)
    seen = []

    async def testbench(ctx):
        for raw in raws:
            await _queue_instruction(ctx, dut, raw)
            seen.append(ctx.get(dut.head.payload.instr.as_value()))
            ctx.set(dut.head.ready, 1)
            await ctx.tick()
            ctx.set(dut.head.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert seen == [queued(config, opcodes, raw) for raw in raws]


def test_a_one_slot_store_queue_moves_the_params_entries_down(refuses):
    # `params_shift`: each `shift` moves every kept bit of the entries one entry down (the last
    # entry's become 0), the other bits stay; the epilogue reads entry 0 each cycle.
    config = CoreConfig.preset("micro")
    opcodes, layout = ENGINES["store"]
    kept, shift = kept_bits(config, opcodes), params_shift(config)
    offset, stride, count = shift
    dut = InstructionQueue(layout, kept, 32, 1, 32, saturated_fields(config, opcodes), shift)
    rng = random.Random(5)
    raw = rng.getrandbits(INSTRUCTION_BYTES * 8) & ~0xF | Opcode.PARAMS.value
    expected = [queued(config, opcodes, raw)]
    region = set(range(offset, offset + stride * count))
    for _ in range(count + 1):
        before = expected[-1]
        expected.append(sum(1 << bit for bit in kept if (
            before >> (bit + stride) & 1 and bit + stride in region if bit in region
            else before >> bit & 1)))
    seen = []

    async def testbench(ctx):
        await _queue_instruction(ctx, dut, raw)
        for _ in range(count + 2):
            seen.append(ctx.get(dut.head.payload.instr.as_value()))
            ctx.set(dut.shift, 1)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert count == 4 and seen == expected
    read = sum(((1 << field.width) - 1) << field.offset for name, field in EpilogueParams
               if name != "multiplier")  # what the shift-only epilogue reads of an entry
    assert [value >> offset & read for value in seen] == [
        raw >> offset + stride * e & read if e < count else 0 for e in range(count + 2)]
    refuses(lambda: InstructionQueue(layout, kept, 32, 2, 32, shift=shift), "shift=.*depth=2")


@pytest.mark.parametrize("cols,multiplier", [(4, False), (4, True), (8, True), (16, False)])
def test_the_store_queue_drops_the_params_entries_the_epilogue_never_reads(cols, multiplier):
    # A PARAMS entry from cols on would set a lane past the last; without the epilogue's
    # multiplier no entry's multiplier is read. The STORE's bits are all kept (those of its
    # saturated fields up to their limits).
    config = CoreConfig(rows=4, cols=cols, softmax=False, im2col=False,
                        epilogue_multiplier=multiplier)
    kept = kept_bits(config, ENGINES["store"][0])
    entries = ParamsInstruction["entries"].offset
    for e in range(PARAMS_PER_INSTRUCTION):
        for name, field in EpilogueParams:
            first = entries + e * EpilogueParams.size + field.offset
            bits = set(range(first, first + field.width))
            read = e < cols and (name != "multiplier" or multiplier)
            assert bits <= kept if read else not bits & kept - defined_bits(StoreInstruction), (
                e, name)
    scale_row = StoreInstruction["epilogue"].offset + Epilogue["scale_row"].offset
    dropped = {offset + bit for (offset, width), k
               in saturated_fields(config, ENGINES["store"][0]).items()
               for bit in range(k + 1, width)}
    assert defined_bits(StoreInstruction) - set(range(scale_row, scale_row + 16)) - dropped \
        <= kept


@pytest.mark.parametrize("width", [32, 11])
def test_the_watchdog_blames_the_oldest_waiting_instruction(width):
    # `_oldest` against Python's min over random waits and distinct indices of ``width`` bits
    # (`CoreConfig.index_width`), the instructions of a few queues: offsets below 24 from a
    # random first one, often across the wrap of the count (the oldest is then the largest
    # value); all 8 wait patterns; 0 when none waits.
    waits = [Signal(name=f"wait{i}") for i in range(3)]
    indices = [Signal(width, name=f"index{i}") for i in range(3)]
    m = Module()
    oldest = Signal(width)
    m.d.comb += oldest.eq(_oldest(list(zip(waits, indices))))
    rng = random.Random(5)
    wrapped = 0

    async def testbench(ctx):
        nonlocal wrapped
        for _ in range(300):
            first = rng.choice([0, 2**width - rng.randrange(1, 24), rng.randrange(2**width)])
            offsets = rng.sample(range(24), 3)
            values = [(first + offset) % 2**width for offset in offsets]
            pattern = [rng.random() < 0.5 for _ in range(3)]
            for wait, index, value, on in zip(waits, indices, values, pattern):
                ctx.set(wait, on)
                ctx.set(index, value)
            waiting = [(offset, value) for offset, value, on in zip(offsets, values, pattern)
                       if on]
            expected = min(waiting)[1] if waiting else 0
            assert ctx.get(oldest) == expected, (values, pattern)
            wrapped += bool(waiting) and expected != min(value for _, value in waiting)

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert wrapped > 10, "no case across the wrap"


def _starts(config, registers):
    """Run a one-instruction program (END at address 0, window 0 over the first 4 KiB) on a
    `Controller` of ``config`` once for each (PROGRAM_BASE, PROGRAM_LENGTH) of ``registers``:
    ("done", instructions fetched) or (error code, index, instructions fetched) of each."""
    dut = Controller(config)
    memory = AxiMemory(1 << 12, 64, allowed=[(0, 1 << 12)], seed=1, ident=FETCH_ID)
    memory.mem[:INSTRUCTION_BYTES] = encode(Opcode.END)
    outcomes = []

    async def host(ctx):
        _fetch_window(ctx, dut)
        for base, length in registers:
            ctx.set(dut.program_base, base)
            ctx.set(dut.program_length, length)
            before = memory.ar
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            for _ in range(200):
                _, _, done, error, code, index = await ctx.tick().sample(
                    dut.done_event, dut.error_event, dut.error_code, dut.error_index)
                if done or error:
                    fetched = memory.ar - before
                    outcomes.append(("done", fetched) if done else (code, index, fetched))
                    break
            await ctx.tick().repeat(5)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(memory.read_process(dut.axi), background=True)
    sim.add_testbench(host)
    sim.run()
    return outcomes


def test_a_length_the_indices_cannot_count_is_no_limit():
    # A core of 16 address bits counts instructions in 11 (`CoreConfig.index_width`): a
    # PROGRAM_LENGTH of 2**11 or more (here with the low bits of 0 and of 1) does not end the
    # program at an index; it runs to END. Lengths 0 and 1 end it there.
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64,
                        address_width=16)
    assert config.index_width == 11
    lengths = (2**11, 2**11 + 1, 0xFFFF_FFFF, 0, 1)
    assert _starts(config, [(0, length) for length in lengths]) == [
        ("done", 1), ("done", 1), ("done", 1), ("done", 0), ("done", 1)]


def test_a_misaligned_program_base_stops_before_any_fetch_each_start():
    # The base's alignment is judged at each START: a misaligned base stops the program with
    # MISALIGNED at instruction 0 and fetches nothing; the next START, from an aligned base,
    # runs the program.
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
    assert _starts(config, [(base, 1) for base in (8, INSTRUCTION_BYTES // 2, 0)]) == [
        (ErrorCode.MISALIGNED, 0, 0), (ErrorCode.MISALIGNED, 0, 0), ("done", 1)]


def _token_trace(config, family, program, seed):
    """Run ``program`` (instruction bytes) on a `Controller` of ``config`` elaborated for FPGA
    ``family``, fake engines taking at random and done after a random 0-3 cycles (``seed``), a
    watchdog of 300 cycles: every dispatch as (cycle, engine) and the outcome (cycle, "done" or
    (error code, index))."""
    rng = random.Random(seed)
    dut = Controller(config)
    memory = AxiMemory(1 << 16, config.axi_data_width, allowed=[(0, 1 << 16)], seed=seed,
                       ident=FETCH_ID)
    memory.mem[:len(program) * INSTRUCTION_BYTES] = b"".join(program)
    dispatches, outcome = [], []

    def engine(name):
        port = getattr(dut, name)

        async def process(ctx):
            cycle = 0
            while True:
                ctx.set(port.instr.ready, rng.random() < 0.6)
                _, _, valid, ready = await ctx.tick().sample(port.instr.valid, port.instr.ready)
                cycle += 1
                if valid and ready:
                    dispatches.append((cycle, name))
                    ctx.set(port.instr.ready, 0)
                    ctx.set(port.busy, 1)
                    for _ in range(rng.randrange(4)):
                        await ctx.tick()
                        cycle += 1
                    ctx.set(port.busy, 0)
                    ctx.set(port.done, 1)
                    await ctx.tick()
                    cycle += 1
                    ctx.set(port.done, 0)
        return process

    async def host(ctx):
        _fetch_window(ctx, dut)
        ctx.set(dut.windows[0].end, 1 << 16)
        ctx.set(dut.program_length, len(program))
        ctx.set(dut.watchdog_limit, 300)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for cycle in range(1, 100_000):
            _, _, done, error, code, index = await ctx.tick().sample(
                dut.done_event, dut.error_event, dut.error_code, dut.error_index)
            if done or error:
                outcome.extend([cycle, "done" if done else (code, index)])
                return
        raise AssertionError("neither done nor an error")

    _simulate(dut, memory, engine, host, family)
    return dispatches, tuple(outcome)


def test_the_token_counters_count_alike_on_every_family():
    """The iCE40's token counters (their flags compared from the count) against the others'
    (flags registered with each step), cycle for cycle: random token flags, some programs
    ending in a wait the watchdog stops, and pushes with no pops up to the counters' limit."""
    config = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        queue_depth=1, descriptor_dims=2)
    rng = random.Random(11)
    flags = {Opcode.LOAD: ("pop_next", "push_next"),
             Opcode.MATMUL: ("pop_prev", "pop_next", "push_prev", "push_next"),
             Opcode.STORE: ("pop_prev", "push_prev")}
    programs = []
    for valid in (True, True, False):
        # Valid: a pop only where pushes earlier in the program have left a token on its link
        # (no deadlock); else any flags (a wait the watchdog ends).
        program, tokens = [], {}
        for _ in range(60):
            op = rng.choice(list(flags))
            engine = OPCODE_ENGINE[op]
            header = {}
            for flag in flags[op]:
                other = engine + (1 if flag.endswith("next") else -1)
                link = (other, engine) if flag.startswith("pop") else (engine, other)
                set_it = rng.random() < 0.5 and (
                    not valid or flag.startswith("push") or tokens.get(link, 0) > 0)
                header[flag] = set_it
                if set_it:
                    tokens[link] = tokens.get(link, 0) + (1 if flag.startswith("push") else -1)
            program.append(encode(op, header=header))
        programs.append(program + [encode(Opcode.END)])
    over = 2 ** TOKEN_BITS + 2  # more pushes than a counter holds, none popped
    programs.append([encode(Opcode.LOAD, header={"push_next": 1})] * over + [encode(Opcode.END)])
    outcomes = []
    for seed, program in enumerate(programs):
        traces = [_token_trace(config, family, program, seed) for family in (None, "ice40")]
        assert traces[0] == traces[1], seed
        outcomes.append(traces[0][1][1])
    # The last program stops with WATCHDOG at a push the counter had no room for.
    code, index = outcomes[-1]
    assert code == ErrorCode.WATCHDOG and TOKEN_LIMIT <= index < over, outcomes[-1]
    assert outcomes[:2] == ["done", "done"] and outcomes[2] != "done", outcomes
