"""cocotb tests of the whole `tpu_core` with cocotbext-axi memory and control bus.

TPUGEN_TB (JSON) carries ``config``, ``seed``, the memory (``hostile``: `HostileAxiRam`, else
AxiRam, with ``backpressure`` if set) and the case parameters; results go to stats.json.
"""
import json
import os
from functools import partial

import cocotb
import numpy as np
from cocotbext.axi import AxiRam

from tpugen import CoreConfig

from ..firmware.conv2d import compile_conv2d, conv2d_weights
from ..firmware.matmul import compile_matmul
from ..firmware.program import Deps, Dim, Program
from ..firmware.program import tensor as tensor_fields
from .. import isa
from ..isa import ErrorCode, SoftmaxMode
from .axi_checker import AxiChecker
from .core_driver import CoreDriver
from .golden import conv2d_int32, matmul_int32
from .hostile_ram import HostileAxiRam
from .testbench import UNKNOWN_INSTRUCTION, exact_matmul

PROGRAM, A, B, C = 0x0000, 0x10000, 0x30000, 0x50000


async def _start(dut):
    """Config, parameters, a reset core (memory options from the parameters) and a seeded rng."""
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    seed = params["seed"]
    ram_class = partial(HostileAxiRam, seed=seed) if params.get("hostile") else AxiRam
    core = CoreDriver(dut, cfg, backpressure=params.get("backpressure", False), seed=seed,
                      checker=AxiChecker, ram_class=ram_class)
    await core.reset()
    return cfg, params, core, np.random.default_rng(seed)


@cocotb.test()
async def matmul(dut):
    """Tiled matmuls compiled by the firmware, bit-exact against numpy, with counters."""
    cfg, params, core, rng = await _start(dut)
    stats = []
    for m, k, n in params["shapes"]:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        core.ram.write(A, a.tobytes())
        core.ram.write(B, b.tobytes())
        core.ram.write(C, bytes(4 * m * n + 64))  # zeroed, with a guard after C
        await core.set_windows([(PROGRAM, A - PROGRAM, True, False),
                                (A, C - A, True, False),
                                (C, -(-4 * m * n // 64) * 64, False, True)])
        program = compile_matmul(cfg, m, k, n, a_addr=A, b_addr=B, c_addr=C)
        result = await core.run(program.to_bytes(), PROGRAM)
        assert result.done and result.error == ErrorCode.NONE, result
        got = np.frombuffer(core.ram.read(C, 4 * m * n), dtype="<i4").reshape(m, n)
        expected = matmul_int32(a, b)
        bad = np.argwhere(got != expected)
        assert not len(bad), (f"{m}x{k}x{n}: {len(bad)} mismatches, first at {bad[0]}: "
                              f"got {got[tuple(bad[0])]}, expected {expected[tuple(bad[0])]}; "
                              f"{result.counters}")
        assert core.ram.read(C + 4 * m * n, 64) == bytes(64), "wrote past C"
        assert not core.checker.errors, core.checker.errors[:5]
        stats.append({"shape": [m, k, n], "instructions": len(program), **result.counters})
    core.write_stats({"runs": stats})


def _identity_weights(cfg):
    """W = I (rows x cols), so a MATMUL copies activation lanes 0..min(rows, cols)-1."""
    return np.eye(cfg.rows, cfg.cols, dtype=np.int8)


@cocotb.test()
async def tiles(dut):
    """LOAD random 4-D tiles with padding at a random first lane over rows loaded before (the
    lanes below it keep those), pass them through W = I, STORE: against np.pad."""
    cfg, params, core, rng = await _start(dut)
    lanes = min(cfg.rows, cfg.cols)
    core.ram.write(B, _identity_weights(cfg).tobytes())
    for case in range(params["cases"]):
        shape = rng.integers(1, 7, 4)
        tensor = rng.integers(-128, 128, shape, dtype=np.int8)
        core.ram.write(A, tensor.tobytes())
        lane = int(rng.integers(0, lanes))
        extents = [int(rng.integers(1, lanes - lane + 1))] + [int(rng.integers(1, 4))
                                                              for _ in range(3)]
        starts = [int(rng.integers(-2, s + 1)) for s in shape[::-1]]
        strides = [tensor.strides[d] for d in range(3, -1, -1)]  # innermost (lanes) first
        dims = [Dim(extent=e, start=s, bound=int(b), stride=st)
                for e, s, b, st in zip(extents, starts, shape[::-1], strides)]
        rows = extents[1] * extents[2] * extents[3]
        # Expected: the padded tensor sliced at the tile, lanes innermost.
        padded = np.pad(tensor.astype(np.int64), 8)
        index = tuple(slice(8 + s, 8 + s + e) for s, e in zip(starts[::-1], extents[::-1]))
        below = rng.integers(-128, 128, (rows, cfg.lanes), dtype=np.int8)
        core.ram.write(B + 0x1000, below.tobytes())
        expected = np.zeros((rows, cfg.cols), dtype=np.int64)
        expected[:, :lane] = below[:, :lane]
        expected[:, lane:lane + extents[0]] = padded[index].reshape(rows, extents[0])
        program = Program()
        program.load(tensor_fields(B, 1, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=1),
                                             Dim(extent=cfg.rows, bound=cfg.rows, stride=cfg.cols)]))
        program.load(tensor_fields(B + 0x1000, 1, cfg.rows, [
            Dim(extent=cfg.lanes, bound=cfg.lanes, stride=1),
            Dim(extent=rows, bound=rows, stride=cfg.lanes)]))
        program.load(tensor_fields(A, 1, cfg.rows, dims, lane=lane), Deps(push_next=True))
        program.matmul(0, cfg.rows, 0, rows, deps=Deps(pop_prev=True, push_next=True))
        program.store(tensor_fields(C, 4, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=4),
                                              Dim(extent=rows, bound=rows, stride=4 * cfg.cols)]),
                      deps=Deps(pop_prev=True))
        program.end()
        await core.set_windows([(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False),
                                (C, 0x10000, False, True)])
        result = await core.run(program.to_bytes(), PROGRAM)
        assert result.done and result.error == ErrorCode.NONE, result
        got = np.frombuffer(core.ram.read(C, 4 * rows * cfg.cols), dtype="<i4").reshape(rows, -1)
        assert np.array_equal(got[:, :lanes], expected[:, :lanes]), (
            f"case {case}: tensor {shape}, starts {starts}, extents {extents}, lane {lane}\n"
            f"{got}\n{expected}")
        assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"cases": params["cases"]})


