"""Feature profiles: a core generated without the softmax unit or the im2col walker computes
what it has bit-exactly, and the runtime and the hardware refuse what it lacks."""
import dataclasses
from itertools import product

import numpy as np
import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.sim import SimDevice
from tpugen.firmware.attention import compile_softmax
from tpugen.firmware.device import DeviceError, fit_windows
from tpugen.firmware.conv2d import compile_conv2d, conv2d_weights
from tpugen.firmware.epilogue import Epilogue
from tpugen.firmware.matmul import compile_matmul
from tpugen.firmware.program import Deps, Dim, Program, split_tile, tensor
from tpugen.arch import opcode_of
from tpugen.isa import DIMS, Opcode, StoreInstruction, decode, encode_tile, with_bits
from tpugen.firmware.board import config_from_registers
from tpugen.isa import NUM_WINDOWS
from tpugen.registers import (BASIC_COUNTERS, COUNTERS, TRAFFIC_COUNTERS, constant_registers,
                              counter_names, register)
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32

MICRO = PRESETS["micro"]
FULL = dataclasses.replace(MICRO, softmax=True, im2col=True, epilogue_multiplier=True,
                           epilogue_pool=True, counters="full", windows=NUM_WINDOWS)
"""The same geometry with every feature: compiles the programs the micro core must refuse."""


@pytest.mark.parametrize("field, value", [("softmax", 1), ("im2col", "yes"),
                                          ("counter_width", 48), ("counter_width", True),
                                          ("epilogue_multiplier", 0), ("counters", "none"),
                                          ("counters", True), ("windows", 0), ("windows", 5),
                                          ("windows", True), ("windows", 2.0),
                                          ("queue_depth", 0), ("queue_depth", 8),
                                          ("queue_depth", True), ("queue_depth", 2.0),
                                          ("store_prefetch", 0), ("store_prefetch", None),
                                          ("load_prefetch", 1), ("load_prefetch", "no"),
                                          ("execute_prefetch", 0),
                                          ("shared_dma", 1), ("shared_dma", None),
                                          ("weight_prefetch", 1), ("descriptor_dims", 5),
                                          ("registered_accumulate", 0),
                                          ("buffered_feeders", None),
                                          ("broadcast_activations", 1),
                                          ("adder_tree_columns", "yes"), ("weight_chain", 0),
                                          ("epilogue_pool", 1),
                                          ("counters_in_ram", 1)])
def test_bad_profile_fields_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"CoreConfig.{field}="):
        CoreConfig(**{field: value})


@pytest.mark.parametrize("changes", [{}, {"weight_prefetch": False},
                                     {"weight_prefetch": False, "broadcast_activations": True},
                                     {"weight_prefetch": False, "adder_tree_columns": True},
                                     {"broadcast_activations": True, "adder_tree_columns": True}])
def test_direct_weights_need_every_pe_to_take_a_vector_at_once(changes):
    with pytest.raises(ValueError, match="CoreConfig.weight_chain=False is invalid with "
                                         "weight_prefetch="):
        CoreConfig(weight_chain=False, **changes)
    assert not CoreConfig(weight_chain=False, weight_prefetch=False, broadcast_activations=True,
                          adder_tree_columns=True).weight_chain


@pytest.mark.parametrize("engine", ["store", "load", "execute"])
def test_an_engine_without_prefetch_needs_one_instruction_queues(engine):
    with pytest.raises(ValueError, match=f"CoreConfig.{engine}_prefetch=False is invalid with "
                                         "queue_depth=2"):
        CoreConfig(**{f"{engine}_prefetch": False}, queue_depth=2)
    assert not getattr(CoreConfig(**{f"{engine}_prefetch": False}, queue_depth=1),
                       f"{engine}_prefetch")


