"""amaranth.sim tests of the STORE engine's fused epilogue and PARAMS against sim.golden."""
import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data, memory
from amaranth.lib.wiring import Out
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.hdl.epilogue import EpilogueDatapath
from tpugen.hdl.store import StoreEngine
from tpugen.isa import (PARAMS_PER_INSTRUCTION, EpilogueParams, ErrorCode, Opcode, decode, encode,
                        encode_tile)
from tpugen.sim.golden import epilogue, maxpool2x2, round_half_even_shift
from tpugen.sim.pysim_axi import AxiMemory
from tpugen.sim.testbench import ForFamily, put_instruction

from test_dma_pysim import (ERROR_ALLOWED, ERROR_WINDOWS, MEM_SIZE, RW_ALL, Bench, descriptor, run,
                            tensor_addresses)

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1)    # 64 rows
WIDE = CoreConfig(rows=4, cols=16, scratchpad_kib=1, accumulator_kib=1)    # 16 rows
TALL = CoreConfig(rows=4, cols=16, scratchpad_kib=1, accumulator_kib=4)    # 64 rows
RESET = {"bias": 0, "multiplier": 1, "shift": 0}


def with_width(config, width):
    return CoreConfig(**{**config.__dict__, "axi_data_width": width})


def params(entries, first_lane=0, broadcast=0):
    """A PARAMS instruction; ``entries``: (bias, multiplier, shift), at most eight."""
    entries = [dict(zip(("bias", "multiplier", "shift"), map(int, e))) for e in entries]
    entries += [RESET] * (PARAMS_PER_INSTRUCTION - len(entries))
    return encode(Opcode.PARAMS, first_lane=first_lane, broadcast=broadcast, entries=entries)


def store(desc, **epilogue_fields):
    return encode(Opcode.STORE, tensor=encode_tile(desc), epilogue=epilogue_fields)


def set_lanes(lanes, instruction):
    """Updates the per-lane parameters (arrays bias, multiplier, shift) by a PARAMS."""
    fields = decode(instruction)
    cols = len(lanes["bias"])
    for e, entry in enumerate(fields.entries):
        if fields.broadcast:
            targets = range(cols) if e == 0 else []
        else:
            targets = [fields.first_lane + e] if fields.first_lane + e < cols else []
        for lane in targets:
            for name in lanes:
                lanes[name][lane] = getattr(entry, name)


def golden_tile(acc, desc, lanes, fields, scales=None):
    """The tile (e3, e2, e1, e0) a STORE writes, by the contract: rows (or 2x2 windows of rows)
    through ``epilogue`` (parameters of lane i0, or with ``per_row`` of entry i1; with
    ``row_scale`` multiplier and shift of row scale ``scale_row + i1``, from ``scales``), then
    ``maxpool2x2``."""
    e = [d["extent"] for d in desc["dims"]]
    # Parameter arrays along the last axis (lanes), or along the rows (entry i1) with per_row.
    chosen = {name: values[:e[1], None] if fields.get("per_row") else values[:e[0]]
              for name, values in lanes.items()}
    if fields.get("row_scale"):
        rows = scales[fields["scale_row"]:fields["scale_row"] + e[1]]
        chosen["multiplier"], chosen["shift"] = rows[:, :1], rows[:, 1:]
    first = desc["sram_row"]
    if fields.get("pool"):
        pitch = fields["pool_pitch"]
        rows = first + pitch * np.arange(2 * e[2])[:, None] + np.arange(2 * e[1])[None, :]
        values = acc[rows][..., :e[0]]
    else:
        values = acc[first:first + e[1] * e[2] * e[3], :e[0]].reshape(e[3], e[2], e[1], e[0])
    y = epilogue(values, bias=chosen["bias"] if fields.get("bias") else None,
                 multiplier=chosen["multiplier"], shift=chosen["shift"],
                 requant=bool(fields.get("requant")), relu=bool(fields.get("relu")),
                 int8=desc["elem_log2"] == 0)
    return maxpool2x2(y, axes=(0, 1))[None] if fields.get("pool") else y


def scatter(mem, desc, tile, elem_bytes):
    """Writes the in-bounds elements of ``tile`` into ``mem`` (uint8) through ``desc``."""
    dims = list(reversed(desc["dims"]))
    lo = [max(0, -d["start"]) for d in dims]
    hi = [min(d["extent"], d["bound"] - d["start"]) for d in dims]
    if all(h > l for l, h in zip(lo, hi)):
        part = tile[tuple(slice(l, h) for l, h in zip(lo, hi))]
        addrs = tensor_addresses(desc)[tuple(slice(d["start"] + l, d["start"] + h)
                                             for d, l, h in zip(dims, lo, hi))]
        values = part.astype(f"<i{elem_bytes}").view(np.uint8).reshape(*part.shape, elem_bytes)
        for byte in range(elem_bytes):
            mem[addrs + byte] = values[..., byte]


def golden_program(config, program, acc, seed, scales=None, **axi):
    """A random AXI memory for ``program`` (PARAMS bytes and (descriptor, epilogue fields)
    STOREs) and what the golden model leaves in it (``scales``: the row scales); returns the
    memory, the expected bytes, the encoded instructions and the golden tiles."""
    rng = np.random.default_rng(seed)
    axi_mem = AxiMemory(MEM_SIZE, config.axi_data_width, allowed=[(0, MEM_SIZE)], seed=seed,
                        **axi)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    expected = np.frombuffer(axi_mem.mem, dtype=np.uint8).copy()
    lanes = {name: np.full(config.cols, v, dtype=np.int64) for name, v in RESET.items()}
    instructions, tiles = [], []
    for item in program:
        if isinstance(item, bytes):
            set_lanes(lanes, item)
            if not config.epilogue_multiplier:  # the contract: PARAMS' multiplier is ignored
                lanes["multiplier"][:] = 1
            instructions.append(item)
        else:
            desc, fields = item
            tile = golden_tile(acc, desc, lanes, fields, scales)
            scatter(expected, desc, tile, 1 << desc["elem_log2"])
            tiles.append(tile)
            instructions.append(store(desc, **fields))
    return axi_mem, expected, instructions, tiles


