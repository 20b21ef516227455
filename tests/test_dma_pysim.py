"""amaranth.sim tests of the tile walker and the LOAD/STORE engines: numpy vs. a random AXI memory."""
import collections
import itertools
import random
from dataclasses import replace

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.arch import MAX_OUTSTANDING
from tpugen.hdl.dma_front import DmaFront, SharedDmaFront
from tpugen.hdl.load import LoadEngine, load_front_client
from tpugen.hdl.store import StoreEngine, store_front_client
from tpugen.hdl.walker import BurstPlanner, ElementStage, TileCheck, TileWalker, window_ok
from tpugen.isa import (NUM_WINDOWS, ErrorCode, Opcode, RowScale, Window, decode, encode_tile,
                        window_end)
from tpugen.firmware.program import Program
from tpugen.sim.fuzz_model import DONE, MEMORY_SIZE, predict
from tpugen.sim.pysim_axi import AxiMemory
from tpugen.sim.testbench import (ForFamily, put_instruction, run_testbench, stream_get,
                                  stream_put, stream_take)

CONFIG = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1)
SHARED = replace(CONFIG, shared_dma=True)
"""`CONFIG` whose engines walk through one `SharedDmaFront` (`CoreConfig.shared_dma`)."""
MEM_SIZE = 1 << 14


def descriptor(base, dims, sram_row=0, elem_log2=0, lane=0):
    """A tile (`firmware.program.tensor` fields, encoded by `isa.encode_tile` for the hardware):
    ``dims``: (extent, start, bound, stride) from dim 0 up; missing dims have extent 1."""
    dims = list(dims) + [(1, 0, 1, 0)] * (4 - len(dims))
    return {"base": base, "elem_log2": elem_log2, "sram_row": sram_row, "lane": lane,
            "dims": [dict(zip(("extent", "start", "bound", "stride"), d)) for d in dims]}


def window(base, size, read, write, address_width=32):
    """The `isa.window_layout` value the control registers of a core of ``address_width``
    derive from a window's registers: enabled if its size is not 0 and its base inside the
    address space."""
    enabled = bool(size) and base < 1 << address_width
    return {"base": base % (1 << address_width), "end": window_end(base, size, address_width),
            "read": enabled and bool(read), "write": enabled and bool(write)}


def windows(*specs):
    """``(base, size, permissions)`` with permissions a subset of "rw"; the rest disabled."""
    out = [window(b, s, "r" in p, "w" in p) for b, s, p in specs]
    return out + [window(0, 0, False, False)] * (NUM_WINDOWS - len(out))


RW_ALL = windows((0, MEM_SIZE, "rw"))


def tensor_addresses(desc):
    """Byte address of every tensor element (modulo 2**32, as the core walks them), shape
    (bound3, bound2, bound1, bound0)."""
    dims = desc["dims"]
    grids = np.meshgrid(*[np.arange(d["bound"]) for d in reversed(dims)], indexing="ij")
    return (desc["base"] + sum(g * d["stride"] for g, d in zip(grids, reversed(dims)))) % 2**32


def padded_tile(tensor, desc):
    """The tile of ``tensor`` (bound3..bound0) as np.pad + slicing: shape (e3, e2, e1, e0)."""
    dims = list(reversed(desc["dims"]))
    pad = [(max(0, -d["start"]), max(0, d["start"] + d["extent"] - d["bound"])) for d in dims]
    padded = np.pad(tensor, pad)
    return padded[tuple(slice(d["start"] + p[0], d["start"] + p[0] + d["extent"])
                        for d, p in zip(dims, pad))]