def test_micro_core_computes_what_it_has_and_refuses_the_rest():
    rng = np.random.default_rng(4)
    with SimDevice(MICRO, memory="axiram") as dev:
        for m, k, n in [(1, 1, 1), (13, 9, 6), (33, 4, 17)]:
            a = rng.integers(-128, 128, (m, k), dtype=np.int8)
            b = rng.integers(-128, 128, (k, n), dtype=np.int8)
            np.testing.assert_array_equal(dev.matmul(a, b), matmul_int32(a, b))
        assert dev.stats.issued_macs == 33 * 5 * MICRO.macs  # 33 vectors through 1 x 5 weight tiles
        assert dev.stats.bytes_written > 0 and dev.stats.execute_busy_cycles is None
        # Every lane's own bias and shift (PARAMS entries 0..cols-1; the multipliers are powers
        # of two, folded into the shifts), on results that do not saturate.
        lanes_rng = np.random.default_rng(40)
        a = lanes_rng.integers(-128, 128, (13, 9), dtype=np.int8)
        b = lanes_rng.integers(-128, 128, (9, 6), dtype=np.int8)
        options = {"bias": lanes_rng.integers(-20_000, 20_000, 6),
                   "requant": ([1, 2, 4, 1, 2, 8], [11, 12, 13, 10, 12, 14])}
        expected = apply_epilogue(matmul_int32(a, b), 1, **options)
        assert np.abs(expected.astype(int)).max() < 127 and len(np.unique(expected)) > 30
        np.testing.assert_array_equal(dev.matmul(a, b, **options), expected)
        x = rng.integers(-128, 128, (1, 3, 7, 6), dtype=np.int8)
        w = rng.integers(-128, 128, (5, 3, 3, 3), dtype=np.int8)
        np.testing.assert_array_equal(dev.conv2d(x, w, padding=1),
                                      conv2d_int32(x, w, stride=1, padding=1, dilation=1))

        q = rng.standard_normal((4, 8)).astype(np.float32)
        with pytest.raises(ValueError, match=r"softmax unit.*CoreConfig.softmax=False"):
            dev.attention(q, q, q)
        with pytest.raises(ValueError, match=r"softmax unit"):
            dev.softmax(q)
        # The core has no pooling: the host pools what it stores, requantized or int32 (the
        # same values, the epilogue being monotonic), odd rows and columns included.
        for options in ({"bias": np.array([-250, 120, 0, 37, -9]), "requant": (1, 2),
                         "pool": True},
                        {"bias": np.array([-25_000, 1_200, 0, 37, -9]), "relu": True,
                         "pool": True}):
            np.testing.assert_array_equal(
                dev.conv2d(x, w, padding=1, **options),
                apply_epilogue(conv2d_int32(x, w, 1, 1), channel_axis=1, spatial_axes=(2, 3),
                               **options))
            assert dev.stats.host_epilogue

        # Programs for the full twin: the hardware stops them with UNKNOWN_OPCODE.
        softmax = compile_softmax(FULL, 4, 4, x_addr=0, eye_addr=0x1000, y_addr=0x2000, frac=5)
        with pytest.raises(DeviceError, match="UNKNOWN_OPCODE"):
            dev._run(softmax, [(0, np.zeros(16, np.int8)), (0x1000, np.eye(4, dtype=np.int8))],
                     [(0x2000, 64)])
        im2col = compile_conv2d(FULL, x.shape, w.shape, padding=1, x_addr=0, w_addr=0x1000,
                                y_addr=0x2000, lowering="im2col")
        with pytest.raises(DeviceError, match="UNKNOWN_OPCODE"):
            dev._run(im2col, [(0, x), (0x1000, w)], [(0x2000, 4 * 5 * 7 * 6)])
        # (A STORE with pool: micro's own conv2d program with the bit set.)
        pooled = compile_conv2d(MICRO, x.shape, w.shape, padding=1, x_addr=0, w_addr=0x1000,
                                y_addr=0x2000)
        epilogue_field = StoreInstruction["epilogue"]
        pool_bit = epilogue_field.offset + epilogue_field.shape["pool"].offset
        pooled.instructions = [with_bits(raw, pool_bit, 1, 1) if opcode_of(raw) == Opcode.STORE
                               else raw for raw in pooled.instructions]
        with pytest.raises(DeviceError, match="UNKNOWN_OPCODE"):
            dev._run(pooled, [(0, x), (0x1000, conv2d_weights(w, "pixels", MICRO))],
                     [(0x2000, 4 * 5 * 7 * 6)])
        with pytest.raises(ValueError, match=r"pool needs the epilogue's pooling.*"
                                             r"epilogue_pool=False"):
            compile_conv2d(MICRO, x.shape, w.shape, padding=1, x_addr=0, w_addr=0x1000,
                           y_addr=0x2000, epilogue=Epilogue.from_options(5, pool=True))
        np.testing.assert_array_equal(dev.matmul(a, b), matmul_int32(a, b))  # still usable
        check_shift_only_epilogue(dev, rng)
        check_one_window(dev, rng)


