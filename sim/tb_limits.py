"""cocotb tests of the core's limits and fetch policy on `tpu_core` with AxiRam: dependency-token
counters at their limit, instruction fetches and tensor tiles that run past the top of the
32-bit address space, the W bursts a soft reset finishes, and a core with fewer access windows
than the map.

TPUGEN_TB (JSON) carries ``config``, ``seed``, the memory's ``latency`` (optional) and the case
parameters. Each test records what the core did in stats.json (tests/test_limits_verilator.py
asserts); ``tokens`` and ``fetch_wrap`` then run one good matmul, so every AXI channel is used
and the core is shown to work afterwards.
"""
import json
import os
from functools import partial

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiRam

from tpugen import CoreConfig

from ..firmware.matmul import compile_matmul
from ..firmware.program import Deps, Dim, Program, tensor
from ..isa import INSTRUCTION_BYTES, NUM_WINDOWS, PARAMS_RESET, Opcode, encode
from .axi_checker import AxiChecker
from .core_driver import CoreDriver
from .golden import matmul_int32
from .latency_ram import LatencyAxiRam
from .testbench import exact_matmul

PROGRAM, A, B, C = 0x0000, 0x10000, 0x30000, 0x50000
MEMORY_SIZE = 1 << 20
"""AxiRam's size: addresses wrap around it, so 0xFFFFFF00 is byte 0xFFF00 of the memory."""
WINDOWS = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False), (C, 0x1000, False, True)]


async def _start(dut):
    """Config, parameters, a reset core and a seeded rng. The memory is AxiRam, or with
    ``latency`` (least, most) a `LatencyAxiRam` answering each burst that many cycles late."""
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    ram_class = AxiRam
    if "latency" in params:
        ram_class = partial(LatencyAxiRam, read_latency=0)
    core = CoreDriver(dut, cfg, memory_size=MEMORY_SIZE, seed=params["seed"], checker=AxiChecker,
                      ram_class=ram_class)
    if "latency" in params:
        core.ram.read_if.latency = core.ram.write_if.latency = tuple(params["latency"])
    await core.reset()
    await core.write("IRQ_ENABLE", 1)
    return cfg, params, core, np.random.default_rng(params["seed"])


async def _good_after(core, rng):
    """A matmul that must be exact (and reads and writes memory) after whatever ran before."""
    result, exact = await exact_matmul(core, rng, WINDOWS, program=PROGRAM, a_addr=A, b_addr=B,
                                       c_addr=C)
    return bool(result.done and exact)


def _outcome(result):
    return {"done": result.done, "error": result.error.name, "index": result.error_index}


PUSHES = {
    # direction (counter): an instruction of the pushing engine that pushes there and is cheap.
    "load->execute": lambda cfg: Program().load(
        tensor(A, 1, 0, [Dim(extent=1, bound=1, stride=1)]), Deps(push_next=True)),
    "execute->store": lambda cfg: Program().matmul(0, 0, 0, 1, deps=Deps(push_next=True)),
    "execute->load": lambda cfg: Program().matmul(0, 0, 0, 1, deps=Deps(push_prev=True)),
    "store->execute": lambda cfg: _params_pushing_prev(),
}
"""One instruction per token counter that pushes a token on it; nothing ever pops them."""


def _params_pushing_prev():
    program = Program()
    program.instructions.append(encode(Opcode.PARAMS, header={"push_prev": 1}, broadcast=1,
                                       entries=[PARAMS_RESET]))
    return program


@cocotb.test()
async def tokens(dut):
    """``cases``: [direction, pushes]: a program of ``pushes`` instructions that each push a
    token on the counter of ``direction`` and that nobody pops, then END."""
    cfg, params, core, rng = await _start(dut)
    await core.write("WATCHDOG", params["watchdog"])
    runs = []
    for direction, pushes in params["cases"]:
        await core.set_windows(WINDOWS)
        push = PUSHES[direction](cfg).to_bytes()
        program = push * pushes + Program().end().to_bytes()
        result = await core.run(program, PROGRAM, timeout_cycles=200 * pushes + 100_000)
        runs.append({"direction": direction, "pushes": pushes, **_outcome(result)})
        if not result.done:
            await core.soft_reset()
    core.write_stats({"runs": runs, "good_after": await _good_after(core, rng)})