def _error_programs(cfg):
    """(name, program, expected ErrorCode, faulting instruction index) for every error."""
    ok_load = tensor_fields(A, 1, 0, [Dim(extent=cfg.rows, bound=cfg.rows, stride=1)])
    cases = []

    def case(name, code, index, build, wrap=False):
        program = Program(wrap=wrap)
        build(program)
        program.end()
        cases.append((name, program, code, index))

    case("unknown opcode", ErrorCode.UNKNOWN_OPCODE, 1,
         lambda p: (p.load(ok_load), p.instructions.append(UNKNOWN_INSTRUCTION)))
    case("load outside windows", ErrorCode.LOAD_WINDOW, 0,
         lambda p: p.load(tensor_fields(0x90000, 1, 0, [Dim(extent=4, bound=4, stride=1)])))
    case("store to a read-only window", ErrorCode.STORE_WINDOW, 0,
         lambda p: p.store(tensor_fields(A, 4, 0, [Dim(extent=1, bound=1, stride=4)])))
    case("zero extent", ErrorCode.BAD_EXTENT, 0,
         lambda p: p.load(tensor_fields(A, 1, 0, [Dim(extent=0, bound=4, stride=1)])))
    case("extent wider than a row", ErrorCode.BAD_EXTENT, 0,
         lambda p: p.load(tensor_fields(A, 1, 0, [Dim(extent=cfg.lanes + 1, bound=64, stride=1)])))
    case("load past the row from a first lane", ErrorCode.BAD_EXTENT, 0,
         lambda p: p.load(tensor_fields(A, 1, 0, [Dim(extent=2, bound=2, stride=1)],
                                        lane=cfg.lanes - 1)))
    case("store past the row from a first lane", ErrorCode.BAD_EXTENT, 0,
         lambda p: p.store(tensor_fields(C, 4, 0, [Dim(extent=1, bound=1, stride=4)],
                                         lane=cfg.cols)))
    case("misaligned int32 store", ErrorCode.MISALIGNED, 0,
         lambda p: p.store(tensor_fields(C + 2, 4, 0, [Dim(extent=1, bound=1, stride=4)])))
    case("scratchpad row out of range", ErrorCode.SRAM_RANGE, 0,
         lambda p: p.load(tensor_fields(A, 1, cfg.scratchpad_rows, [Dim(extent=1, bound=1, stride=1)])))
    case("accumulator row out of range", ErrorCode.SRAM_RANGE, 0,
         lambda p: p.matmul(0, 0, cfg.accumulator_rows, 1))
    case("softmax state out of range", ErrorCode.SRAM_RANGE, 0,
         lambda p: p.softmax(SoftmaxMode.NORMALIZE, count=2, o_row=0, o_tiles=1,
                             state_row=cfg.probability_rows - 1))
    case("int8 store without requantization", ErrorCode.BAD_ELEMENT, 0,
         lambda p: p.store(tensor_fields(C, 1, 0, [Dim(extent=1, bound=1, stride=1)])))
    case("int32 load", ErrorCode.BAD_ELEMENT, 0,
         lambda p: p.load(tensor_fields(A, 4, 0, [Dim(extent=1, bound=1, stride=4)])))
    case("token that never comes", ErrorCode.WATCHDOG, 1,
         lambda p: (p.load(ok_load), p.matmul(0, 0, 0, 1, deps=Deps(pop_prev=True))))

    def image_1_at(address):
        """An im2col tile of one element, pixel 0 of image 1 of a tensor at 0x90000 (outside
        every window; image 0 is not walked) whose image 1 wraps past 4 GiB to ``address``."""
        return {"base": 0x90000, "sram_row": 0, "rows": 1, "lanes": 1, "batch": 2,
                "channels": 1, "height": 1, "width": 1, "out_height": 1, "out_width": 1,
                "kernel_h": 1, "kernel_w": 1, "conv_stride": 1, "dilation": 1, "padding": 0,
                "n0": 1, "p0": 0, "q0": 0, "c0": 0, "r0": 0, "s0": 0,
                "stride_n": (1 << 32) - (0x90000 - address), "stride_c": 1, "stride_h": 1,
                "stride_w": 1}

    # An im2col element's address wraps too (`isa.encode_im2col(wrap=True)`) and is checked
    # there: into C, write-only, it is LOAD_WINDOW; into A, readable, the LOAD completes and
    # its token lets the MATMUL after it run (and fail).
    case("im2col element wrapped past 4 GiB into a write-only window", ErrorCode.LOAD_WINDOW, 0,
         lambda p: p.load_im2col(image_1_at(C)), wrap=True)
    case("im2col element wrapped past 4 GiB into a readable window", ErrorCode.SRAM_RANGE, 1,
         lambda p: (p.load_im2col(image_1_at(A + 0x100), Deps(push_next=True)),
                    p.matmul(0, 0, cfg.accumulator_rows, 1, deps=Deps(pop_prev=True))),
         wrap=True)
    # A tensor tile's addresses wrap: its second element, at C + stride - 2**32 = A, is read-only.
    case("store wrapped past 4 GiB into a read-only window", ErrorCode.STORE_WINDOW, 0,
         lambda p: p.store(tensor_fields(C, 4, 0, [Dim(extent=1, bound=1, stride=4), Dim(
             extent=2, bound=2, stride=(1 << 32) - (C - A))])), wrap=True)
    return cases