def check_one_window(dev, rng):
    """A resident conv2d asks for a window each for the program and input (read), the weights
    and the output; the micro core's one covers them all, readable and writable
    (`fit_windows`). A pooled one is refused: the host cannot pool after a resident call."""
    x, w = rng.integers(-128, 128, (1, 3, 9, 7), dtype=np.int8), rng.integers(
        -128, 128, (5, 3, 3, 3), dtype=np.int8)
    options = {"bias": rng.integers(-3000, 3000, 5), "requant": ([1, 2, 4, 8, 16], 12),
               "relu": True}
    with pytest.raises(ValueError, match=r"pool needs the host.*epilogue_pool=False"):
        dev.prepare_conv2d(x.shape, w, padding=1, pool=True, **options)
    call = dev.prepare_conv2d(x.shape, w, padding=1, **options)
    assert len(call.windows) >= 3
    (base, size, readable, writable), = fit_windows(call.windows, MICRO.windows)
    assert readable and writable and (base, base + size) == (
        min(b for b, *_ in call.windows), max(b + s for b, s, *_ in call.windows))
    dev.launch(call, x)
    np.testing.assert_array_equal(dev.download(call.output, call.dtype, call.shape),
                                  apply_epilogue(conv2d_int32(x, w, 1, 1), channel_axis=1,
                                                 spatial_axes=(2, 3), **options))


def check_shift_only_epilogue(dev, rng):
    """On a core without the epilogue multiplier: power-of-two multipliers run on the core
    (folded into the shift), any others on the host; bit-exact either way, awkward shapes."""
    a = rng.integers(-128, 128, (11, 7), dtype=np.int8)
    b = rng.integers(-128, 128, (7, 6), dtype=np.int8)
    acc = matmul_int32(a, b)
    bias = rng.integers(-3000, 3000, 6)
    seen = set()
    for requant, on_host in [(([1, 2, 4, 8, 16, 64], [9, 9, 10, 11, 12, 14]), False),
                             ((rng.integers(1, 65536, 6), rng.integers(14, 26, 6)), True),
                             ((3, 10), True), ((1 << 12, 11), True)]:
        for relu in (False, True):
            y = dev.matmul(a, b, bias=bias, requant=requant, relu=relu)
            np.testing.assert_array_equal(
                y, apply_epilogue(acc, 1, bias=bias, requant=requant, relu=relu))
            assert y.dtype == np.int8 and dev.stats.host_epilogue == on_host, requant
            seen |= set(y.flat)
    assert len(seen) > 100  # not all saturated
    x = rng.integers(-128, 128, (2, 3, 5, 7), dtype=np.int8)
    w = rng.integers(-128, 128, (5, 3, 2, 3), dtype=np.int8)
    requant = (rng.integers(1, 65536, 5), rng.integers(12, 22, 5))
    y = dev.conv2d(x, w, stride=2, padding=1, bias=bias[:5], requant=requant, relu=True)
    np.testing.assert_array_equal(y, apply_epilogue(
        conv2d_int32(x, w, stride=2, padding=1, dilation=1), 1, bias=bias[:5], requant=requant,
        relu=True))
    assert dev.stats.host_epilogue and len(np.unique(y)) > 10
    # Power-of-two multipliers per channel run on the core: the pixels lowering with per-row
    # parameters (no im2col walker here), 5 filters on 4 lanes.
    requant = ([1, 2, 4, 8, 16], [9, 10, 10, 12, 13])
    y = dev.conv2d(x, w, stride=2, padding=1, bias=bias[:5], requant=requant, relu=True)
    np.testing.assert_array_equal(y, apply_epilogue(
        conv2d_int32(x, w, stride=2, padding=1, dilation=1), 1, bias=bias[:5], requant=requant,
        relu=True))
    assert not dev.stats.host_epilogue and len(np.unique(y)) > 10
    with pytest.raises(ValueError, match="requant multipliers.*epilogue_multiplier=False"):
        dev.prepare_matmul(a.shape, b, requant=(3, 1))
    call = dev.prepare_matmul(a.shape, b, requant=(2, 3))  # folded: resident calls run it
    dev.launch(call, a)
    np.testing.assert_array_equal(dev.download(call.output, call.dtype, call.shape),
                                  apply_epilogue(acc, 1, requant=(2, 3)))