@cocotb.test()
async def fetch_wrap(dut):
    """A matmul program placed so that its instruction ``before`` (the first ``before`` ones
    sit in the last bytes of the 4 GiB address space) wraps to address 0, run under each of
    ``cases``: {name: [windows of the program as (base, size)]} (data windows as usual)."""
    cfg, params, core, rng = await _start(dut)
    m, k, n = 5, 6, 3
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    core.ram.write(A, a.tobytes())
    core.ram.write(B, b.tobytes())
    code = compile_matmul(cfg, m, k, n, a_addr=A, b_addr=B, c_addr=C).to_bytes()
    base = (1 << 32) - params["before"] * INSTRUCTION_BYTES
    runs = {"instructions": len(code) // INSTRUCTION_BYTES, "base": base}
    for name, program_windows in params["cases"].items():
        core.ram.write(C, bytes(4 * m * n))
        # The bytes at and past `base` are the end of the memory, then its start (it wraps).
        at = base % MEMORY_SIZE
        core.ram.write(at, code[:MEMORY_SIZE - at])
        core.ram.write(0, code[MEMORY_SIZE - at:])
        await core.set_windows([(b, s, True, False) for b, s in program_windows] + WINDOWS[1:])
        await core.prepare(base, len(code) // INSTRUCTION_BYTES)
        await core.launch()
        result = await core.outcome(100_000)
        got = np.frombuffer(core.ram.read(C, 4 * m * n), dtype="<i4").reshape(m, n)
        runs[name] = {**_outcome(result), "exact": bool(np.array_equal(got, matmul_int32(a, b)))}
        if not result.done:
            await core.soft_reset()
        core.ram.write(0, bytes(len(code)))
    core.write_stats({"runs": runs, "good_after": await _good_after(core, rng)})


def tile_wrap_program(cfg, m, act_address, weights):
    """``tile_wrap``'s program: W = I from ``weights``, ``m`` activation rows from
    ``act_address`` (past 4 GiB they wrap to 0), a MATMUL and a STORE of rows 0x100 apart going
    down from 0x280 past address 0 to the top of the address space."""
    program = Program(cfg, wrap=True)
    program.load(tensor(weights, 1, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=1),
                                        Dim(extent=cfg.rows, bound=cfg.rows, stride=cfg.cols)]))
    program.load(tensor(act_address, 1, cfg.rows, [
        Dim(extent=cfg.lanes, bound=cfg.lanes, stride=1),
        Dim(extent=m, bound=m, stride=cfg.lanes)]), Deps(push_next=True))
    program.matmul(0, cfg.rows, 0, m, deps=Deps(pop_prev=True, push_next=True))
    program.store(tensor(0x280, 4, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=4),
                                       Dim(extent=m, bound=m, stride=(1 << 32) - 0x100)]),
                  deps=Deps(pop_prev=True))
    return program.end()


@cocotb.test()
async def tile_wrap(dut):
    """Tensor tiles past the top of the address space (`isa.encode_tile(wrap=True)`): a LOAD
    of ``m`` x ``cfg.lanes`` activations whose first ``act_before`` bytes are the last of the
    address space and whose rest, from the middle of a row on, is at address 0; a MATMUL through
    W = I; a STORE of the result whose rows step down from 0x280 by 0x100 (a stride of 2**32 -
    0x100), below address 0 to the top. Run under each of ``cases``: {name: [windows (base,
    size, readable, writable)]} besides the program's and W's; records the outcome, whether
    each stored row is its activation row, and whether the rows' places kept their bytes."""
    cfg, params, core, rng = await _start(dut)
    m, before, program_at = params["m"], params["act_before"], 0x8000
    act = rng.integers(-128, 128, (m, cfg.lanes), dtype=np.int8)
    act_address = (1 << 32) - before
    rows = [(0x280 - 0x100 * i) % (1 << 32) for i in range(m)]
    program = tile_wrap_program(cfg, m, act_address, B)
    usable = min(cfg.rows, cfg.cols)  # W = I copies these lanes
    expected = np.zeros((m, cfg.cols), dtype="<i4")
    expected[:, :usable] = act[:, :usable]
    fill = bytes([0xA5]) * (4 * cfg.cols)
    core.ram.write(B, np.eye(cfg.rows, cfg.cols, dtype=np.int8).tobytes())
    runs = {}
    for name, windows in params["cases"].items():
        data, at = act.tobytes(), act_address % MEMORY_SIZE
        core.ram.write(at, data[:MEMORY_SIZE - at])
        core.ram.write(0, data[MEMORY_SIZE - at:])
        for row in rows:
            core.ram.write(row % MEMORY_SIZE, fill)
        await core.set_windows([(program_at, 0x1000, True, False), (B, 0x1000, True, False)]
                               + [tuple(w) for w in windows])
        result = await core.run(program.to_bytes(), program_at, timeout_cycles=20_000)
        got = [core.ram.read(row % MEMORY_SIZE, 4 * cfg.cols) for row in rows]
        runs[name] = {**_outcome(result),
                      "exact": got == [expected[i].tobytes() for i in range(m)],
                      "untouched": got == [fill] * m}
        if not result.done:
            await core.soft_reset()
    assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"runs": runs, "good_after": await _good_after(core, rng)})