@cocotb.test()
async def errors(dut):
    """Every error code provoked on purpose: clean stop, irq, no access outside the windows,
    and after a soft reset the next good program runs."""
    cfg, params, core, rng = await _start(dut)
    await core.write("WATCHDOG", 500)
    windows = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False),
               (C, 0x1000, False, True)]
    seen = []
    for name, program, code, index in _error_programs(cfg):
        dut._log.info("error case: %s", name)
        await core.set_windows(windows)
        result = await core.run(program.to_bytes(), PROGRAM, timeout_cycles=20_000)
        assert not result.done and result.error == code and result.error_index == index, (
            f"{name}: {result}, expected {code} at {index}")
        assert await core.read("STATUS") & 1 == 0, f"{name}: still busy after the error irq"
        await core.soft_reset()
        seen.append(code)
    # A program outside every window: refused at fetch.
    await core.set_windows(windows[1:])
    result = await core.run(Program().end().to_bytes(), PROGRAM, timeout_cycles=20_000)
    assert result.error == ErrorCode.PROGRAM_WINDOW and result.error_index == 0, result
    await core.soft_reset()
    # Tokens left over by one program do not leak into the next.
    await core.set_windows(windows)
    leftover = Program().load(tensor_fields(A, 1, 0, [Dim(extent=1, bound=1, stride=1)]),
                              Deps(push_next=True)).end()
    result = await core.run(leftover.to_bytes(), PROGRAM, timeout_cycles=20_000)
    assert result.done, result
    waits = Program().matmul(0, 0, 0, 1, deps=Deps(pop_prev=True)).end()
    result = await core.run(waits.to_bytes(), PROGRAM, timeout_cycles=20_000)
    assert result.error == ErrorCode.WATCHDOG and result.error_index == 0, result
    await core.soft_reset()
    # And a good program runs after all that.
    result, exact = await exact_matmul(core, rng, windows, program=PROGRAM, a_addr=A, b_addr=B,
                                       c_addr=C)
    assert result.done and result.error == ErrorCode.NONE and exact, result
    assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"errors": [c.name for c in seen] + ["PROGRAM_WINDOW"]})