def program_case(config, program, acc, seed, scales=None, family=None, **axi):
    """Runs ``program`` on ``acc`` (see `golden_program`; ``family``: elaborated as for that
    FPGA family) and compares memory with the golden model; returns [(error, cycles)] and the
    golden tiles."""
    axi_mem, expected, instructions, tiles = golden_program(config, program, acc, seed, scales,
                                                            **axi)
    outcomes, _ = run("store", config, instructions, axi_mem, RW_ALL, acc, scales=scales,
                      family=family)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE] * len(program)
    np.testing.assert_array_equal(np.frombuffer(axi_mem.mem, dtype=np.uint8), expected)
    return outcomes, tiles


class WatchedStore(StoreEngine):
    """A store engine whose W FIFO (``beats``) a testbench can watch."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        self.beats = m.submodules.beats
        return m


class WStallBench(Elaboratable):
    """`Bench` with the store engine's AXI write channels passed on as ``bus``, with W held
    (neither valid nor ready) while ``stall`` is high."""

    def __init__(self, engine, sram):
        self.engine, self.sram = engine, sram
        self.stall = Signal()
        self.bus = engine.axi.signature.create()

    def elaborate(self, platform):
        m = Module()
        m.submodules.bench = Bench(self.engine, self.sram)
        up = self.engine.axi
        for name, member in up.signature.members.items():
            source, sink = (up, self.bus) if member.flow == Out else (self.bus, up)
            if name not in ("wvalid", "wready"):
                m.d.comb += getattr(sink, name).eq(getattr(source, name))
        m.d.comb += [self.bus.wvalid.eq(up.wvalid & ~self.stall),
                     up.wready.eq(self.bus.wready & ~self.stall)]
        return m


def back_to_back(config, program, acc, seed, stall=None, timeout=4000, family=None):
    """Runs ``program`` (see `golden_program`) from reset, each instruction presented in the
    cycle after the one before was taken, and compares memory with the golden model. ``stall``:
    (beats, cycles): once that many W beats were written, no W beat is taken for that many
    cycles. ``family``: elaborated as for that FPGA family. Returns the cycles each
    instruction waited for ``ready`` and the cycles the W FIFO was full."""
    axi_mem, expected, instructions, _ = golden_program(config, program, acc, seed, ready=1.0,
                                                        valid=1.0, latency=0)
    engine = WatchedStore(config)
    sram = memory.Memory(shape=data.ArrayLayout(signed(32), config.cols),
                         depth=config.accumulator_rows, init=[[int(v) for v in r] for r in acc])
    bench = WStallBench(engine, sram)
    waits, seen = [], {"done": 0, "full": 0}

    async def testbench(ctx):
        ctx.set(engine.windows, RW_ALL)
        for instruction in instructions:
            waits.append(await put_instruction(ctx, engine.instr, instruction, engine))
        for _ in range(timeout):
            if seen["done"] == len(instructions):
                break
            await ctx.tick()
        assert seen["done"] == len(instructions), "hang"
        assert ctx.get(engine.error) == ErrorCode.NONE

    async def monitor(ctx):
        stalled = None
        async for _, _, done, full in ctx.tick().sample(engine.done, engine.beats.full):
            seen["done"] += done
            seen["full"] += full
            if stall and stalled is None and axi_mem.writes >= stall[0]:
                stalled = 0
                ctx.set(bench.stall, 1)
            if stalled is not None:
                stalled += 1
                if stalled == stall[1]:
                    ctx.set(bench.stall, 0)

    sim = Simulator(bench if family is None else ForFamily(bench, family))
    sim.add_clock(1e-6)
    sim.add_testbench(axi_mem.write_process(bench.bus), background=True)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(testbench)
    sim.run()
    np.testing.assert_array_equal(np.frombuffer(axi_mem.mem, dtype=np.uint8), expected)
    return waits, seen["full"]


def random_lanes(rng, cols):
    """Per-lane (bias, multiplier, shift) with the edge values: multipliers 0, 1, 65535 and
    2**15, shifts 0, 1 and 40, biases of both signs up to the int32 limits."""
    special = [(2**31 - 1, 65535, 40), (-2**31, 1, 0), (-7, 2**15, 25), (3, 1, 1),
               (0, 0, 5), (100, 65535, 63), (-100, 3, 1), (1 << 20, 40000, 29)]
    out = [special[j] if j < len(special) else
           (int(rng.integers(-2**31, 2**31)), int(rng.integers(0, 65536)), int(rng.integers(0, 64)))
           for j in range(cols)]
    order = rng.permutation(cols)
    return [out[j] for j in order]


def random_acc(rng, rows, lanes, bias):
    """Accumulator rows mixing full-range int32, small values, and per lane values whose
    ``(acc + bias) * multiplier`` is an exact tie of the lane's shift."""
    cols = len(lanes)
    acc = np.where(rng.random((rows, cols)) < 0.3, rng.integers(-2**31, 2**31, (rows, cols)),
                   rng.integers(-600, 600, (rows, cols)))
    for j, (b, mult, shift) in enumerate(lanes):
        # t * mult is an odd multiple of 2**(shift - 1) for t = odd * 2**(shift - 1 - v) when
        # 2**v is the largest power of two dividing mult.
        v = (mult & -mult).bit_length() - 1
        if not mult or shift - 1 - v < 0:
            continue
        for i in range(0, rows, 2):
            t = (2 * int(rng.integers(-40, 40)) + 1) << (shift - 1 - v)
            if -2**31 <= t - (b if bias else 0) < 2**31:
                acc[i, j] = t - (b if bias else 0)
                assert (t * mult) % (1 << shift) == 1 << (shift - 1)
    return acc