class Bench(Elaboratable):
    """An engine with its SRAM (and a store engine's row scales, ``scales``) attached through
    ``wiring.connect``; with `CoreConfig.shared_dma` a `SharedDmaFront` too, whose other port
    stays idle."""

    def __init__(self, engine, sram, scales=None):
        self.engine, self.sram, self.scales = engine, sram, scales

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = self.engine
        m.submodules.sram = self.sram
        config = self.engine.config
        if config.shared_dma:
            m.submodules.front = front = SharedDmaFront(
                load_front_client(config), store_front_client(config),
                config.axi_data_width // 8, config.windows, config.descriptor_dims)
            kind = "load" if isinstance(self.engine, LoadEngine) else "store"
            wiring.connect(m, getattr(front, kind), self.engine.front)
            m.d.comb += front.windows.eq(self.engine.windows)
        if isinstance(self.engine, LoadEngine):
            wiring.connect(m, self.engine.sp_write, self.sram.write_port(granularity=1))
        else:
            wiring.connect(m, self.engine.acc_read, self.sram.read_port())
        if self.scales is not None:
            m.submodules.scales = self.scales
            wiring.connect(m, self.engine.scale_read, self.scales.read_port())
        return m


def run(kind, config, descs, axi_mem, wins, sram_init, timeout=4000, scales=None, family=None):
    """Runs ``descs`` (descriptors, or encoded instructions) one after another; returns
    ([(error, cycles)], final SRAM rows). ``scales``: the store engine's row scales, (multiplier,
    shift) per row; ``family``: elaborated as for that FPGA family."""
    if kind == "load":
        engine, opcode = LoadEngine(config), Opcode.LOAD
        shape, depth = data.ArrayLayout(signed(8), config.lanes), config.scratchpad_rows
    else:
        engine, opcode = StoreEngine(config), Opcode.STORE
        shape, depth = data.ArrayLayout(signed(32), config.cols), config.accumulator_rows
    sram = memory.Memory(shape=shape, depth=depth,
                         init=[[int(v) for v in row] for row in sram_init])
    scale_memory = None if scales is None else memory.Memory(
        shape=RowScale, depth=config.probability_rows,
        init=[{"multiplier": int(mul), "shift": int(sh)} for mul, sh in scales])
    bench = Bench(engine, sram, scale_memory)
    outcomes, rows = [], []
    valids = ["arvalid"] if kind == "load" else ["awvalid", "wvalid"]

    async def testbench(ctx):
        ctx.set(engine.windows, wins)
        for desc in descs:
            if isinstance(desc, bytes):  # an encoded instruction
                await put_instruction(ctx, engine.instr, desc, engine)
            else:
                # (The union's member of the instruction: "load" or "store".)
                await stream_put(ctx, engine.instr, {kind: {"header": {"opcode": opcode},
                                                            "tensor": encode_tile(desc, wrap=True)}})
            progress = 0
            for cycles in range(1, timeout):
                _, _, done, error, busy, pulse = await ctx.tick().sample(
                    engine.done, engine.error, engine.busy, engine.progress)
                progress += pulse
                error = ErrorCode(error)
                assert busy or done or error != ErrorCode.NONE, "idle before done"
                if done or error != ErrorCode.NONE:
                    break
            else:
                raise AssertionError(f"hang: neither done nor error after {timeout} cycles")
            outcomes.append((error, cycles))
            # Progress: SRAM writes (load), or bus handshakes unless the tile is all padding (or
            # the instruction is a PARAMS).
            params = isinstance(desc, bytes) and decode(desc).header.opcode == Opcode.PARAMS
            assert (progress or error != ErrorCode.NONE or params or
                    (kind == "store" and axi_mem.aw == 0))
            if error != ErrorCode.NONE:
                assert axi_mem.in_flight() == 0  # drained before the error is raised
                for _ in range(20):  # held, no more instructions, nothing offered on the bus
                    await ctx.tick()
                    assert ctx.get(engine.error) == error
                    assert not ctx.get(engine.instr.ready) and not ctx.get(engine.busy)
                    assert not any(ctx.get(getattr(engine.axi, name)) for name in valids)
                break
        await ctx.tick()
        assert not ctx.get(engine.done)
        rows.append(np.array([[int(v) for v in ctx.get(sram.data[r])] for r in range(depth)]))

    sim = Simulator(bench if family is None else ForFamily(bench, family))
    sim.add_clock(1e-6)
    bus = engine.axi
    sim.add_testbench(axi_mem.read_process(bus) if kind == "load" else axi_mem.write_process(bus),
                      background=True)
    sim.add_testbench(testbench)
    sim.run()
    return outcomes, rows[0]


def load_case(config, desc, seed, width=None, family=None, **axi):
    """Random int8 tensor laid out by ``desc`` in memory; LOAD it and compare with numpy (the
    engine elaborated for FPGA ``family``)."""
    rng = np.random.default_rng(seed)
    config = config if width is None else CoreConfig(**{**config.__dict__, "axi_data_width": width})
    axi_mem = AxiMemory(MEM_SIZE, config.axi_data_width, allowed=[(0, MEM_SIZE)], seed=seed, **axi)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    addrs = tensor_addresses(desc)
    tensor = np.frombuffer(axi_mem.mem, dtype=np.int8)[addrs]
    init = rng.integers(-128, 128, (config.scratchpad_rows, config.lanes))
    outcomes, rows = run("load", config, [desc], axi_mem, RW_ALL, init, family=family)
    assert outcomes[0][0] == ErrorCode.NONE
    tile = padded_tile(tensor, desc)
    e = [d["extent"] for d in desc["dims"]]
    expected = init.copy()
    first, count, lane = desc["sram_row"], e[1] * e[2] * e[3], desc["lane"]
    expected[first:first + count, lane:] = 0  # the lanes below `lane` keep their contents
    expected[first:first + count, lane:lane + e[0]] = tile.reshape(count, e[0])
    np.testing.assert_array_equal(rows, expected)
    return outcomes[0][1], axi_mem


def test_load_2d_smoke():
    load_case(CONFIG, descriptor(100, [(4, -1, 5, 1), (3, -1, 2, 7)], sram_row=3), seed=1)


@pytest.mark.parametrize("width", [32, 64, 128])
def test_load_1d_padding_and_bus_widths(width):
    # extent0 == lanes: padding on both sides, then a row across a 4 KiB boundary; extent 1.
    load_case(CONFIG, descriptor(4093, [(4, -2, 1, 1)], sram_row=255), seed=width, width=width)
    load_case(CONFIG, descriptor(4094, [(4, -1, 3, 1)], sram_row=0), seed=width, width=width)
    load_case(CONFIG, descriptor(17, [(1, 0, 1, 1)]), seed=width + 1, width=width)


@pytest.mark.parametrize("seed", range(3))
def test_load_4d_random_padding(seed):
    rng = np.random.default_rng(seed)
    config = CoreConfig(rows=8, cols=4, scratchpad_kib=1, accumulator_kib=1,
                        axi_data_width=[32, 64, 128][seed])
    extents = [int(rng.integers(1, 9)), 3, 2, 2]
    bounds = [int(rng.integers(1, 10)) for _ in range(4)]
    starts = [int(rng.integers(1 - e, b)) for e, b in zip(extents, bounds)]  # overlapping
    starts[1], starts[2], starts[3] = -1, bounds[2] - 1, -1  # padding on every side
    strides = [1]
    for d in range(3):
        strides.append(strides[-1] * bounds[d] + int(rng.integers(0, 3)))
    dims = list(zip(extents, starts, bounds, strides))
    load_case(config, descriptor(int(rng.integers(0, 2000)), dims, sram_row=7), seed=seed)


@pytest.mark.parametrize("stride0", [2, 3, 9, 100])
def test_load_strided_dim0(stride0):
    dims = [(4, -1, 4, stride0), (3, 0, 5, 4 * stride0 + 1)]
    load_case(CONFIG, descriptor(64, dims, sram_row=10), seed=stride0)


@pytest.mark.parametrize("width", [32, 64, 128])
def test_load_contiguous_segments(width):
    # 16 lanes from unaligned, 4 KiB-crossing rows that share beats, padded on both sides.
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1)
    dims = [(16, -3, 11, 1), (5, -1, 4, 11), (2, 0, 2, 45)]
    load_case(config, descriptor(4096 - 37, dims, sram_row=4), seed=width, width=width)


@pytest.mark.parametrize("lane", [1, 3])
def test_load_at_a_first_lane(lane):
    # Lanes lane.. get the tile (padded on both sides in dim 0, zero past extent0), the lanes
    # below keep the random contents; an unaligned row across beats on 16 lanes too.
    dims = [(4 - lane, -1, 2, 1), (3, -1, 2, 7)]
    load_case(CONFIG, descriptor(100, dims, sram_row=3, lane=lane), seed=20 + lane)
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1)
    dims = [(16 - 5 * lane, -2, 9, 1), (3, 0, 3, 21)]
    load_case(config, descriptor(4096 - 11, dims, sram_row=5, lane=5 * lane), seed=lane)


@pytest.mark.parametrize("lane", [1, 2])
def test_store_from_a_first_lane(lane):
    dims = [(4 - lane, -1, 2, 4), (3, 0, 3, 12)]  # clipped left and right
    assert store_case(CONFIG, descriptor(400, dims, sram_row=5, elem_log2=2, lane=lane),
                      seed=lane)[0] == ErrorCode.NONE


def test_load_sequence_and_broadcast():
    # Back-to-back instructions; a stride 0 in dim 1 repeats a row (broadcast).
    rng = np.random.default_rng(5)
    axi_mem = AxiMemory(MEM_SIZE, 64, allowed=[(0, MEM_SIZE)], seed=5)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    descs = [descriptor(8, [(4, 0, 4, 1), (3, 0, 3, 0)], sram_row=0),
             descriptor(4090, [(3, 0, 4, 1), (2, 0, 2, 6)], sram_row=3),
             descriptor(0, [(4, 2, 4, 1)], sram_row=5),
             descriptor(1, [(4, 0, 4, 0), (40, 0, 40, 0)], sram_row=6)]  # 160 reads of one byte
    init = rng.integers(-128, 128, (CONFIG.scratchpad_rows, CONFIG.lanes))
    outcomes, rows = run("load", CONFIG, descs, axi_mem, RW_ALL, init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE] * 4
    mem = np.frombuffer(axi_mem.mem, dtype=np.int8)
    np.testing.assert_array_equal(rows[0:3], [mem[8:12]] * 3)
    np.testing.assert_array_equal(rows[3:5], [[*mem[4090:4093], 0], [*mem[4096:4099], 0]])
    np.testing.assert_array_equal(rows[5], [*mem[2:4], 0, 0])
    np.testing.assert_array_equal(rows[6:46], np.full((40, 4), mem[1]))
    np.testing.assert_array_equal(rows[46:], init[46:])