def test_the_registers_describe_the_profile():
    # CONFIG1 and CONFIG2 tell the runtime (BoardDevice) what the core has; an older core reads
    # as full.
    for config in (MICRO, FULL, PRESETS["default"],
                   dataclasses.replace(MICRO, queue_depth=7, store_prefetch=True,
                                       load_prefetch=True, execute_prefetch=True),
                   dataclasses.replace(MICRO, load_prefetch=True),
                   dataclasses.replace(MICRO, execute_prefetch=True),
                   dataclasses.replace(MICRO, shared_dma=False),
                   dataclasses.replace(MICRO, weight_prefetch=True, weight_chain=True),
                   dataclasses.replace(MICRO, weight_chain=True),
                   dataclasses.replace(MICRO, address_width=17),
                   dataclasses.replace(MICRO, registered_accumulate=True),
                   dataclasses.replace(MICRO, buffered_feeders=True),
                   dataclasses.replace(MICRO, broadcast_activations=False, weight_chain=True),
                   dataclasses.replace(MICRO, adder_tree_columns=False, weight_chain=True),
                   dataclasses.replace(MICRO, counters_in_ram=False),
                   dataclasses.replace(MICRO, epilogue_pool=True),
                   dataclasses.replace(MICRO, counters="basic")):
        constants = constant_registers(config)
        assert config_from_registers(constants.__getitem__) == config
    assert constant_registers(MICRO)["CONFIG2"] == register("CONFIG2").value(
        no_store_prefetch=1, no_weight_prefetch=1, no_load_prefetch=1, shared_dma=1,
        unregistered_accumulate=1, unbuffered_feeders=1, broadcast_activations=1,
        adder_tree_columns=1, counters_in_ram=1, no_pool=1, no_weight_chain=1,
        no_execute_prefetch=1, no_busy_counters=1)
    assert constant_registers(dataclasses.replace(MICRO, load_prefetch=True,
                                                  registered_accumulate=True,
                                                  buffered_feeders=True,
                                                  broadcast_activations=False,
                                                  adder_tree_columns=False,
                                                  counters_in_ram=False,
                                                  epilogue_pool=True,
                                                  weight_chain=True,
                                                  execute_prefetch=True,
                                                  counters="basic"))["CONFIG2"] == \
        register("CONFIG2").value(no_store_prefetch=1, no_weight_prefetch=1, shared_dma=1)
    older = constant_registers(PRESETS["default"])  # map 1.1: CONFIG1.queue_depth reads 0
    older["CONFIG1"] &= ~register("CONFIG1").value(queue_depth=7)
    assert config_from_registers(older.__getitem__) == PRESETS["default"]
    # Map 1.2 has no CONFIG2 (reading it would answer SLVERR): its cores prefetch.
    before_config2 = {**constant_registers(MICRO), "CONFIG2": None,
                      "VERSION": register("VERSION").value(major=1, minor=2)}
    assert config_from_registers(before_config2.__getitem__) == dataclasses.replace(
        MICRO, store_prefetch=True, weight_prefetch=True, load_prefetch=True, shared_dma=False,
        registered_accumulate=True, buffered_feeders=True,
        broadcast_activations=False, adder_tree_columns=False, counters_in_ram=False,
        epilogue_pool=True, weight_chain=True, execute_prefetch=True, counters="basic")
    fields = register("CONFIG1").fields_of(constant_registers(MICRO)["CONFIG1"])
    assert (fields.shift_only_epilogue, fields.basic_counters) == (1, 1)
    assert counter_names(MICRO) == TRAFFIC_COUNTERS and counter_names(FULL) == tuple(COUNTERS)
    assert counter_names(dataclasses.replace(MICRO, counters="basic")) == BASIC_COUNTERS