def requant_coverage(acc, lanes, bias):
    """The kinds of requantized elements seen: ties rounded to an even / odd quotient, and
    saturation of either sign."""
    b, mult, shift = (np.array(x) for x in zip(*lanes))
    p = (acc + (b if bias else 0)) * mult
    quotient = p >> shift
    tie = (shift > 0) & (p - (quotient << shift) == (1 << np.maximum(shift - 1, 0)))
    rounded = round_half_even_shift(p, shift)
    return {"tie_even": bool((tie & (quotient % 2 == 0)).any()),
            "tie_odd": bool((tie & (quotient % 2 == 1)).any()),
            "tie_negative": bool((tie & (p < 0)).any()),
            "high": bool((rounded > 127).any()), "low": bool((rounded < -128).any())}


def test_golden_rounding():
    # The golden model against Fraction's round (half to even), ties included.
    rng = np.random.default_rng(0)
    shift = rng.integers(0, 64, 4000)
    values = rng.integers(-2**49, 2**49, 4000)
    values[::2] = (2 * rng.integers(-9, 9, 2000) + 1) << np.maximum(shift[::2] - 1, 0)
    expected = [round(Fraction(int(v), 1 << int(s))) for v, s in zip(values, shift)]
    assert round_half_even_shift(values, shift).tolist() == expected
    assert round_half_even_shift([3, 5, -3, -5, 7], 1).tolist() == [2, 2, -2, -2, 4]


@pytest.mark.parametrize("width,queue_depth", [(32, 2), (128, 2), (32, 1)])
def test_params(width, queue_depth):
    # Reset values, then broadcast, then per-lane writes (lanes past cols ignored), on 16 lanes:
    # selected lanes on a 32-bit bus, all lanes on a 128-bit one; with one-instruction queues
    # each entry read from the first, the queue moving them down (`params_shift`).
    config = dataclasses.replace(with_width(WIDE, width), queue_depth=queue_depth)
    rng = np.random.default_rng(width)
    lanes = random_lanes(rng, 24)
    desc = descriptor(256, [(16, 0, 16, 1), (8, 0, 8, 16)], sram_row=4)
    desc32 = descriptor(1024, [(16, 0, 16, 4), (8, 0, 8, 64)], sram_row=4, elem_log2=2)
    every = {"bias": 1, "requant": 1}
    program = [(desc, every),
               params([(-5, 3, 1)], first_lane=9, broadcast=1),
               (desc, every),
               params(lanes[:8], first_lane=3),
               params(lanes[8:16], first_lane=12),
               params(lanes[16:], first_lane=65528),
               (desc, every),
               (desc32, {"bias": 1})]
    acc = random_acc(rng, config.accumulator_rows, lanes[:16], bias=True)
    acc[4:12] = rng.integers(-300, 300, (8, 16))
    outcomes, tiles = program_case(config, program, acc, seed=width)
    assert [cycles for _, cycles in outcomes[1:2] + outcomes[3:6]] == [1] * 4
    assert len({t.tobytes() for t in tiles[:3]}) == 3


@pytest.mark.parametrize("width,family,queue_depth", [
    (32, None, 2), (64, None, 2), (128, None, 2), (32, "ice40", 2), (64, "ice40", 2),
    (128, "ice40", 2), (32, "ice40", 1), (128, None, 1)])
def test_params_then_store(width, family, queue_depth):
    # From reset: the engine takes nothing while it sets every lane to the reset values; a
    # PARAMS writes an entry a cycle (taken in its 8th cycle; with broadcast, one cycle per row
    # of lanes / units); a STORE presented in the cycle after the last PARAMS was taken uses
    # every lane's new parameters, on 16 lanes with 1, 2 and 4 units (units start at any lane);
    # the same with the parameters in block RAM (iCE40), and with the entries shifted down
    # (one-instruction queues, `params_shift`).
    config = dataclasses.replace(with_width(WIDE, width), queue_depth=queue_depth)
    rows = 16 // min(16, width // 32)
    rng = np.random.default_rng(width + 5)
    # Two sets of parameters that give every lane other int8 results than the set before.
    lanes = [(100 * j - 700, 1000 + 37 * j, 16) for j in range(16)]
    again = [(-50 * j, 3000 - 91 * j, 17 + j % 2) for j in range(16)]
    acc = rng.integers(-3000, 3000, (config.accumulator_rows, 16))
    int8 = descriptor(64, [(15, 0, 15, 1), (6, 0, 6, 15)], sram_row=3)
    int32 = descriptor(512, [(16, 0, 16, 4), (5, 0, 5, 64)], sram_row=2, elem_log2=2)
    every = {"requant": 1, "bias": 1}
    broadcast = (9, 2, 1)
    program = [params([broadcast], first_lane=4, broadcast=1),
               (int32, {"bias": 1}),
               params(lanes[:1]),
               params(lanes[1:9], first_lane=1),
               params(lanes[9:], first_lane=9),
               (int8, every),
               params(again[:8]),
               params(again[8:], first_lane=8),
               (int8, every),
               (int32, {"bias": 1, "relu": 1})]
    waits, _ = back_to_back(config, program, acc, seed=width, family=family)
    eight = PARAMS_PER_INSTRUCTION - 1
    assert waits[0] == rows + rows - 1                    # the sweep, then a broadcast
    assert [waits[3], waits[4], waits[7]] == [eight] * 3  # PARAMS after PARAMS
    # Each int8 STORE saw every lane's new parameters (the old ones give other results).
    values = acc[3:3 + 6, :15]
    for old, new in (([broadcast] * 16, lanes), (lanes, again)):
        results = [epilogue(values, *(np.array(x)[:15] for x in zip(*p)), requant=True)
                   for p in (old, new)]
        assert (results[0] != results[1]).any(axis=0).all()


