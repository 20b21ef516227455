"""cocotb tests of the core under faults: resets mid-program, back-to-back programs, the
interrupt, SLVERR / DECERR from memory, memory that never answers, and errors that come after
the controller has fetched END.

TPUGEN_TB (JSON) carries ``config``, ``seed`` and the case parameters; results go to stats.json.
After every fault a good program (a random matmul) must give numpy's result.
"""
import json
import os

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiResp

from tpugen import CoreConfig

from ..arch import opcode_of
from ..firmware.epilogue import Epilogue
from ..firmware.matmul import compile_matmul
from ..firmware.program import Deps, Dim, Program, tensor
from ..isa import INSTRUCTION_BYTES, ErrorCode, Opcode, decode
from ..registers import register
from .axi_checker import AxiChecker
from .core_driver import CoreDriver
from .fault_memory import Fault, FaultyAxiRam
from .golden import apply_epilogue, matmul_int32
from .testbench import UNKNOWN_INSTRUCTION

PROGRAM, A, B, C = 0x0000, 0x10000, 0x30000, 0x50000
WINDOWS = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False), (C, 0x10000, False, True)]
WATCHDOG = 2000
_RESET_POLLS = 100


class FaultyCoreDriver(CoreDriver):
    """A CoreDriver whose memory is a `FaultyAxiRam` (``ram.faults``)."""

    def __init__(self, dut, config, *, backpressure, seed):
        super().__init__(dut, config, backpressure=backpressure, seed=seed, checker=AxiChecker,
                         ram_class=FaultyAxiRam)


class _Job:
    """A random matmul (maybe with an epilogue) in memory: its program and expected output."""

    def __init__(self, core, rng, m, k, n, epilogue_options=None):
        cfg = core.config
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        options = epilogue_options or {}
        epilogue = Epilogue.from_options(n, **options)
        self.expected = apply_epilogue(matmul_int32(a, b), channel_axis=1, **options)
        self.nbytes = self.expected.size * self.expected.itemsize
        core.ram.write(A, a.tobytes())
        core.ram.write(B, b.tobytes())
        core.ram.write(C, bytes(self.nbytes + 64))  # zeroed, with a guard after C
        self.program = compile_matmul(cfg, m, k, n, a_addr=A, b_addr=B, c_addr=C, epilogue=epilogue)
        self.name = f"{m}x{k}x{n} {sorted(options)}"

    def check(self, core):
        dtype = self.expected.dtype.newbyteorder("<")
        got = np.frombuffer(core.ram.read(C, self.nbytes), dtype=dtype).reshape(self.expected.shape)
        bad = np.argwhere(got != self.expected)
        assert not len(bad), (f"{self.name}: {len(bad)} wrong elements, first at {bad[0]}: "
                              f"{got[tuple(bad[0])]}, expected {self.expected[tuple(bad[0])]}")
        assert core.ram.read(C + self.nbytes, 64) == bytes(64), f"{self.name}: wrote past C"

    def index_of(self, opcode, address=None):
        """Index of the first instruction with ``opcode`` (and a tile whose first element,
        the descriptor's ``address``, is at ``address``)."""
        return next(i for i, raw in enumerate(self.program.instructions)
                    if opcode_of(raw) == opcode
                    and (address is None or decode(raw).tensor.address == address))


async def _start(dut):
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    core = FaultyCoreDriver(dut, cfg, backpressure=params.get("backpressure", False),
                            seed=params["seed"])
    await core.reset()
    await core.set_windows(WINDOWS)
    await core.write("WATCHDOG", WATCHDOG)
    return params, core, np.random.default_rng(params["seed"])


async def _good_program(core, rng, label):
    """A random matmul after a fault: done, no error, numpy's result, no bad AXI access."""
    job = _Job(core, rng, *(int(v) for v in rng.integers(1, 13, 3)))
    result = await core.run(job.program.to_bytes(), PROGRAM, timeout_cycles=12_000)
    assert result.done and result.error == ErrorCode.NONE, f"{label}: {job.name}: {result}"
    job.check(core)
    assert not core.checker.errors, f"{label}: {core.checker.errors[:5]}"