def test_a_narrow_core_is_refused_what_its_addresses_cannot_reach():
    """`CoreConfig.address_width`: programs are encoded for the core's address space (a tile
    past its top is refused, as one past 4 GiB on a 32-bit core), a runtime refuses more memory
    than the core addresses, a board system more than it reaches, and each board's default
    core is as wide as the board's memory (the build's --preset too)."""
    from tpugen.cli import _board_config, parser
    from tpugen.fpga.boards import BOARDS
    from tpugen.firmware.device import Device
    from tpugen.hdl.board import SIMULATED_BOARD, BoardSystem

    narrow = dataclasses.replace(MICRO, address_width=20)
    dims = [Dim(4, 0, 4, 1), Dim(2, 0, 2, 64)]
    assert compile_matmul(narrow, 4, 4, 4, a_addr=0, b_addr=0x100, c_addr=0xF_FFC0)
    with pytest.raises(ValueError, match="outside the 20-bit address space"):
        encode_tile(tensor(0xF_FFC0, 1, 0, dims), 3, address_width=20)
    with pytest.raises(ValueError, match="outside the 20-bit address space"):
        compile_matmul(narrow, 4, 4, 4, a_addr=0, b_addr=0x100, c_addr=0x10_0000)
    with pytest.raises(ValueError, match=r"memory_size=2097152 is invalid: allowed an integer "
                                         r"in 16384\.\.1048576"):
        Device(narrow, 2 << 20)
    assert SimDevice(narrow, memory="rtl").memory_size == 1 << 20
    clocking = {k: v for k, v in SIMULATED_BOARD.items() if k != "memory_bytes"}
    with pytest.raises(ValueError, match=r"CoreConfig.address_width=16 is invalid for "
                                         r"memory_bytes=131072.*allowed 17\.\.32"):
        BoardSystem(dataclasses.replace(MICRO, address_width=16), memory_bytes=1 << 17,
                    **clocking)
    for board in BOARDS.values():
        assert board.default_config().address_width == board.address_width == 17, board.name
        args = parser().parse_args(["build", "--board", board.name, "--preset", "micro"])
        assert _board_config(args, board).address_width == 17


def test_descriptors_are_fitted_to_the_walkers():
    """`encode_tile` folds the starts of the extent-1 dims past `descriptor_dims` into the
    address (an out-of-bounds one makes the tile padding, as it was) and refuses a tile that
    needs those dims; `Program(config)` splits such a tile into one per index of them
    (`split_tile`), so every program the micro core (2 dims) runs fits its walkers, as a
    LOAD or STORE more per index."""
    dims = [Dim(4, -1, 9, 1), Dim(3, 0, 5, 100), Dim(1, 2, 4, 1000), Dim(1, 3, 3, 7)]
    encoded = encode_tile(tensor(0x100, 1, 0, dims), 2)
    assert encoded["address"] == 0x100 - 1 + 2 * 1000 + 3 * 7
    assert [(d["lo"], d["hi"]) for d in encoded["dims"]] == [(1, 4), (0, 3), (0, 1), (0, 0)]
    assert encoded == encode_tile(tensor(0x100, 1, 0, dims), 4)
    with pytest.raises(ValueError, match=r"dim 1 \(extent 3\).*CoreConfig.descriptor_dims=1"):
        encode_tile(tensor(0, 1, 0, dims), 1)
    with pytest.raises(ValueError, match="32-bit address space"):
        encode_tile(tensor(0xFFFF_FF00, 1, 0, dims[:3]), 2)
    assert encode_tile(tensor(0xFFFF_FF00, 1, 0, dims[:3]), 2, wrap=True)["address"] == (
        0xFFFF_FF00 - 1 + 2 * 1000) % 2**32

    x_shape, w_shape = (1, 3, 7, 6), (5, 3, 3, 3)
    pooled = Epilogue.from_options(5, requant=(1, 2), pool=True)
    programs = {
        "matmul": lambda c: compile_matmul(c, 33, 20, 17, a_addr=0, b_addr=1 << 12,
                                           c_addr=2 << 12),
        "conv2d": lambda c: compile_conv2d(c, x_shape, w_shape, padding=1, x_addr=0,
                                           w_addr=1 << 12, y_addr=2 << 12),
        "pooled": lambda c: compile_conv2d(c, x_shape, w_shape, padding=1, x_addr=0,
                                           w_addr=1 << 12, y_addr=2 << 12, epilogue=pooled,
                                           scratch_addr=3 << 12)}
    three = dataclasses.replace(MICRO, descriptor_dims=3)
    for name, compile_ in programs.items():
        base = dataclasses.replace(MICRO, epilogue_pool=True) if name == "pooled" else MICRO
        for config, most in ((base, 2), (dataclasses.replace(base, descriptor_dims=3), 3)):
            tiles = [_tensor_dims(raw) for raw in compile_(config).instructions]
            used = max(len(t) - t[::-1].index(False) for t in tiles if t)
            assert used == most, name  # dims that are not extent 1
    # conv2d's pixel LOADs are 3-D (pixels, filter rows, channels): one per channel on micro.
    micro, wider = (programs["conv2d"](c).instructions for c in (MICRO, three))
    loads = [decode(raw) for raw in wider if opcode_of(raw) == Opcode.LOAD]
    assert sum(opcode_of(raw) == Opcode.LOAD for raw in micro) == sum(
        i.tensor.dims[2].extent for i in loads) > len(loads)