@cocotb.test()
async def missing_windows(dut):
    """On a core with one window (``CoreConfig.windows=1``) that the host gives WINDOWS and a
    read-write window over the rest: only window 0 exists. A LOAD from A (window 1) stops with
    LOAD_WINDOW and a STORE to C (window 2) with STORE_WINDOW, before any access (C keeps its
    bytes); a program in window 1 alone stops with PROGRAM_WINDOW; the registers of windows
    1.. read 0. Then a matmul in one read-write window over everything it touches."""
    cfg, params, core, rng = await _start(dut)
    everything = (PROGRAM, C + 0x1000 - PROGRAM, True, True)
    pattern = bytes(range(256)) * 4
    core.ram.write(C, pattern)
    one_row = [Dim(extent=cfg.rows, bound=cfg.rows, stride=1)]
    cases = {
        "load": (WINDOWS + [everything], Program().load(tensor(A, 1, 0, one_row))),
        "store": (WINDOWS + [everything], Program().store(
            tensor(C, 4, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=4)]))),
        "fetch": ([WINDOWS[1], WINDOWS[0], everything], Program()),
    }
    runs = {}
    for name, (windows, program) in cases.items():
        await core.set_windows(windows)
        result = await core.run(program.end().to_bytes(), PROGRAM, timeout_cycles=20_000)
        runs[name] = _outcome(result)
        await core.soft_reset()
    lacked = [await core.read(f"WINDOW{i}_{part}") for i in range(cfg.windows, NUM_WINDOWS)
              for part in ("BASE", "SIZE", "FLAGS")]
    untouched = core.ram.read(C, len(pattern)) == pattern
    result, exact = await exact_matmul(core, rng, [everything], program=PROGRAM, a_addr=A,
                                       b_addr=B, c_addr=C)
    assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"runs": runs, "lacked": lacked, "untouched": untouched,
                      "good_after": bool(result.done and exact)})


@cocotb.test()
async def soft_reset_after_stores(dut):
    """``shape`` (m, k, n) matmuls whose results go out in one-beat bursts, each followed by a
    soft reset, on a memory that is always ready; counts the AW and W bursts on the bus, and
    checks every result (a W burst without its AW shifts the data of the bursts after it)."""
    cfg, params, core, rng = await _start(dut)
    bursts = {"AW": 0, "W": 0}

    async def count():
        while True:
            await RisingEdge(dut.clk)
            if dut.m_axi_awvalid.value and dut.m_axi_awready.value:
                bursts["AW"] += 1
            if dut.m_axi_wvalid.value and dut.m_axi_wready.value and dut.m_axi_wlast.value:
                bursts["W"] += 1

    cocotb.start_soon(count())
    await core.set_windows(WINDOWS)
    m, k, n = params["shape"]
    exact = []
    for _ in range(params["runs"]):
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        core.ram.write(A, a.tobytes())
        core.ram.write(B, b.tobytes())
        core.ram.write(C, bytes(4 * m * n))
        program = compile_matmul(cfg, m, k, n, a_addr=A, b_addr=B, c_addr=C)
        result = await core.run(program.to_bytes(), PROGRAM, timeout_cycles=100_000)
        got = np.frombuffer(core.ram.read(C, 4 * m * n), dtype="<i4").reshape(m, n)
        exact.append(bool(result.done and np.array_equal(got, matmul_int32(a, b))))
        await core.soft_reset()
        await ClockCycles(dut.clk, 50)
    core.write_stats({"bursts": bursts, "exact": exact})