async def _status(core):
    return register("STATUS").fields_of(await core.read("STATUS"))


async def _hard_reset(core):
    """Pulse ``rst`` (the clock keeps running), then configure the core as `_start` does."""
    core.dut.rst.value = 1
    await ClockCycles(core.dut.clk, 3)
    core.dut.rst.value = 0
    await ClockCycles(core.dut.clk, 2)
    for name in ("STATUS", "IRQ_STATUS", "IRQ_ENABLE", "PROGRAM_LENGTH", "WINDOW0_SIZE",
                 "WATCHDOG"):
        assert await core.read(name) == register(name).reset, f"{name} after a hard reset"
    await core.set_windows(WINDOWS)
    await core.write("WATCHDOG", WATCHDOG)
    await core.write("IRQ_ENABLE", 1)


async def _reset_mid_program(core, rng, delays, reset):
    """For each delay: start a long matmul, ``reset`` the core that many cycles later (it must
    still be busy), then run a good program. Returns what went wrong, per delay (after a
    failure the core is hard reset, so that the next delay starts clean)."""
    failures = []
    for delay in delays:
        job = _Job(core, rng, 32, 16, 16)
        await core.start(job.program.to_bytes(), PROGRAM)
        await ClockCycles(core.dut.clk, delay)
        assert core.dut.irq.value == 0, f"the program ended before the reset at {delay} cycles"
        await reset(core)
        try:
            for _ in range(_RESET_POLLS):  # a soft reset first finishes the bursts in flight
                if not await core.read("STATUS") & 1:
                    break
            clear = (await core.read("STATUS"), await core.read("IRQ_STATUS"),
                     int(core.dut.irq.value))
            assert clear == (0, 0, 0), f"STATUS, IRQ_STATUS, irq {clear}"
            await _good_program(core, rng, "good program")
        except AssertionError as failure:
            failures.append(f"reset {delay} cycles after the start: {failure}")
            core.checker.errors.clear()
            await _hard_reset(core)
    return failures


@cocotb.test()
async def soft_reset_mid_program(dut):
    """A long matmul is soft reset after each of ``delays`` cycles (bursts in flight, with
    backpressure); the core finishes what its bursts owe the bus (STATUS.busy meanwhile), is
    then idle and clear, and a good program gives numpy's result."""
    params, core, rng = await _start(dut)
    await core.write("IRQ_ENABLE", 1)
    failures = await _reset_mid_program(core, rng, params["delays"], CoreDriver.soft_reset)
    core.write_stats({"resets": len(params["delays"]), "failures": failures})
    assert not failures, "\n".join(failures)


@cocotb.test()
async def hard_reset_mid_program(dut):
    """A long matmul is stopped by ``rst`` after each of ``delays`` cycles; the registers are
    back to their reset values, and once configured again a good program gives numpy's
    result."""
    params, core, rng = await _start(dut)
    await core.write("IRQ_ENABLE", 1)
    failures = await _reset_mid_program(core, rng, params["delays"], _hard_reset)
    core.write_stats({"resets": len(params["delays"]), "failures": failures})
    assert not failures, "\n".join(failures)


@cocotb.test()
async def back_to_back(dut):
    """Programs one after another with no reset in between (epilogues too): every result
    exact, and the counters restart with each program."""
    params, core, rng = await _start(dut)
    for m, k, n, options in params["jobs"]:
        if "requant" in options:
            options["requant"] = tuple(options["requant"])
        job = _Job(core, rng, m, k, n, options)
        result = await core.run(job.program.to_bytes(), PROGRAM, timeout_cycles=30_000)
        assert result.done and result.error == ErrorCode.NONE, (job.name, result)
        job.check(core)
        assert result.counters["bytes_written"] == job.nbytes, (job.name, result.counters)
        assert result.counters["macs"] > 0 and result.counters["cycles"] > 0
    assert not core.checker.errors, core.checker.errors[:5]
    core.write_stats({"programs": len(params["jobs"])})


async def _count_rises(signal, counter):
    while True:
        await RisingEdge(signal)
        counter[0] += 1