@pytest.mark.parametrize("width", [32, 64])
def test_back_pressure(width):
    # The memory stops taking write beats in the middle of a requantized, pooled stream and of
    # an int32 one: the W FIFO fills (seen full for over 30 cycles), the epilogue pipeline
    # stalls, then resumes; nothing is lost or repeated.
    config = with_width(TALL, width)
    rng = np.random.default_rng(width + 9)
    lanes = random_lanes(rng, 16)
    acc = conv_image(rng, 6, 8, 16, 4, config.accumulator_rows)
    pooled = descriptor(0, [(16, 0, 16, 1), (4, 0, 4, 16), (3, 0, 3, 64)], sram_row=4)
    int32 = descriptor(1024, [(16, 0, 16, 4), (40, 0, 40, 64)], sram_row=4, elem_log2=2)
    program = [params(lanes[:8]), params(lanes[8:], first_lane=8),
               (pooled, {"requant": 1, "bias": 1, "relu": 1, "pool": 1, "pool_pitch": 8}),
               (int32, {"bias": 1})]
    pooled_beats = 192 // (width // 8)  # a beat per 16 cycles: a long stall fills the FIFO
    for stall in ((pooled_beats // 3, 400), (pooled_beats + 100, 60)):
        _, full = back_to_back(config, program, acc, seed=width, stall=stall)
        assert full > 30


def boundary_products(rng):
    """(t, multiplier, shift) with t * multiplier next to where the result saturates (int8,
    int32, and the 32-bit quotient the datapath clamps to) or rounds (ties of both parities),
    for every shift; t next to the int32 limits; random ones."""
    cases = [(t, 1, 0) for t in (2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 2, -2**32)]
    for shift in range(64):
        half = 1 << max(shift - 1, 0)
        for q in (1, 2, 127, 128, -128, -129, 2**15 - 1, 2**15, -2**15, -2**15 - 1,
                  2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 1, -2**32):
            for off in (0, -1, half - 1, half, half + 1):
                target = (q << shift) + off
                m = int(rng.choice([1, 3, 65535, rng.integers(1, 65536)]))
                cases += [(t, m, shift) for t in (target // m, target // m + 1)
                          if -2**32 <= t <= 2**32 - 2]
    for _ in range(2000):
        cases.append((int(rng.integers(-2**32, 2**32 - 1)), int(rng.integers(0, 65536)),
                      int(rng.integers(0, 64))))
    return cases


@pytest.mark.parametrize("requant,int8,relu,multiplier,family,pool", [
    (1, 1, 0, True, None, True), (1, 1, 1, True, None, True), (0, 0, 0, True, None, True),
    (0, 0, 1, True, None, True),
    (1, 0, 0, True, None, True), (1, 0, 1, True, None, True),  # scaled to int32 (row scales)
    (1, 1, 0, False, None, True), (1, 1, 1, False, None, True), (0, 0, 0, False, None, True),
    (1, 1, 1, False, None, False), (1, 0, 0, True, None, False),  # no stage 1 (micro's)
    (1, 1, 0, True, "ecp5", True), (1, 0, 0, True, "ecp5", True), (0, 0, 1, True, "ecp5", True)])
def test_datapath(requant, int8, relu, multiplier, family, pool):
    # EpilogueDatapath alone, one lane, a value a cycle: t = acc + bias over the whole 33-bit
    # range, products next to every saturation and rounding boundary of every shift, against
    # the golden model (on ECP5, t * multiplier from MULT18X18D pairs). Without the multiplier,
    # the params' multiplier is ignored (as if 1); without pooling, a stage less.
    rng = np.random.default_rng(requant * 2 + relu + 4 * int8)
    cases = boundary_products(rng)
    t, mult, shift = (np.array(c, dtype=np.int64) for c in zip(*cases))
    if not multiplier:  # t itself next to the boundaries
        t = np.clip(t * mult, -2**32, 2**32 - 2)
    acc = np.clip(t, -2**31, 2**31 - 1)
    bias = t - acc
    expected = epilogue(acc, bias, mult if multiplier else 1, shift, requant=bool(requant),
                        relu=bool(relu), int8=bool(int8))
    dut = EpilogueDatapath(1, multiplier=multiplier, pool=pool)
    lane_acc, lane_y = (data.View(data.ArrayLayout(signed(32), 1), v)[0] for v in (dut.acc, dut.y))
    lane_params = data.View(data.ArrayLayout(EpilogueParams, 1), dut.params)[0]
    got = []

    async def testbench(ctx):
        ctx.set(dut.first, 1)
        ctx.set(dut.int8, int8)
        ctx.set(dut.options, {"bias": 1, "requant": requant, "relu": relu})
        for n in range(len(cases) + dut.latency):
            if n < len(cases):
                ctx.set(lane_acc, int(acc[n]))
                ctx.set(lane_params, {"bias": int(bias[n]), "multiplier": int(mult[n]),
                                      "shift": int(shift[n])})
            await ctx.tick()
            if n >= dut.latency - 1:
                got.append(ctx.get(lane_y))

    sim = Simulator(dut if family is None else ForFamily(dut, family))
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    got = np.array(got[:len(cases)])
    mismatch = np.flatnonzero(got != expected)
    assert not mismatch.size, [(cases[i], int(got[i]), int(expected[i])) for i in mismatch[:5]]
    distinct = (60 if multiplier else 25) if requant else 1000
    assert len({int(v) for v in expected}) > distinct  # not all saturated


EPILOGUES = {
    "none": {},
    "bias": {"bias": 1},
    "relu": {"relu": 1},
    "bias_relu": {"bias": 1, "relu": 1},
    "requant": {"requant": 1},
    "requant_bias": {"requant": 1, "bias": 1},
    "requant_relu": {"requant": 1, "relu": 1},
    "requant_bias_relu": {"requant": 1, "bias": 1, "relu": 1},
}


@pytest.mark.parametrize("name", EPILOGUES)
def test_epilogue_options(name):
    # Every option alone and combined, on 8 lanes of a 32-bit bus (lanes selected per step) and
    # of a 64-bit one (all lanes), against the golden model on random accumulators with ties.
    fields = EPILOGUES[name]
    seed = sum(map(ord, name))
    rng = np.random.default_rng(seed)
    for width in (32, 64):
        config = CoreConfig(rows=4, cols=8, scratchpad_kib=1, accumulator_kib=2,
                            axi_data_width=width)
        lanes = random_lanes(rng, 8)
        acc = random_acc(rng, config.accumulator_rows, lanes, bias=fields.get("bias"))
        if fields.get("bias") and not fields.get("requant"):
            acc[::3] = np.where(rng.random((len(acc[::3]), 8)) < 0.5, 2**31 - 1, -2**31)
        if fields.get("requant"):
            assert all(requant_coverage(acc[10:42], lanes, fields.get("bias")).values())
        elem = 1 if fields.get("requant") else 4
        desc = descriptor(64 * elem, [(8, 0, 8, elem), (32, 0, 32, 8 * elem)], sram_row=10,
                          elem_log2=2 if elem == 4 else 0)
        program = [params(lanes), (desc, fields)]
        _, (tile,) = program_case(config, program, acc, seed=seed + width)
        if not fields.get("requant"):  # saturation of both signs happens
            assert (tile == 2**31 - 1).any() == bool(fields.get("bias"))
            assert (tile == -2**31).any() == (bool(fields.get("bias")) and not fields.get("relu"))


def test_shift_only_epilogue():
    # A core without the epilogue multiplier (micro's), 5 lanes on a 32-bit bus: PARAMS'
    # multipliers (random, not 1) are ignored; bias, round-half-even shift, saturation, ReLU and
    # pooling as the golden model with multiplier 1, int8 and int32, pooled and not; a PARAMS
    # from lane 3 (fewer lanes than entries).
    config = CoreConfig(rows=4, cols=5, scratchpad_kib=1, accumulator_kib=2, axi_data_width=32,
                        softmax=False, epilogue_multiplier=False, queue_depth=1)
    rng = np.random.default_rng(16)
    lanes = [(int(rng.integers(-300, 300)), int(rng.integers(2, 65536)), shift)
             for shift in (1, 4, 5, 6, 40)]
    base, h, w = 3, 4, 5
    acc = conv_image(rng, h, w, 5, base, config.accumulator_rows)
    acc[base:base + h * w:3] = rng.integers(-2**31, 2**31, (7, 5))
    pool = {"pool": 1, "pool_pitch": w}
    int8 = descriptor(0, [(5, 0, 5, 1), (h * w, 0, h * w, 5)], sram_row=base)
    program = [params(lanes),
               (int8, {"requant": 1, "bias": 1}),
               (int8, {"requant": 1, "relu": 1}),
               (descriptor(512, [(5, 0, 5, 4), (2, 0, 2, 20), (2, 0, 2, 40)], sram_row=base,
                           elem_log2=2), {**pool, "bias": 1, "relu": 1}),
               (descriptor(1024, [(5, 0, 5, 1), (2, 0, 2, 5), (2, 0, 2, 10)], sram_row=base),
                {**pool, "requant": 1, "bias": 1}),
               # Entries 0 and 1 to lanes 3 and 4; entries 2.. past the 5 lanes change nothing.
               params([(-77, 9, 2), (1000, 5, 3), (5, 5, 5)] * 2, first_lane=3),
               (int8, {"requant": 1, "bias": 1})]
    _, tiles = program_case(config, program, acc, seed=16)
    assert (tiles[4][..., :3] == tiles[0][..., :3]).all()
    assert (tiles[4][..., 3:] != tiles[0][..., 3:]).any(axis=(0, 1, 2)).all()
    image = acc[base:base + h * w]
    b, _, shift = (np.array(x) for x in zip(*lanes))
    np.testing.assert_array_equal(tiles[0][0, 0], epilogue(image, b, 1, shift, requant=True))
    assert len(np.unique(tiles[0])) > 20 and {-128, 127} <= set(tiles[0].flat)


@pytest.mark.parametrize("width", [32, 64, 128])
def test_int8_tiles(width):
    # Requantized int8 tiles: contiguous rows clipped on both sides, across a 4 KiB boundary and
    # sharing beats; then strided (dim-0 stride 2 and 3) 4-D tiles with padding on every side.
    config = with_width(WIDE, width)
    rng = np.random.default_rng(width)
    lanes = random_lanes(rng, 16)
    acc = random_acc(rng, config.accumulator_rows, lanes, bias=True)
    fields = {"requant": 1, "bias": 1, "relu": width == 64}
    program = [params(lanes[:8]), params(lanes[8:], first_lane=8),
               (descriptor(4096 - 37, [(16, -3, 11, 1), (5, -1, 4, 11), (2, 0, 2, 45)],
                           sram_row=2), fields)]
    for stride0 in (2, 3):
        extents = [int(rng.integers(1, 17)), 2, 2, 1]
        bounds = [int(rng.integers(1, 12)), 3, 2, 2]
        starts = [int(rng.integers(1 - extents[0], bounds[0])), -1, 1, 1]
        strides = [stride0]
        for d in range(3):
            strides.append(strides[-1] * bounds[d] + int(rng.integers(0, 3)))
        dims = list(zip(extents, starts, bounds, strides))
        program.append((descriptor(int(rng.integers(0, 3000)), dims, sram_row=int(
            rng.integers(0, 12))), fields))
    program_case(config, program, acc, seed=width)


def conv_image(rng, height, width, lanes, base, rows):
    """Accumulator rows holding a (height, width) image of ``lanes`` channels, raster ordered
    from row ``base``, random around it."""
    acc = rng.integers(-2**31, 2**31, (rows, lanes))
    acc[base:base + height * width] = rng.integers(-3000, 3000, (height * width, lanes))
    return acc


@pytest.mark.parametrize("width", [32, 128])
def test_pool(width):
    # A 6x7 image (odd pitch) of 16 channels, pooled to 3x3 (the last column dropped): whole,
    # as a partial tile clipped by the tensor's bounds, int32 and requantized, contiguous and
    # strided (channels-first) outputs.
    config = with_width(TALL, width)
    rng = np.random.default_rng(width)
    lanes = random_lanes(rng, 16)
    base, h, w = 5, 6, 7
    acc = conv_image(rng, h, w, 16, base, config.accumulator_rows)
    pool = {"pool": 1, "pool_pitch": w}
    nhwc = [(16, 0, 16, 1), (3, 0, 3, 16), (3, 0, 3, 48)]
    program = [params(lanes[:8]), params(lanes[8:], first_lane=8),
               (descriptor(0, nhwc, sram_row=base), {**pool, "requant": 1, "bias": 1}),
               (descriptor(512, [(16, 0, 16, 4), (3, 0, 3, 64), (3, 0, 3, 192)], sram_row=base,
                           elem_log2=2), {**pool, "bias": 1, "relu": 1}),
               # Output pixels (1..2, 1..3) of a 3x3 map, the column past it clipped; lanes
               # 0..11, channels-first (dim-0 stride 9).
               (descriptor(1024, [(12, 0, 12, 9), (3, 1, 3, 1), (2, 1, 3, 3)],
                           sram_row=base + 2 + 2 * w), {**pool, "requant": 1, "relu": 1})]
    outcomes, tiles = program_case(config, program, acc, seed=width)
    # The first two are the whole pooled image, in the spec's order (epilogue, then pool).
    image = acc[base:base + h * w].reshape(h, w, 16)
    b, mult, shift = (np.array(x) for x in zip(*lanes))
    np.testing.assert_array_equal(
        tiles[0][0], maxpool2x2(epilogue(image, b, mult, shift, requant=True)))
    np.testing.assert_array_equal(tiles[1][0], maxpool2x2(epilogue(image, b, relu=True)))
    # Four reads per part of a step: the epilogue takes a beat of int32 (width / 32 lanes) at
    # a time, so each output pixel's 16 int8 channels pass in 16 / (width / 32) parts.
    assert outcomes[2][1] < 4 * 9 * 16 / min(16, width // 32) + 60


def test_pool_last_rows():
    # Windows reading up to the last accumulator row (63): pitch 5, 2 x 3 windows from row 35.
    rng = np.random.default_rng(3)
    acc = rng.integers(-2**31, 2**31, (64, 4))
    desc = descriptor(0, [(4, 0, 4, 4), (2, 0, 2, 16), (3, 0, 3, 32)], sram_row=35, elem_log2=2)
    assert 35 + 2 * 5 * 2 + 2 * 1 + 5 + 1 == 63
    program_case(SMALL, [(desc, {"pool": 1, "pool_pitch": 5, "bias": 1})], acc, seed=3)


@pytest.mark.parametrize("family", [None, "ice40"])
@pytest.mark.parametrize("width", [32, 128])
def test_per_row(width, family):
    # Per-row parameters (output channels on the accumulator rows, as conv2d's pixels lowering
    # stores them): every lane of tile row i1 takes entry i1, with bias + requant + ReLU (ties
    # and saturation in every row), int32 with bias; 16 rows (the whole table) and 5 from an
    # odd row; 13 lanes clipped on both sides; channels-first (dim-1 stride a plane); per-lane
    # STOREs between them and new PARAMS after, on 16 lanes with 1 and 4 epilogue units; the
    # same with the parameters in block RAM (iCE40).
    config = with_width(TALL, width)
    rng = np.random.default_rng(width + 11)
    lanes, again = random_lanes(rng, 16), random_lanes(rng, 16)
    acc = random_acc(rng, config.accumulator_rows, lanes, bias=True)
    # Rows 7..22: row 7 + j has entry j's ties (random_acc's lanes, transposed).
    block = random_acc(rng, 16, lanes, bias=True)
    acc[7:23] = block.T
    assert all(requant_coverage(block, lanes, bias=True).values())
    every = {"bias": 1, "requant": 1, "relu": 1, "per_row": 1}
    planes = descriptor(100, [(16, 0, 16, 1), (16, 0, 16, 61)], sram_row=7)
    clipped = descriptor(3000, [(13, -2, 9, 1), (5, 0, 5, 40)], sram_row=11)
    int32 = descriptor(4096 - 60, [(16, 0, 16, 4), (16, 0, 16, 64)], sram_row=7, elem_log2=2)
    program = [params(lanes[:8]), params(lanes[8:], first_lane=8),
               (planes, every),
               (clipped, {**every, "relu": 0}),
               (planes, {"bias": 1, "requant": 1}),       # per lane, between per-row STOREs
               (int32, {"bias": 1, "per_row": 1}),
               params(again[:8]), params(again[8:], first_lane=8),
               (planes, every)]
    _, tiles = program_case(config, program, acc, seed=width, family=family)
    rows = acc[7:23, :16]
    b, mult, shift = (np.array(x)[:, None] for x in zip(*lanes))
    np.testing.assert_array_equal(tiles[0][0, 0], epilogue(rows, b, mult, shift, requant=True,
                                                           relu=True))
    # Per-row is not per-lane, and the new PARAMS changed most rows (some saturate either way).
    assert (tiles[0] != tiles[2]).any() and (tiles[0] != tiles[4]).any(axis=-1).sum() >= 12
    assert (tiles[0] > 0).any() and (tiles[0] == 0).any() and (tiles[1] == -128).any()


@pytest.mark.parametrize("width", [32, 64, 128])
def test_per_row_small(width):
    # A 4-lane core with 1, 2 and 4 epilogue units (4: a unit a lane): 4 rows (the whole
    # table), 1 row, 1 lane.
    config = with_width(SMALL, width)
    rng = np.random.default_rng(5)
    lanes = random_lanes(rng, 4)
    acc = random_acc(rng, SMALL.accumulator_rows, lanes, bias=True)
    acc[30:34] = random_acc(rng, 4, lanes, bias=True).T
    every = {"bias": 1, "requant": 1, "per_row": 1}
    program = [params(lanes),
               (descriptor(0, [(4, 0, 4, 1), (4, 0, 4, 7)], sram_row=30), every),
               (descriptor(64, [(4, 0, 4, 1)], sram_row=33), every),
               (descriptor(128, [(1, 0, 1, 4), (4, 0, 4, 4)], sram_row=30, elem_log2=2),
                {"bias": 1, "relu": 1, "per_row": 1})]
    _, tiles = program_case(config, program, acc, seed=5)
    b, mult, shift = lanes[0]  # entry i1 = 0: counted from the STORE's sram_row
    np.testing.assert_array_equal(tiles[1][0, 0, 0], epilogue(acc[33, :4], b, mult, shift,
                                                              requant=True))


@pytest.mark.parametrize("width", [32, 64, 128])
def test_row_scales(width):
    # Row scales (as NORMALIZE writes them, O / l of attention): tile row i1 takes multiplier
    # and shift of row scale scale_row + i1 (int32 out, ties and int32 saturation, the lane's
    # bias still applies); 16 rows from an odd row and scale row, clipped lanes; then per-lane
    # requantization to int32 (lane parameters, not the row scales); 1, 2 and 4 epilogue units.
    config = with_width(TALL, width)
    rng = np.random.default_rng(width + 21)
    lanes = random_lanes(rng, 16)
    scales = np.array([(65535, 31), (2**15, 16), (0, 0), (40000, 20), (1, 0), (65535, 0)]
                      + [(int(rng.integers(2**15, 2**16)), int(rng.integers(0, 32)))
                         for _ in range(config.probability_rows - 6)], dtype=np.int64)
    acc = random_acc(rng, config.accumulator_rows, lanes, bias=True)
    # Rows 7..22 through scale rows 3..18: the ties of scale row 3 + j in row 7 + j.
    as_lanes = [(0, int(mul), int(sh)) for mul, sh in scales[3:19]]
    acc[7:23] = random_acc(rng, 16, as_lanes, bias=False).T
    scaled = {"requant": 1, "row_scale": 1, "scale_row": 3}
    rows = descriptor(0, [(16, 0, 16, 4), (16, 0, 16, 64)], sram_row=7, elem_log2=2)
    clipped = descriptor(2048, [(13, -2, 9, 4), (5, 0, 5, 40)], sram_row=11, elem_log2=2)
    program = [params(lanes[:8]), params(lanes[8:], first_lane=8),
               (rows, scaled),
               (clipped, {**scaled, "bias": 1, "scale_row": 27}),
               (rows, {"requant": 1, "bias": 1})]  # lane parameters, int32
    _, tiles = program_case(config, program, acc, seed=width, scales=scales)
    mult, shift = scales[3:19, :1], scales[3:19, 1:]
    np.testing.assert_array_equal(tiles[0][0, 0], epilogue(acc[7:23, :16], None, mult, shift,
                                                           requant=True, int8=False))
    assert (tiles[0] == 2**31 - 1).any() and (tiles[0] == -2**31).any()
    assert (tiles[0] != tiles[2]).any(axis=-1).sum() >= 12  # row scales are not lane ones


STORE_ERRORS = {
    "requant_int16": (descriptor(0, [(4, 0, 4, 2)], elem_log2=1), {"requant": 1},
                      ErrorCode.BAD_ELEMENT),
    # Row scales: requant, a 2-D tile, no pooling or per-row; rows past the row scales (32).
    "row_scale_no_requant": (descriptor(0, [(4, 0, 4, 4)], elem_log2=2), {"row_scale": 1},
                             ErrorCode.BAD_EXTENT),
    "row_scale_3d": (descriptor(0, [(4, 0, 4, 4), (2, 0, 2, 16), (2, 0, 2, 32)], elem_log2=2),
                     {"requant": 1, "row_scale": 1}, ErrorCode.BAD_EXTENT),
    "row_scale_pool": (descriptor(0, [(4, 0, 4, 4), (1, 0, 1, 16)], elem_log2=2),
                       {"requant": 1, "row_scale": 1, "pool": 1, "pool_pitch": 4},
                       ErrorCode.BAD_EXTENT),
    "row_scale_per_row": (descriptor(0, [(4, 0, 4, 4), (2, 0, 2, 16)], elem_log2=2),
                          {"requant": 1, "row_scale": 1, "per_row": 1}, ErrorCode.BAD_EXTENT),
    "row_scale_range": (descriptor(0, [(4, 0, 4, 4), (3, 0, 3, 16)], elem_log2=2),
                        {"requant": 1, "row_scale": 1, "scale_row": 30}, ErrorCode.SRAM_RANGE),
    "int32_int8": (descriptor(0, [(4, 0, 4, 1)], elem_log2=0), {"bias": 1},
                   ErrorCode.BAD_ELEMENT),
    "elem_log2_1": (descriptor(0, [(4, 0, 4, 2)], elem_log2=1), {"requant": 1},
                    ErrorCode.BAD_ELEMENT),
    "pool_extent3": (descriptor(0, [(4, 0, 4, 1), (1, 0, 1, 4), (1, 0, 1, 4), (2, 0, 2, 8)]),
                     {"requant": 1, "pool": 1, "pool_pitch": 4}, ErrorCode.BAD_EXTENT),
    "pool_pitch_0": (descriptor(0, [(4, 0, 4, 4)], elem_log2=2), {"pool": 1},
                     ErrorCode.BAD_EXTENT),
    # The highest row read would be 36 + 20 + 2 + 5 + 1 = 64 (test_pool_last_rows: from 35).
    "pool_sram_range": (descriptor(0, [(4, 0, 4, 4), (2, 0, 2, 16), (3, 0, 3, 32)],
                                   sram_row=36, elem_log2=2),
                        {"pool": 1, "pool_pitch": 5}, ErrorCode.SRAM_RANGE),
    "pool_sram_range_saturating": (descriptor(0, [(4, 0, 4, 4), (65535, 0, 1, 0),
                                                  (65535, 0, 1, 0)], elem_log2=2),
                                   {"pool": 1, "pool_pitch": 65535}, ErrorCode.SRAM_RANGE),
    # Per-row: at most cols (4) rows, a 2-D tile, no pooling.
    "per_row_rows": (descriptor(0, [(4, 0, 4, 1), (5, 0, 5, 4)]), {"requant": 1, "per_row": 1},
                     ErrorCode.BAD_EXTENT),
    "per_row_3d": (descriptor(0, [(4, 0, 4, 1), (2, 0, 2, 4), (2, 0, 2, 8)]),
                   {"requant": 1, "per_row": 1}, ErrorCode.BAD_EXTENT),
    "per_row_4d": (descriptor(0, [(4, 0, 4, 1), (1, 0, 1, 4), (1, 0, 1, 4), (2, 0, 2, 8)]),
                   {"requant": 1, "per_row": 1}, ErrorCode.BAD_EXTENT),
    "per_row_pool": (descriptor(0, [(4, 0, 4, 1), (1, 0, 1, 4), (1, 0, 1, 4)]),
                     {"requant": 1, "per_row": 1, "pool": 1, "pool_pitch": 4},
                     ErrorCode.BAD_EXTENT),
    "per_row_int32_int8": (descriptor(0, [(4, 0, 4, 1), (5, 0, 5, 4)]), {"per_row": 1},
                           ErrorCode.BAD_ELEMENT),
    "int8_window": (descriptor(0xAF8, [(4, 0, 4, 1), (8, 0, 8, 0x100)]), {"requant": 1},
                    ErrorCode.STORE_WINDOW),
}


def test_row_scales_need_the_softmax_unit():
    # A core without the softmax unit has no row scales: a STORE with row_scale is
    # UNKNOWN_OPCODE, found before any access; the same STORE without it runs.
    config = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, softmax=False)
    desc = descriptor(0, [(4, 0, 4, 4), (2, 0, 2, 16)], elem_log2=2)
    init = np.zeros((config.accumulator_rows, config.cols), dtype=np.int64)
    for fields, code in (({"requant": 1}, ErrorCode.NONE),
                         ({"requant": 1, "row_scale": 1}, ErrorCode.UNKNOWN_OPCODE)):
        axi_mem = AxiMemory(MEM_SIZE, 64, allowed=[(0, MEM_SIZE)], seed=3)
        outcomes, _ = run("store", config, [store(desc, **fields)], axi_mem, RW_ALL, init)
        assert [o[0] for o in outcomes] == [code]
        assert axi_mem.aw == (code == ErrorCode.NONE)


@pytest.mark.parametrize("case", STORE_ERRORS)
def test_errors(case):
    desc, fields, code = STORE_ERRORS[case]
    rng = np.random.default_rng(7)
    axi_mem = AxiMemory(MEM_SIZE, 64, allowed=ERROR_ALLOWED, seed=7)
    init = rng.integers(-100, 100, (SMALL.accumulator_rows, SMALL.cols))
    # A good store, a PARAMS, the failing one, then one more that must not be accepted.
    good = store(descriptor(0x10, [(4, 0, 4, 1)], sram_row=9), requant=1)
    program = [good, params([(1, 1, 0)], broadcast=1), store(desc, **fields), good]
    outcomes, _ = run("store", SMALL, program, axi_mem, ERROR_WINDOWS, init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE, ErrorCode.NONE, code]
    assert axi_mem.in_flight() == 0
    if code != ErrorCode.STORE_WINDOW:  # checked before touching memory
        assert axi_mem.aw == 1


def test_throughput(capsys):
    """Elements per cycle with an always-ready, zero-latency memory (reported, and bounded):
    the epilogue is a beat of int32 wide (2 lanes on a 64-bit bus), so int32 rows move a beat
    a cycle, int8 rows 2 lanes a cycle, pooled ones 2 lanes per four cycles."""
    fast = {"ready": 1.0, "valid": 1.0, "latency": 0}
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=4,
                        axi_data_width=64)
    rng = np.random.default_rng(1)
    acc = rng.integers(-2**31, 2**31, (config.accumulator_rows, 16))
    report = {}
    cases = {"int8 contiguous": (descriptor(0, [(16, 0, 16, 1), (32, 0, 32, 16)]),
                                 {"requant": 1}, 512),
             "int32 contiguous": (descriptor(0, [(16, 0, 16, 4), (32, 0, 32, 64)], elem_log2=2),
                                  {"bias": 1}, 512),
             "int8 pooled": (descriptor(0, [(16, 0, 16, 1), (4, 0, 4, 16), (4, 0, 4, 64)]),
                             {"requant": 1, "pool": 1, "pool_pitch": 8}, 256)}
    for name, (desc, fields, elements) in cases.items():
        outcomes, _ = program_case(config, [(desc, fields)], acc, seed=1, **fast)
        report[name] = elements / outcomes[0][1]
    with capsys.disabled():
        print("\nstore elements/cycle:", {k: round(v, 2) for k, v in report.items()})
    assert report["int8 contiguous"] > 1.6 and report["int32 contiguous"] > 1.6
    assert report["int8 pooled"] > 0.4