@pytest.mark.parametrize("pooled", [False, True])
def test_a_split_tile_moves_every_element_as_the_whole_tile(pooled):
    """`split_tile` of random 4-D tiles (padding on every side, a pooled STORE's rows) to 2 and
    3 walked dims: the tiles' elements, each (SRAM row, lane, address or padding), are the
    whole tile's, in the same order; the first tile takes the tokens it waits for, the last
    those it gives (`Program`)."""
    rng = np.random.default_rng(3 + pooled)
    for _ in range(40):
        extents = [int(rng.integers(1, 5)) for _ in range(3)] + [1 if pooled else
                                                                 int(rng.integers(1, 4))]
        dims = [Dim(e, int(rng.integers(-2, 3)), int(rng.integers(0, 6)),
                    int(rng.integers(1, 50))) for e in extents]
        tile = tensor(int(rng.integers(0, 1 << 12)), 1, int(rng.integers(0, 9)), dims,
                      lane=int(rng.integers(0, 3)))
        pitch = int(rng.integers(1, 6)) if pooled else None
        whole = _elements(tile, pitch)
        for walked in (2, 3):
            parts = split_tile(tile, walked, pitch)
            assert all(d["extent"] == 1 for part in parts for d in part["dims"][walked:])
            assert [e for part in parts for e in _elements(part, pitch)] == whole
    program = Program(MICRO).load(tensor(0, 1, 0, [Dim(4, 0, 4, 1), Dim(2, 0, 2, 4),
                                                   Dim(3, 0, 3, 8)]),
                                  Deps(pop_prev=True, push_next=True))
    headers = [decode(raw).header for raw in program.instructions]
    assert [(h.pop_prev, h.push_next) for h in headers] == [(1, 0), (0, 0), (0, 1)]


def _elements(tile, pitch):
    """Each element of `tensor` fields ``tile`` as the walkers take it: (SRAM row, lane, its
    address or None for padding), dim 0 fastest; with a pool ``pitch`` a pooled STORE's row."""
    dims = tile["dims"]
    extents = [d["extent"] for d in dims]
    elements = []
    for index in product(*(range(e) for e in reversed(extents))):
        i = index[::-1]
        if pitch is None:
            row = i[1] + extents[1] * (i[2] + extents[2] * i[3])
        else:
            row = 2 * i[1] + 2 * pitch * i[2]
        coords = [d["start"] + k for d, k in zip(dims, i)]
        inside = all(0 <= c < d["bound"] for c, d in zip(coords, dims))
        address = tile["base"] + sum(c * d["stride"] for c, d in zip(coords, dims))
        elements.append((tile["sram_row"] + row, tile["lane"] + i[0],
                         address if inside else None))
    return elements


def _tensor_dims(raw):
    """Per dim of a LOAD or STORE, whether it has extent 1 (else [])."""
    instruction = decode(raw)
    if instruction.header.opcode not in (Opcode.LOAD, Opcode.STORE):
        return []
    return [instruction.tensor.dims[d].extent == 1 for d in range(DIMS)]