@pytest.mark.parametrize("seed, family", [(0, None), (1, None), (0, "ice40"), (1, "ice40")])
def test_engines_through_the_shared_front(seed, family):
    """Each engine alone through a `SharedDmaFront` (`CoreConfig.shared_dma`): the same tiles,
    bit-exact, as through its own front (padding, contiguous runs across a 4 KiB boundary,
    int32 elements clipped on every side); on an iCE40 through its plain register stage."""
    load_case(SHARED, descriptor(100 + seed, [(4, -1, 5, 1), (3, -1, 2, 7)], sram_row=3), seed,
              family=family)
    load_case(SHARED, descriptor(4094, [(4, -1, 3, 1), (2, 0, 2, 9)], sram_row=254), seed,
              family=family)
    store_case(SHARED, descriptor(400 + 4 * seed, [(4, -1, 3, 4), (3, 2, 4, 12)], sram_row=5,
                                  elem_log2=2), seed, family=family)
    store_case(SHARED, descriptor(4096 - 8, [(4, 0, 4, 4), (2, -1, 1, 16)], sram_row=60,
                                  elem_log2=2), seed, family=family)


def test_load_past_the_address_space_only_in_padding():
    # Row 1 would be at 2**32 but lies outside the tensor: padding, which encode_tile accepts.
    load_case(CONFIG, descriptor(0x100, [(4, 0, 4, 1), (2, 0, 1, 0xFFFFFF00)]), seed=2)


def store_case(config, desc, seed, width=None, wins=RW_ALL, allowed=((0, MEM_SIZE),),
               family=None, **axi):
    """Random accumulator rows; STORE a tile and compare memory with a numpy model (the engine
    elaborated for FPGA ``family``)."""
    rng = np.random.default_rng(seed)
    config = config if width is None else CoreConfig(**{**config.__dict__, "axi_data_width": width})
    axi_mem = AxiMemory(MEM_SIZE, config.axi_data_width, allowed=allowed, seed=seed, **axi)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    before = bytes(axi_mem.mem)
    acc = rng.integers(-2**31, 2**31, (config.accumulator_rows, config.cols))
    outcomes, _ = run("store", config, [desc], axi_mem, wins, acc, family=family)
    error, cycles = outcomes[0]
    if error != ErrorCode.NONE:
        return error, before, axi_mem
    e = [d["extent"] for d in desc["dims"]]
    first, count, lane = desc["sram_row"], e[1] * e[2] * e[3], desc["lane"]
    tile = acc[first:first + count, lane:lane + e[0]].reshape(e[3], e[2], e[1], e[0])
    # Clip the tile at the tensor bounds, then scatter it through the strides.
    dims = list(reversed(desc["dims"]))
    lo = [max(0, -d["start"]) for d in dims]
    hi = [min(d["extent"], d["bound"] - d["start"]) for d in dims]
    expected = np.frombuffer(before, dtype=np.uint8).copy()
    if all(h > l for l, h in zip(lo, hi)):
        part = tile[tuple(slice(l, h) for l, h in zip(lo, hi))]
        addrs = tensor_addresses(desc)[tuple(slice(d["start"] + l, d["start"] + h)
                                             for d, l, h in zip(dims, lo, hi))]
        values = part.astype("<i4").view(np.uint8).reshape(*part.shape, 4)
        for byte in range(4):
            expected[addrs + byte] = values[..., byte]
    np.testing.assert_array_equal(np.frombuffer(axi_mem.mem, dtype=np.uint8), expected)
    return error, cycles, axi_mem


@pytest.mark.parametrize("width", [32, 64, 128])
def test_store_clipped_2d(width):
    dims = [(4, -1, 3, 4), (3, 2, 4, 12)]  # clipped left, right and below
    assert store_case(CONFIG, descriptor(400, dims, sram_row=5, elem_log2=2),
                      seed=width, width=width)[0] == ErrorCode.NONE


@pytest.mark.parametrize("seed", range(3))
def test_store_4d_random(seed):
    rng = np.random.default_rng(10 + seed)
    width = [128, 64, 32][seed]
    extents = [int(rng.integers(1, 5)), 2, 3, 2]
    bounds = [int(rng.integers(1, 7)) for _ in range(4)]
    starts = [int(rng.integers(1 - e, b)) for e, b in zip(extents, bounds)]  # overlapping
    starts[1], starts[3] = -1, bounds[3] - 1
    strides = [4 * int(rng.integers(1, 3))]
    for d in range(3):
        strides.append(strides[-1] * bounds[d] + 4 * int(rng.integers(0, 3)))
    dims = list(zip(extents, starts, bounds, strides))
    desc = descriptor(4 * int(rng.integers(0, 1000)), dims, sram_row=int(rng.integers(0, 40)),
                      elem_log2=2)
    assert store_case(CONFIG, desc, seed=seed, width=width)[0] == ErrorCode.NONE


@pytest.mark.parametrize("width", [32, 64, 128])
def test_store_contiguous_segments(width):
    # 16 columns to unaligned, 4 KiB-crossing rows that share beats, clipped on both sides.
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1)
    dims = [(16, -3, 11, 4), (5, -1, 4, 44), (2, 0, 2, 180)]
    assert store_case(config, descriptor(4096 - 148, dims, sram_row=2, elem_log2=2),
                      seed=width, width=width)[0] == ErrorCode.NONE


def test_store_all_padding():
    desc = descriptor(64, [(4, 3, 3, 4), (2, -2, 5, 12)], elem_log2=2)
    _, _, axi_mem = store_case(CONFIG, desc, seed=6)
    assert axi_mem.aw == 0


def test_store_extent_ones_and_4k():
    desc = descriptor(4096 - 8, [(4, 0, 4, 4), (1, 0, 1, 0)], sram_row=63, elem_log2=2)
    assert store_case(CONFIG, desc, seed=3)[0] == ErrorCode.NONE
    desc = descriptor(12, [(1, 0, 1, 4), (1, 0, 1, 4), (1, 0, 1, 4), (1, 0, 1, 4)], elem_log2=2)
    assert store_case(CONFIG, desc, seed=4)[0] == ErrorCode.NONE