async def _wait_not_busy(core, cycles):
    for _ in range(cycles // 50):
        await ClockCycles(core.dut.clk, 50)
        if not (await _status(core)).busy:
            return
    raise AssertionError(f"still busy after {cycles} cycles")


@cocotb.test()
async def interrupt(dut):
    """irq rises exactly once per program, done or error, holds until IRQ_STATUS is
    acknowledged and then falls; with IRQ_ENABLE 0 it never rises while STATUS and IRQ_STATUS
    still show the end, and enabling it then raises it for the pending cause."""
    params, core, rng = await _start(dut)
    rises = [0]
    cocotb.start_soon(_count_rises(dut.irq, rises))
    unknown = Program()
    unknown.instructions.append(UNKNOWN_INSTRUCTION)
    irq_status = register("IRQ_STATUS")
    stats = []
    for enabled in (True, False):
        await core.write("IRQ_ENABLE", int(enabled))
        for job in (_Job(core, rng, 9, 7, 5), None):
            program, cause = ((job.program, irq_status.value(done=1)) if job
                              else (unknown, irq_status.value(error=1)))
            before = rises[0]
            await core.start(program.to_bytes(), PROGRAM)
            await _wait_not_busy(core, 100_000)
            await ClockCycles(dut.clk, 200)
            status = await _status(core)
            assert (status.done, status.error) == ((1, 0) if job else (0, 1)), status
            assert await core.read("IRQ_STATUS") == cause
            assert rises[0] - before == int(enabled) and int(dut.irq.value) == int(enabled), (
                f"enabled={enabled}, job={job and job.name}: {rises[0] - before} rises, "
                f"irq={dut.irq.value}")
            stats.append({"enabled": enabled, "rises": rises[0] - before})
            if not enabled:
                await core.write("IRQ_ENABLE", 1)
                assert int(dut.irq.value) == 1, "enabling the interrupt with a cause pending"
                await core.write("IRQ_ENABLE", 0)
            await core.write("IRQ_STATUS", irq_status.mask)
            await ClockCycles(dut.clk, 20)
            assert int(dut.irq.value) == 0 and await core.read("IRQ_STATUS") == 0
            if job:
                job.check(core)
            else:
                await core.soft_reset()
        await core.write("IRQ_ENABLE", 1)
        await ClockCycles(dut.clk, 20)
        assert int(dut.irq.value) == 0, "irq after acknowledged programs"
    core.write_stats({"runs": stats})


def _fault(kind, job, response, beat_bytes):
    """A ``kind`` ("read", "fetch", "fetch-middle", "fetch-last" or "write") of fault with
    ``response`` for ``job``, and the index of the instruction it must be blamed on. A fetch
    fault hits every beat of instruction 2, or only a middle beat or its last beat."""
    fetched = PROGRAM + 2 * INSTRUCTION_BYTES
    beats = INSTRUCTION_BYTES // beat_bytes
    if kind == "read":
        return Fault(A, 0x1000, "read", response), job.index_of(Opcode.LOAD, address=A)
    if kind == "fetch":
        return Fault(fetched, INSTRUCTION_BYTES, "read", response), 2
    if kind in ("fetch-middle", "fetch-last"):
        beat = beats // 2 if kind == "fetch-middle" else beats - 1
        return Fault(fetched + beat * beat_bytes, beat_bytes, "read", response), 2
    return Fault(C, 0x1000, "write", response), job.index_of(Opcode.STORE)


@cocotb.test()
async def bus_errors(dut):
    """SLVERR and DECERR on a data read, an instruction fetch (every beat, a middle beat, the
    last beat) and a write response: BUS_ERROR
    at the instruction concerned, the core idle after the interrupt; after a soft reset a good
    program gives numpy's result."""
    params, core, rng = await _start(dut)
    seen = []
    for kind, response in params["faults"]:
        job = _Job(core, rng, 9, 7, 5)
        fault, index = _fault(kind, job, AxiResp[response], core.config.axi_data_width // 8)
        core.ram.faults[:] = [fault]
        result = await core.run(job.program.to_bytes(), PROGRAM, timeout_cycles=50_000)
        ended = (result.done, result.error, result.error_index)
        assert ended == (False, ErrorCode.BUS_ERROR, index), (
            f"{kind} {response}: {result}, expected BUS_ERROR at {index}")
        assert not (await _status(core)).busy, f"{kind} {response}: busy after the interrupt"
        core.ram.faults.clear()
        await core.soft_reset()
        await _good_program(core, rng, f"{kind} {response}")
        seen.append([kind, response, index])
    core.write_stats({"faults": seen})


def _errors_after_end(cfg):
    """(name, program, error, index): an instruction of each engine that fails long after END
    was fetched, while the other engines are idle."""
    weights = tensor(B, 1, 0, [Dim(extent=cfg.cols, bound=cfg.cols, stride=1),
                               Dim(extent=cfg.rows, bound=cfg.rows, stride=cfg.cols)])
    rows = min(200, cfg.scratchpad_rows - cfg.rows)
    long_load = tensor(A, 1, cfg.rows, [Dim(extent=cfg.rows, bound=cfg.rows, stride=1),
                                        Dim(extent=rows, bound=rows, stride=cfg.rows)])
    outside = tensor(0x90000, 4, 0, [Dim(extent=1, bound=1, stride=4)])
    count = min(64, cfg.accumulator_rows)
    store = Program().load(weights).load(long_load, Deps(push_next=True))
    store.matmul(0, cfg.rows, 0, count, deps=Deps(pop_prev=True, push_next=True))
    store.store(outside, deps=Deps(pop_prev=True)).end()
    matmul = Program().load(weights).load(long_load, Deps(push_next=True))
    matmul.matmul(0, cfg.rows, cfg.accumulator_rows, 1, deps=Deps(pop_prev=True)).end()
    load = Program().load(weights).load(long_load, Deps(push_next=True))
    load.matmul(0, cfg.rows, 0, count, deps=Deps(pop_prev=True, push_prev=True))
    load.load(tensor(0x90000, 1, 0, [Dim(extent=1, bound=1, stride=1)]), Deps(pop_next=True)).end()
    return [("store", store, ErrorCode.STORE_WINDOW, 3),
            ("matmul", matmul, ErrorCode.SRAM_RANGE, 2),
            ("load", load, ErrorCode.LOAD_WINDOW, 3)]


@cocotb.test()
async def errors_after_end(dut):
    """An engine that fails after the controller has fetched END, when every other engine is
    idle: the program must end with that error, not done, and the next program must run."""
    params, core, rng = await _start(dut)
    failures = []
    for name, program, code, index in _errors_after_end(core.config):
        result = await core.run(program.to_bytes(), PROGRAM, timeout_cycles=50_000)
        if (result.error, result.error_index) != (code, index):
            failures.append(f"{name}: {result}, expected {code.name} at {index}")
        await core.soft_reset()
        await _good_program(core, rng, name)
    core.write_stats({"failures": failures})
    assert not failures, "\n".join(failures)


@cocotb.test()
async def silent_memory(dut):
    """A fetch, a data read or a write response that never comes: the watchdog stops the core
    (WATCHDOG, interrupt) within its limit plus a margin; after a hard reset a good program
    gives numpy's result."""
    params, core, rng = await _start(dut)
    failures = []
    for kind in params["kinds"]:
        job = _Job(core, rng, 9, 7, 5)
        core.ram.faults[:] = [_fault(kind, job, None, core.config.axi_data_width // 8)[0]]
        try:
            result = await core.run(job.program.to_bytes(), PROGRAM, timeout_cycles=3 * WATCHDOG)
            if result.error != ErrorCode.WATCHDOG:
                failures.append(f"{kind}: {result}, expected WATCHDOG")
        except AssertionError as failure:
            failures.append(f"{kind}: {failure} (WATCHDOG {WATCHDOG})")
        core.ram.faults.clear()
        await _hard_reset(core)
        await _good_program(core, rng, f"silent {kind}")
    core.write_stats({"failures": failures})
    assert not failures, "\n".join(failures)