def _with_high_address_bits(program, rng, address_width):
    """``program`` (bytes) with random bits from ``address_width`` on in the address and the
    dim strides of every LOAD and STORE: bits a core of ``address_width`` ignores (addresses
    wrap below them), so it runs the program as it was."""
    size = isa.INSTRUCTION_BYTES
    descriptor, dim = isa.TensorDescriptor, isa.Dim
    fields = [descriptor["address"].offset,
              *(descriptor["dims"].offset + d * dim.size + dim["stride"].offset
                for d in range(isa.DIMS))]
    moved = []
    for start in range(0, len(program), size):
        raw = program[start:start + size]
        opcode = isa.decode(raw).header.opcode
        if opcode in (isa.Opcode.LOAD, isa.Opcode.STORE):
            tensor_at = isa.instruction_layout(opcode)["tensor"].offset
            for field in fields:
                raw = isa.with_bits(raw, tensor_at + field + address_width, 32 - address_width,
                                    int(rng.integers(1, 1 << 32 - address_width)))
        moved.append(raw)
    return b"".join(moved)


@cocotb.test()
async def narrow_addresses(dut):
    """A core of fewer address bits than 32 (`CoreConfig.address_width`, the memory's size):
    random bits above them in PROGRAM_BASE and in every LOAD's and STORE's address and strides
    change nothing (the matmul is exact; nothing outside the windows is touched); a readable
    window that reaches past the address space covers it up to its top; a writable window
    whose base is past the address space covers nothing (the STORE ends in STORE_WINDOW, even
    though the base's low bits are C's)."""
    cfg, params, core, rng = await _start(dut)
    space = 1 << cfg.address_width
    assert space == core.ram.size, "the memory is the address space"
    m, k, n = params["shape"]
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    core.ram.write(A, a.tobytes())
    core.ram.write(B, b.tobytes())
    core.ram.write(C, bytes(4 * m * n + 64))
    output = -(-4 * m * n // 64) * 64
    program = compile_matmul(cfg, m, k, n, a_addr=A, b_addr=B, c_addr=C).to_bytes()
    moved = _with_high_address_bits(program, rng, cfg.address_width)
    assert moved != program
    base = PROGRAM + space * int(rng.integers(1, (1 << 32) // space))
    await core.set_windows([(PROGRAM, A - PROGRAM, True, False), (A, (1 << 32) - A, True, False),
                            (C, output, False, True)])
    result = await core.run(moved, base)
    assert result.done and result.error == ErrorCode.NONE, result
    got = np.frombuffer(core.ram.read(C, 4 * m * n), dtype="<i4").reshape(m, n)
    assert np.array_equal(got, matmul_int32(a, b)), "not exact with the high bits set"
    assert core.ram.read(C + 4 * m * n, 64) == bytes(64), "wrote past C"
    core.ram.write(C, bytes(4 * m * n))
    await core.set_windows([(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False),
                            (C + space, output, False, True)])
    result = await core.run(moved, base)
    assert result.error == ErrorCode.STORE_WINDOW, result
    assert core.ram.read(C, 4 * m * n) == bytes(4 * m * n), "a STORE through a window past " \
        "the address space"
    assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"base": base})


@cocotb.test()
async def conv2d(dut):
    """conv2d in both lowerings (pixels on lanes; im2col LOADs), bit-exact against a direct
    numpy convolution."""
    cfg, params, core, rng = await _start(dut)
    stats = []
    for case in params["cases"]:
        x = rng.integers(-128, 128, case["x"], dtype=np.int8)
        w = rng.integers(-128, 128, case["w"], dtype=np.int8)
        options = {key: case[key] for key in ("stride", "padding", "dilation")}
        expected = conv2d_int32(x, w, **options)
        core.ram.write(A, x.tobytes())
        core.ram.write(B, conv2d_weights(w, case["lowering"]).tobytes())
        await core.set_windows([(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False),
                                (C, -(-4 * expected.size // 64) * 64, False, True)])
        program = compile_conv2d(cfg, x.shape, w.shape, **options, x_addr=A, w_addr=B, y_addr=C,
                                 lowering=case["lowering"], span=case.get("span"))
        result = await core.run(program.to_bytes(), PROGRAM)
        assert result.done and result.error == ErrorCode.NONE, (case, result)
        got = np.frombuffer(core.ram.read(C, 4 * expected.size), dtype="<i4").reshape(expected.shape)
        bad = np.argwhere(got != expected)
        assert not len(bad), f"{case}: {len(bad)} mismatches of {expected.size}, first at {bad[0]}"
        assert not core.checker.errors, core.checker.errors[:5]
        stats.append({"case": case, **result.counters})
    core.write_stats({"runs": stats})