LOAD_ERRORS = {
    "zero_extent": (descriptor(0, [(4, 0, 4, 1), (0, 0, 1, 4)]), ErrorCode.BAD_EXTENT),
    "extent0_gt_lanes": (descriptor(0, [(5, 0, 5, 1)]), ErrorCode.BAD_EXTENT),
    "sram_range": (descriptor(0, [(4, 0, 4, 1), (4, 0, 4, 4), (4, 0, 4, 16), (4, 0, 4, 64)],
                              sram_row=193), ErrorCode.SRAM_RANGE),
    "sram_range_saturating": (descriptor(0, [(1, 0, 1, 1), (65535, 0, 1, 0), (65535, 0, 1, 0),
                                             (2, 0, 1, 0)]), ErrorCode.SRAM_RANGE),
    "bad_element": (descriptor(0, [(4, 0, 4, 4)], elem_log2=2), ErrorCode.BAD_ELEMENT),
    "lane_past_row": (descriptor(0, [(2, 0, 2, 1)], lane=3), ErrorCode.BAD_EXTENT),
    # Row 1 at 2**32 + 0x1000 wraps to 0x1000, which is not readable.
    "wrap": (descriptor(0x2000, [(4, 0, 4, 1), (2, 0, 2, 0xFFFFF000)]), ErrorCode.LOAD_WINDOW),
    "window": (descriptor(0x800, [(4, 0, 4, 1), (8, 0, 8, 0x100)]), ErrorCode.LOAD_WINDOW),
    "window_unaligned": (descriptor(0x3804, [(4, 0, 4, 1)]), ErrorCode.LOAD_WINDOW),
    "bus_error": (descriptor(0x400, [(4, 0, 4, 1), (16, 0, 16, 0x40)]), ErrorCode.BUS_ERROR),
}
STORE_ERRORS = {
    "zero_extent": (descriptor(0, [(4, 0, 4, 4), (1, 0, 1, 16), (0, 0, 1, 64)], elem_log2=2),
                    ErrorCode.BAD_EXTENT),
    "extent0_gt_cols": (descriptor(0, [(5, 0, 5, 4)], elem_log2=2), ErrorCode.BAD_EXTENT),
    "lane_past_cols": (descriptor(0, [(1, 0, 1, 4)], elem_log2=2, lane=4), ErrorCode.BAD_EXTENT),
    "sram_range": (descriptor(0, [(4, 0, 4, 4), (5, 0, 5, 16)], sram_row=60, elem_log2=2),
                   ErrorCode.SRAM_RANGE),
    "misaligned_base": (descriptor(2, [(4, 0, 4, 4)], elem_log2=2), ErrorCode.MISALIGNED),
    "misaligned_stride": (descriptor(0, [(4, 0, 4, 4), (1, 0, 1, 0), (2, 0, 2, 18)],
                                     elem_log2=2), ErrorCode.MISALIGNED),
    "bad_element": (descriptor(0, [(4, 0, 4, 1)], elem_log2=0), ErrorCode.BAD_ELEMENT),
    # Row 0 in the window at 0x3804; row 1 wraps to 0x2000, which is read-only.
    "wrap": (descriptor(0x3808, [(4, 0, 4, 4), (2, 0, 2, 0xFFFFE7F8)], elem_log2=2),
             ErrorCode.STORE_WINDOW),
    "window": (descriptor(0xC00, [(4, 0, 4, 4), (8, 0, 8, 0x100)], elem_log2=2),
               ErrorCode.STORE_WINDOW),
    "read_only_window": (descriptor(0x2000, [(4, 0, 4, 4)], elem_log2=2), ErrorCode.STORE_WINDOW),
    "bus_error": (descriptor(0x400, [(4, 0, 4, 4), (16, 0, 16, 0x40)], elem_log2=2),
                  ErrorCode.BUS_ERROR),
}
# Readable [0, 0xB00), writable [0, 0x1000), read-only [0x2000, 0x3000), a window that is not
# beat aligned at 0x3804; the model flags any beat outside [0, 0x1000) and [0x2000, 0x3000) and
# fails bursts touching 0x700.
ERROR_WINDOWS = windows((0, 0xB00, "rw"), (0xB00, 0x500, "w"), (0x2000, 0x1000, "r"),
                        (0x3804, 0x100, "rw"))
ERROR_ALLOWED = [(0, 0x1000), (0x2000, 0x1000), (0x3808, 0xF8)]


@pytest.mark.parametrize("config", [CONFIG, SHARED], ids=["own_front", "shared_front"])
@pytest.mark.parametrize("kind,case", [("load", c) for c in LOAD_ERRORS] +
                                      [("store", c) for c in STORE_ERRORS])
def test_errors(kind, case, config):
    desc, code = (LOAD_ERRORS if kind == "load" else STORE_ERRORS)[case]
    rng = np.random.default_rng(7)
    axi_mem = AxiMemory(MEM_SIZE, 64, allowed=ERROR_ALLOWED, error_ranges=[(0x700, 8)], seed=7)
    axi_mem.mem[:] = rng.integers(0, 256, MEM_SIZE, dtype=np.uint8).tobytes()
    before = bytes(axi_mem.mem)
    depth, width = ((CONFIG.scratchpad_rows, CONFIG.lanes) if kind == "load"
                    else (CONFIG.accumulator_rows, CONFIG.cols))
    init = rng.integers(-100, 100, (depth, width))
    # A good instruction first (the engine is reusable), the failing one, then one more that
    # must not be accepted.
    good = (descriptor(0x10, [(4, 0, 4, 1)], sram_row=9) if kind == "load"
            else descriptor(0x10, [(4, 0, 4, 4)], sram_row=9, elem_log2=2))
    outcomes, rows = run(kind, config, [good, desc, good], axi_mem, ERROR_WINDOWS, init)
    assert [o[0] for o in outcomes] == [ErrorCode.NONE, code]
    assert axi_mem.in_flight() == 0
    if kind == "store":  # only the good tile and parts of the failing one inside windows written
        changed = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(axi_mem.mem,
                                                                                   np.uint8))
        assert all(0x10 <= a < 0x20 or 0x400 <= a < 0x1000 or 0x3808 <= a < 0x3818
                   for a in changed), changed
    if code in (ErrorCode.BAD_EXTENT, ErrorCode.SRAM_RANGE, ErrorCode.MISALIGNED,
                ErrorCode.BAD_ELEMENT):  # checked before touching memory
        assert (axi_mem.ar, axi_mem.aw) == ((1, 0) if kind == "load" else (0, 1))


WALKS = {
    # (descriptor, elem_log2, beat_bytes). In-bounds addresses past 2**32 (c1 = 2) wrap.
    "wrap": (descriptor(0xFFFF_FF00, [(5, -2, 2, 3), (2, 1, 3, 0x80), (3, -1, 2, 7),
                                          (2, 0, 1, 0x100)], sram_row=3), 0, 8),
    "large_starts": (descriptor(0x10_0000, [(3, 32765, 32767, 0x1_0001), (2, -32768, 40000, 5),
                                            (1, -12345, 3, 0xFFFF_FFFF), (2, -1, 2000, 0)]), 0, 8),
    # Contiguous rows: steps of several lanes, split at the padding edges and at beats.
    "contiguous": (descriptor(0xFFFF_FFF3, [(5, -2, 4, 1), (3, -1, 2, 0x7), (2, 0, 2, 0x1E)],
                              sram_row=2), 0, 4),
    "contiguous_int32": (descriptor(0x104, [(5, -1, 5, 4), (2, 0, 1, 0x14), (2, 1, 3, 0x24)],
                                    elem_log2=2), 2, 16),
    "padding_only": (descriptor(0x40, [(5, -2, 0, 1), (2, 0, 2, 5)]), 0, 8),
    # Rows starting far in the padding (runs cut short inside the walker) or 4 lanes before.
    "padding_far": (descriptor(0x40, [(5, -8, 2, 1), (3, -1, 3, 0x10), (2, 0, 9, 0x100)]),
                    0, 8),
    "padding_near": (descriptor(0x40, [(5, -4, 3, 1), (3, -1, 2, 0x10)]), 0, 4),
    "contiguous_first_lane": (descriptor(0x43, [(3, -1, 9, 1), (2, 0, 2, 5)], lane=2), 0, 4),
    # Rows in bounds from their first lane, each starting elsewhere in its beat: the first
    # step of a row ends at the beat of the row's own start.
    "contiguous_rows_in_bounds": (descriptor(0x101, [(5, 0, 5, 1), (3, 0, 3, 0xB),
                                                     (2, 0, 2, 0x25)]), 0, 4),
    "contiguous_int32_rows_in_bounds": (descriptor(0x104, [(4, 0, 4, 4), (3, 0, 3, 0x1C)],
                                                   elem_log2=2), 2, 16),
}


def walk_steps(desc, elem_log2, beat_bytes, address_width=32):
    """The steps of a walk: elements by the TensorDescriptor formula (addresses modulo
    ``2**address_width``), merged into runs of lanes (when contiguous) that end at the row end,
    the padding edges and (in bounds) beats."""
    dims = desc["dims"]
    extents = [d["extent"] for d in dims]
    contiguous = dims[0]["stride"] == 1 << elem_log2
    steps = []
    for i3, i2, i1, i0 in itertools.product(*[range(e) for e in reversed(extents)]):
        idx = (i0, i1, i2, i3)
        coords = [d["start"] + i for d, i in zip(dims, idx)]
        in_bounds = all(0 <= c < d["bound"] for c, d in zip(coords, dims))
        addr = desc["base"] + sum(c * d["stride"] for c, d in zip(coords, dims))
        element = {
            "in_bounds": int(in_bounds), "addr": addr % 2**address_width,
            "lane": desc["lane"] + i0,
            "count": 1,
            "row": desc["sram_row"] + i1 + extents[1] * (i2 + extents[2] * i3),
            "last_in_row": int(i0 == extents[0] - 1),
            "last": int(idx == tuple(e - 1 for e in extents))}
        prev = steps[-1] if steps else None
        if (contiguous and i0 and prev["in_bounds"] == in_bounds and
                (not in_bounds or prev["addr"] // beat_bytes == element["addr"] // beat_bytes)):
            prev.update(count=prev["count"] + 1, last_in_row=element["last_in_row"],
                        last=element["last"])
        else:
            steps.append(element)
    return steps


def walked(walker, desc, ready_seed=0, cycles=400):
    """The steps ``walker`` (a TileWalker or Im2colWalker) gives for ``desc``, every field,
    with random backpressure; it must be idle again after ``cycles``."""
    seen = []
    if "address" not in desc and "rows" not in desc:  # a tile: as the core walks it
        desc = encode_tile(desc, wrap=True)

    async def testbench(ctx):
        if "held" in walker.signature.members:  # as an engine's register holds it
            ctx.set(walker.held, desc)
        await stream_put(ctx, walker.descriptor, desc)
        fields = [name for name, _ in walker.elements.payload.shape()]
        taken = await stream_take(ctx, walker.elements, cycles,
                                  np.random.default_rng(ready_seed))
        seen.extend({k: int(getattr(element, k)) for k in fields} for element in taken)
        assert ctx.get(walker.descriptor.ready)

    sim = Simulator(walker)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("walk", WALKS)
def test_walker_elements(walk, held):
    # Every field of every step against walk_steps, with backpressure; the descriptor kept by
    # the walker or held outside.
    desc, elem_log2, beat_bytes = WALKS[walk]
    walker = TileWalker(lanes=5, rows=64, elem_log2=elem_log2, beat_bytes=beat_bytes, held=held)
    expected = walk_steps(desc, elem_log2, beat_bytes)
    if walk == "wrap":  # some in-bounds elements lie past 2**32
        with pytest.raises(ValueError, match="32-bit address space"):
            encode_tile(desc)
    assert any(e["count"] > 1 for e in expected) == walk.startswith(("contiguous", "padding"))
    assert walked(walker, desc) == expected


@pytest.mark.parametrize("address_width", [32, 20])
@pytest.mark.parametrize("seed", range(4))
def test_walker_random_addresses(seed, address_width):
    # Tiles with padding on both sides, one stride up to 2**32 and the base placed so that the
    # in-bounds addresses straddle the top of the address space (2**32, or 2**20 on a walker of
    # 20-bit addresses, with random bits above them in the base): the address modulo its size of
    # every step (padding ones too) against walk_steps (exact integers).
    space = 1 << address_width
    rng = np.random.default_rng(100 + seed)
    elem_log2 = [0, 2, 0, 2][seed]
    big = seed  # the dim with a stride of 2**28..2**31
    dims = []
    for d in range(4):
        extent = int(rng.integers(2, [6, 3, 3, 2][d] + 1))
        start = int(rng.integers(-1, 2))
        bound = start + extent - int(rng.integers(0, 2))  # padding: start < 0, this cut
        stride = int(rng.integers(1 << 28, 1 << 31) if d == big else rng.integers(0, 1 << 16))
        dims.append((extent, start, bound, stride >> elem_log2 << elem_log2))
    if seed >= 2:
        dims[0] = (dims[0][0], dims[0][1], dims[0][2], 1 << elem_log2)  # contiguous rows
    in_bounds = itertools.product(*[range(max(st, 0), min(st + e, b)) for e, st, b, _ in dims])
    offsets = {sum(c * s for c, (_, _, _, s) in zip(coords, dims)) for coords in in_bounds}
    offsets = sorted({o % space for o in offsets} - {0})
    base = (space - offsets[len(offsets) // 2]) >> elem_log2 << elem_log2
    base += space * int(rng.integers(0, (1 << 32) // space))
    desc = descriptor(base, dims)
    expected = walk_steps(desc, elem_log2, 8, address_width)
    addresses = [step["addr"] for step in expected if step["in_bounds"]]
    assert min(addresses) < space // 2 <= max(addresses)  # in-bounds elements at both ends
    with pytest.raises(ValueError, match=f"{address_width}-bit address space"):
        encode_tile(desc, address_width=address_width)
    walker = TileWalker(lanes=6, rows=64, elem_log2=elem_log2, beat_bytes=8,
                        address_width=address_width)
    assert walked(walker, desc, ready_seed=seed, cycles=300) == expected


def fewer_dims_descriptor(rng, dims, elem_log2, lanes, empty=False):
    """A random descriptor for walkers of ``dims`` dims: awkward extents, padding on both sides
    of every walked dim (a start below 0, a bound short of the end); past them extent 1, start
    0, a stride that is neither walked nor checked (unaligned), and bound 0 if ``empty`` (the
    whole tile is padding)."""
    size = 1 << elem_log2
    extents = [int(rng.integers(3, lanes + 1))] + [int(rng.integers(3, 5)) for _ in range(1, dims)]
    starts = [-int(rng.integers(1, e - 1)) for e in extents]
    bounds = [st + e - 1 for st, e in zip(starts, extents)]
    strides = [size * int(rng.choice([1, 1, 2, 3]))]
    for bound in bounds[:-1]:
        strides.append(strides[-1] * bound + size * int(rng.integers(0, 3)))
    past = [(1, 0, 0 if empty else int(rng.integers(1, 4)), 2 * int(rng.integers(0, 32)) + 1)
            for _ in range(dims, 4)]
    lane = int(rng.integers(0, lanes - extents[0] + 1))
    return descriptor(size * int(rng.integers(0, 500)), [*zip(extents, starts, bounds, strides),
                                                         *past],
                      sram_row=int(rng.integers(0, 8)), elem_log2=elem_log2, lane=lane)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_walker_of_fewer_dims(dims, seed):
    # Every field of every step against walk_steps (the dims past the walker: coordinate 0,
    # in bounds unless their bound is 0), padding everywhere, int8 and int32, backpressure.
    rng = np.random.default_rng(200 + 10 * dims + seed)
    elem_log2 = [0, 2, 0][seed]
    for empty in (False, True):
        desc = fewer_dims_descriptor(rng, dims, elem_log2, lanes=7, empty=empty)
        expected = walk_steps(desc, elem_log2, 8)
        assert any(e["in_bounds"] for e in expected) != empty
        walker = TileWalker(lanes=7, rows=64, elem_log2=elem_log2, beat_bytes=8, dims=dims)
        assert walked(walker, desc, ready_seed=seed) == expected


def fewer_dims_config(dims):
    return CoreConfig(rows=6, cols=7, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                      descriptor_dims=dims)


@pytest.mark.parametrize("dims", [2, 3])
def test_engines_of_fewer_dims(dims):
    # LOAD and STORE bit-exact against numpy (padded_tile, the scatter of store_case); a
    # tile whose dim past the walker has bound 0 loads zeros and stores nothing.
    config = fewer_dims_config(dims)
    rng = np.random.default_rng(dims)
    for seed, empty in enumerate((False, False, True)):
        load_case(config, fewer_dims_descriptor(rng, dims, 0, config.lanes, empty), seed=seed)
        error, _, axi_mem = store_case(
            config, fewer_dims_descriptor(rng, dims, 2, config.cols, empty), seed=seed)
        assert error == ErrorCode.NONE and (axi_mem.aw == 0) == empty


def test_a_2d_tile_check_agrees_with_the_4d_one():
    """`TileCheck` of 2 dims (no shift-add loops) against the 4-dim one on random descriptors,
    pooled or not, their rows around the SRAM's end: the same verdict where e2 and e3 are 1,
    else BAD_EXTENT (after BAD_ELEMENT)."""
    rows, lanes = 16, 4
    checks = [TileCheck(lanes, rows, elem_log2=(0, 2), pool=True, dims=dims) for dims in (2, 4)]
    m = Module()
    m.submodules.two, m.submodules.four = checks
    rng = random.Random(12)
    verdicts = collections.Counter()

    async def testbench(ctx):
        for _ in range(400):
            e = [rng.randrange(1, lanes + 1), rng.choice([0, *range(1, rows + 3)]),
                 rng.choice([1, 1, 1, 2]), rng.choice([1, 1, 1, 3])]
            fields = {"address": rng.choice([0, 0x40, 0x41]), "elem_log2": rng.choice([0, 2, 1]),
                      "sram_row": rng.randrange(rows + 2), "lane": rng.randrange(2),
                      "dims": [{"extent": x, "lo": 0, "hi": x, "stride": 4} for x in e]}
            pool = {"enable": rng.random() < 0.5, "pitch": rng.choice([0, 1, 2, 5])}
            for check in checks:
                ctx.set(check.descriptor.payload, fields)
                ctx.set(check.descriptor.valid, 1)
                ctx.set(check.pool, pool)
                ctx.set(check.result.ready, 1)
            await ctx.tick()
            for check in checks:
                ctx.set(check.descriptor.valid, 0)
            results = [None, None]
            while None in results:
                for i, check in enumerate(checks):
                    if results[i] is None and ctx.get(check.result.valid):
                        results[i] = ctx.get(check.result.payload)
                await ctx.tick()
            two, four = results
            if e[2] == e[3] == 1 or four == ErrorCode.BAD_ELEMENT:
                assert two == four, (fields, pool, results)
            else:
                assert two == ErrorCode.BAD_EXTENT, (fields, pool, results)
            verdicts[two] += 1
            await ctx.tick()

    run_testbench(m, testbench)
    assert {ErrorCode.NONE, ErrorCode.SRAM_RANGE, ErrorCode.BAD_EXTENT, ErrorCode.MISALIGNED,
            ErrorCode.BAD_ELEMENT} <= set(verdicts), verdicts


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("kind", ["load", "store"])
def test_dims_past_the_walker_must_be_extent_1(kind, dims):
    # Else BAD_EXTENT before any access (the engine and the fuzz model agree), whatever the
    # dim's range; its start is folded into the address by encode_tile, and its stride is not
    # checked (an unaligned one passes, as above).
    config = fewer_dims_config(dims)
    elem_log2, lanes = (0, config.lanes) if kind == "load" else (2, config.cols)
    good = descriptor(0x40, [(lanes, 0, lanes, 1 << elem_log2)], elem_log2=elem_log2)
    cases = [(2, 0, ErrorCode.BAD_EXTENT), (3, -1, ErrorCode.BAD_EXTENT),
             (1, 1, ErrorCode.NONE), (1, -1, ErrorCode.NONE)]
    for d, (extent, start, code) in itertools.product(range(dims, 4), cases):
        bad = descriptor(0x40, [(lanes, 0, lanes, 1 << elem_log2)], elem_log2=elem_log2)
        bad["dims"][d].update(extent=extent, start=start, bound=4, stride=0x100)
        axi_mem = AxiMemory(MEM_SIZE, 32, allowed=[(0, MEM_SIZE)], seed=d)
        depth, width = ((config.scratchpad_rows, config.lanes) if kind == "load"
                        else (config.accumulator_rows, config.cols))
        if code == ErrorCode.BAD_EXTENT:
            outcomes, _ = run(kind, config, [good, bad, good], axi_mem, RW_ALL,
                              np.zeros((depth, width), int))
            assert [o[0] for o in outcomes] == [ErrorCode.NONE, code], (d, extent)
            assert (axi_mem.ar, axi_mem.aw) == ((1, 0) if kind == "load" else (0, 1))
        else:  # start 1 is in bounds (one access), start -1 is padding (none)
            outcomes, _ = run(kind, config, [bad], axi_mem, RW_ALL, np.zeros((depth, width), int))
            assert [o[0] for o in outcomes] == [ErrorCode.NONE], (d, start)
            accesses = int(start == 1)
            assert (axi_mem.ar, axi_mem.aw) == ((accesses, 0) if kind == "load"
                                                else (0, accesses))
        program = Program()
        if kind == "load":
            program.load(bad)
        else:
            program.store(bad)
        image = bytearray(MEMORY_SIZE)
        image[:program.size] = program.to_bytes()
        model = predict(config, image, [(0, MEMORY_SIZE, True, True)], 0, len(program), 500)
        assert model.outcomes == ({DONE} if code == ErrorCode.NONE else {(code.name, 0)})
        if code == ErrorCode.BAD_EXTENT:
            assert predict(replace(config, descriptor_dims=4), image,
                           [(0, MEMORY_SIZE, True, True)], 0, len(program), 500
                           ).outcomes != model.outcomes


def test_walker_abort():
    walker = TileWalker(lanes=4, rows=16, elem_log2=0, beat_bytes=8)

    async def testbench(ctx):
        await stream_put(ctx, walker.descriptor,
                         encode_tile(descriptor(0, [(4, 0, 4, 1), (4, 0, 4, 4)])))
        await ctx.tick().until(walker.elements.valid)
        ctx.set(walker.abort, 1)
        await ctx.tick()
        ctx.set(walker.abort, 0)
        assert ctx.get(walker.descriptor.ready) and not ctx.get(walker.elements.valid)

    sim = Simulator(walker)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("make,name", [
    (lambda: TileWalker(lanes=0, rows=4, elem_log2=0, beat_bytes=8), "lanes"),
    (lambda: TileWalker(lanes=4, rows=65537, elem_log2=0, beat_bytes=8), "rows"),
    (lambda: TileCheck(4, 16, elem_log2=4), "elem_log2"),
    (lambda: TileWalker(lanes=4, rows=16, elem_log2=0, beat_bytes=8, dims=1), "dims"),
    (lambda: TileCheck(4, 16, elem_log2=0, dims=5), "dims"),
    (lambda: TileCheck(4, 16, elem_log2=0, held=1), "held"),
    (lambda: TileWalker(lanes=4, rows=16, elem_log2=0, beat_bytes=8, held="yes"), "held"),
    (lambda: BurstPlanner(4, 16, 12, 8, 8, "read"), "beat_bytes"),
    (lambda: BurstPlanner(4, 16, 8, 8, 257, "read"), "max_beats"),
    (lambda: BurstPlanner(4, 16, 8, 8, 8, "execute"), "permission"),
    (lambda: BurstPlanner(4, 16, 8, 8, 8, "either"), "max_steps"),
    (lambda: BurstPlanner(4, 16, 8, (8, 4), (8, 257), "either"), "max_beats"),
    (lambda: DmaFront([], 8, 2, 3), "clients"),
    (lambda: DmaFront([store_front_client(SHARED), load_front_client(SHARED)], 8, 2, 3),
     "clients"),
    (lambda: ElementStage(4, 16, 12, "read"), "beat_bytes"),
    (lambda: ElementStage(4, 16, 8, "execute"), "permission"),
    (lambda: ElementStage(4, 16, 8, "read", windows=0), "windows"),
    (lambda: ElementStage(4, 16, 8, "read", windows=NUM_WINDOWS + 1), "windows"),
    (lambda: LoadEngine({"rows": 4}), "config"),
    (lambda: StoreEngine(None), "config"),
])
def test_bad_parameters(make, name, refuses):
    refuses(make, name)


def test_throughput(capsys):
    """Elements per cycle with an always-ready, zero-latency memory (reported, and bounded):
    contiguous rows move a beat per cycle, strided ones an element."""
    fast = {"ready": 1.0, "valid": 1.0, "latency": 0}
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1,
                        axi_data_width=64)
    report = {}
    for name, dims in [("contiguous", [(16, 0, 16, 1), (16, 0, 16, 16)]),
                       ("strided", [(16, 0, 16, 3), (16, 0, 16, 48)])]:
        cycles, axi_mem = load_case(config, descriptor(0, dims), seed=1, **fast)
        report[f"load {name}"] = 256 / cycles
    # An 8 x 64 activation tile on an 8x8 core: one row (beat) per cycle after the setup.
    small = CoreConfig(rows=8, cols=8, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
    cycles, _ = load_case(small, descriptor(0, [(8, 0, 8, 1), (64, 0, 64, 8)]), seed=1, **fast)
    report["load 8x64 tile"] = 512 / cycles
    for name, dims in [("contiguous", [(16, 0, 16, 4), (4, 0, 4, 64)]),
                       ("strided", [(16, 0, 16, 12), (4, 0, 4, 192)])]:
        _, cycles, axi_mem = store_case(config, descriptor(0, dims, elem_log2=2), seed=1, **fast)
        report[f"store {name}"] = 64 / cycles
    with capsys.disabled():
        print("\nelements/cycle:", {k: round(v, 2) for k, v in report.items()})
    assert report["load contiguous"] > 4 and report["store contiguous"] > 1.1
    assert report["load 8x64 tile"] > 512 / (64 + 32)
    assert report["load strided"] > 0.8 and report["store strided"] > 0.7


def test_store_short_bursts_back_to_back():
    """Rows of 4 beats 256 bytes apart (a 16x16 core's int32 output tile on a 128-bit bus): 16
    bursts at a W beat every cycle after the set-up, when the slave takes every beat."""
    config = CoreConfig(rows=16, cols=16, scratchpad_kib=1, accumulator_kib=1,
                        axi_data_width=128)
    desc = descriptor(0, [(16, 0, 16, 4), (16, 0, 16, 256)], elem_log2=2)
    _, cycles, axi_mem = store_case(config, desc, seed=2, ready=1.0, valid=1.0, latency=0)
    assert (axi_mem.aw, axi_mem.writes) == (16, 64)
    assert cycles <= 64 + 24, cycles  # 82: 15 cycles to the first beat, 3 after the last


@pytest.mark.parametrize("queue_depth", [1, 2])
def test_store_keeps_write_bursts_in_flight_up_to_its_limit(queue_depth):
    """With slow write responses the store engine keeps `write_bursts` bursts waiting for B
    (2 on a core of one-instruction queues, else MAX_OUTSTANDING), never more."""
    config = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                        queue_depth=queue_depth)
    desc = descriptor(0, [(4, 0, 4, 4), (16, 0, 16, 256)], elem_log2=2)  # a burst a row
    _, _, axi_mem = store_case(config, desc, seed=3, ready=1.0, valid=1.0, latency=80)
    assert (axi_mem.aw, axi_mem.peak_writes) == (16, {1: 2, 2: MAX_OUTSTANDING}[queue_depth])


class _WindowCheck(Elaboratable):
    def __init__(self, size, aligned, count):
        self.size, self.aligned = size, aligned
        self.windows = Signal(data.ArrayLayout(Window, count))
        self.addr = Signal(32)
        self.ok = Signal()

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.ok.eq(window_ok(m, self.windows, self.addr, self.size, "read",
                                         aligned=self.aligned))
        return m


@pytest.mark.parametrize("count", [1, 2, NUM_WINDOWS])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("size", [4, 64])
def test_window_ok_is_the_sum_check(size, aligned, count):
    """`window_ok` on ``count`` windows (`CoreConfig.windows`) derived from base, size and
    flags (`window`) against ``base <= addr`` and ``addr + size <= base + size_w`` without
    wrap: unaligned windows, windows reaching past 2**32, addresses (multiples of ``size``) at
    and around each window's edges; with ``aligned`` the form without an adder."""
    rng = np.random.default_rng(size)
    dut = _WindowCheck(size, aligned, count)
    checked = [0, 0]

    async def testbench(ctx):
        for _ in range(40):
            wins = [{"base": int(rng.choice([rng.integers(1 << 32), (1 << 32) - 4096,
                                             rng.integers(4096)])),
                     "size": int(rng.choice([0, rng.integers(1, 3 * size),
                                             rng.integers(1 << 32)])),
                     "read": int(rng.integers(4) != 0), "write": 0}
                    for _ in range(count)]
            ctx.set(dut.windows, [window(**w) for w in wins])
            edges = [w[k] + d for w in wins for k in ("base", "size") for d in (-size, 0, size)]
            edges += [w["base"] + w["size"] + d for w in wins for d in (-2 * size, -size, 0)]
            for addr in [e % (1 << 32) // size * size for e in edges]:
                ctx.set(dut.addr, addr)
                expected = any(w["size"] and w["read"] and w["base"] <= addr
                               and addr + size <= w["base"] + w["size"] for w in wins)
                assert ctx.get(dut.ok) == expected, (wins, addr)
                checked[expected] += 1

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    assert min(checked) > 50, checked  # both answers were seen


@pytest.mark.parametrize("permission,write", [("read", None), ("write", None), ("either", 0),
                                              ("either", 1)])
def test_element_stage_checks_the_beat(permission, write):
    """The `ElementStage` passes each element on unchanged, in order, with ``in_window`` set
    exactly when the element's whole bus beat lies in a window with ``permission`` (with
    "either", the one its ``write`` input chooses), and
    ``same_beat`` / ``next_beat`` when its beat is that of the element before or the next one in
    its 4 KiB page (the statements the burst planner's proof assumes,
    `sim.formal.BurstPlannerHarness`): addresses anywhere in a beat at and around the windows'
    edges and a 4 KiB boundary, with backpressure on both sides."""
    beat_bytes, flags = 8, {"read": "r", "write": "w"}
    rng = np.random.default_rng(7)
    checked = ("read", "write")[write] if permission == "either" else permission
    specs = [(0x1004, 0x40, "rw"), (0x2000, 0x10, flags[checked]),
             (0x3000, 0x100, "rw".replace(flags[checked], ""))]
    dut = ElementStage(lanes=4, rows=16, beat_bytes=beat_bytes, permission=permission, windows=3)
    addrs = [edge + delta for base, size, _ in specs for edge in (base, base + size)
             for delta in range(-12, 13, 3)]  # 0x2000 and 0x3000 start 4 KiB pages
    elements = [{"in_bounds": int(rng.integers(2)), "addr": addr, "lane": int(rng.integers(4)),
                 "count": int(rng.integers(1, 5)), "row": int(rng.integers(16)),
                 "last_in_row": int(rng.integers(2)), "last": 0} for addr in addrs]
    seen = []

    async def put(ctx):
        ctx.set(dut.windows, windows(*specs)[:3])
        if write is not None:
            ctx.set(dut.write, write)
        for element in elements:
            await stream_put(ctx, dut.input, element)
            await ctx.tick().repeat(int(rng.integers(1, 3)))

    async def get(ctx):
        for _ in elements:
            seen.append(await stream_get(ctx, dut.output))
            await ctx.tick().repeat(int(rng.integers(1, 4)))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(put)
    sim.add_testbench(get)
    sim.run()
    expected_in, previous, follows = 0, 0, collections.Counter()
    for element, out in zip(elements, seen, strict=True):
        beat = element["addr"] // beat_bytes * beat_bytes
        in_window = any(flags[checked] in p and base <= beat and beat + beat_bytes <= base + size
                        for base, size, p in specs)
        assert {name: out[name] for name in element} == element
        assert out.in_window == in_window, hex(element["addr"])
        expected_in += in_window
        same, following = beat == previous, beat == previous + beat_bytes and beat % 4096 != 0
        assert (out.same_beat, out.next_beat) == (same, following), hex(element["addr"])
        follows[same, following, beat == previous + beat_bytes] += 1
        previous = beat
    assert 0 < expected_in < len(elements)  # both answers were seen
    # the same beat, the next one, the next one across 4 KiB, and another
    assert set(follows) == {(True, False, False), (False, True, True), (False, False, True),
                            (False, False, False)}, follows


async def _walk_through(ctx, port, desc, cycles=150):
    """Walk the tile ``desc`` on a front's ``port`` (`dma_front.front_signature`), granted
    already: (steps, bursts, the error at the end), steps and bursts as tuples of ints."""
    ctx.set(port.held, encode_tile(desc, wrap=True))
    ctx.set(port.walk, 1)
    await ctx.tick()
    ctx.set(port.walk, 0)
    ctx.set(port.running, 1)
    ctx.set(port.steps.ready, 1)
    ctx.set(port.bursts.ready, 1)
    steps, bursts = [], []
    for _ in range(cycles):
        _, _, step_valid, step, burst_valid, burst = await ctx.tick().sample(
            port.steps.valid, port.steps.payload, port.bursts.valid, port.bursts.payload)
        if step_valid:
            steps.append(tuple(int(step[name]) for name in step.shape().members))
        if burst_valid:
            bursts.append((int(burst.addr), int(burst.len)))
    ctx.set(port.running, 0)
    return steps, bursts, ErrorCode(ctx.get(port.error))


def test_the_shared_front_serves_one_engine_at_a_time():
    """A `SharedDmaFront` (`CoreConfig.shared_dma`) is granted to one port at a time and only on
    request: the store port, asking while the load port walks, is granted once the load port
    lets go, and not before. The load port's walk fails (LOAD_WINDOW, seen by it alone); after
    it the store port's walk gives exactly the steps and bursts of a front of its own (the
    front was reset between them), with no error."""
    config = SHARED
    load, store = load_front_client(config), store_front_client(config)
    bad_load = descriptor(0x0FF8, [(4, 0, 4, 1), (3, 0, 3, 4)])  # its 3rd row is past 0x1000
    good_store = descriptor(0x104, [(4, -1, 3, 4), (3, 0, 2, 0x40)], sram_row=2, elem_log2=2)
    wins = windows((0, 0x1000, "rw"))[:config.windows]

    def simulate(dut, testbench):
        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(testbench)
        sim.run()

    alone = DmaFront([store], config.axi_data_width // 8, config.windows, config.descriptor_dims)
    reference = []

    async def own_front(ctx):
        ctx.set(alone.windows, wins)
        reference.append(await _walk_through(ctx, alone, good_store))

    simulate(alone, own_front)
    assert reference[0][0] and reference[0][1] and reference[0][2] == ErrorCode.NONE

    dut = SharedDmaFront(load, store, config.axi_data_width // 8, config.windows,
                         config.descriptor_dims)
    log = []

    async def testbench(ctx):
        ctx.set(dut.windows, wins)
        ctx.set(dut.load.request, 1)
        await ctx.tick().until(dut.load.granted)
        ctx.set(dut.store.request, 1)  # waits while the load port walks
        await ctx.tick()
        assert not ctx.get(dut.store.granted)
        log.append(await _walk_through(ctx, dut.load, bad_load))
        assert ctx.get(dut.store.error) == ErrorCode.NONE and not ctx.get(dut.store.granted)
        ctx.set(dut.load.abort, 1)
        ctx.set(dut.load.request, 0)
        await ctx.tick().until(dut.store.granted)
        assert not ctx.get(dut.load.granted)
        log.append(await _walk_through(ctx, dut.store, good_store))
        assert ctx.get(dut.store.granted) and not ctx.get(dut.load.granted)

    simulate(dut, testbench)
    (load_steps, _, load_error), shared = log
    assert load_error == ErrorCode.LOAD_WINDOW and len(load_steps) < 12
    assert shared == reference[0]
