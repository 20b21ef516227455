"""cocotb tests of the core's AXI4 compliance: jobs on a memory that uses every freedom AXI4
gives a slave (`HostileAxiRam`), and the configuration a program runs with locked while it runs.

TPUGEN_TB (JSON) carries ``config``, ``seed`` and the jobs; results go to stats.json.
"""
import json
import os
from functools import partial

import cocotb
import numpy as np
from cocotbext.axi import AxiResp

from tpugen import CoreConfig

from ..firmware.attention import (attention_operands, compile_attention, plan_attention,
                                  quantize_attention)
from ..firmware.device import access_windows, operand_layout, program_placement
from ..firmware.conv2d import compile_conv2d, conv2d_lowering, conv2d_weights
from ..firmware.matmul import compile_matmul
from ..firmware.program import Program
from ..registers import register, window_writes
from ..isa import NUM_WINDOWS, ErrorCode
from .attention_model import attention_int8_model
from .axi_checker import AxiChecker
from .core_driver import CoreDriver
from .golden import conv2d_int32, matmul_int32
from .hostile_ram import HostileAxiRam

WATCHDOG = 2000
"""Cycles without progress before the core stops: far beyond the memory's longest wait (a
64-cycle latency behind random stalls), so only a master that waits for the slave trips it."""


class _Job:
    """A job laid out as `SimDevice` does: the inputs from address 0, then the output, then the
    program; windows that admit exactly those (fitted to ``cfg``'s). ``compile_program`` gives
    its `Program`, given the addresses of the inputs and the output as the keywords
    ``address_names``; ``expected``: the output, an int32 array."""

    def __init__(self, cfg, name, inputs, expected, compile_program, address_names):
        self.name, self.inputs = name, inputs
        self.expected = expected.astype(np.int32)  # wrapped to int32 by the golden models
        nbytes = self.expected.nbytes
        (self.input_addresses, (self.output,)), _ = operand_layout(
            [x.nbytes for x in inputs], [nbytes])
        addresses = dict(zip(address_names, [*self.input_addresses, self.output]))
        self.program = compile_program(**addresses).to_bytes()
        self.base = program_placement([(self.output, nbytes)])
        self.windows = access_windows(
            [(address, x.nbytes) for address, x in zip(self.input_addresses, inputs)],
            [(self.output, nbytes)], self.base, len(self.program), count=cfg.windows)

    async def prepare(self, core):
        """The inputs and a zeroed output in memory, the windows set."""
        for address, x in zip(self.input_addresses, self.inputs):
            core.ram.write(address, x.tobytes())
        core.ram.write(self.output, bytes(self.expected.nbytes))
        await core.set_windows(self.windows)

    def check(self, core, result):
        """Done without error, the output bit-exact, no AXI rule broken."""
        assert result.done and result.error == ErrorCode.NONE, f"{self.name}: {result}"
        got = np.frombuffer(core.ram.read(self.output, self.expected.nbytes), dtype="<i4")
        got = got.reshape(self.expected.shape)
        bad = np.argwhere(got != self.expected)
        assert not len(bad), (f"{self.name}: {len(bad)} of {got.size} wrong, first at {bad[0]}: "
                              f"{got[tuple(bad[0])]}, expected {self.expected[tuple(bad[0])]}")
        assert not core.checker.errors, f"{self.name}: {core.checker.errors[:5]}"


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def _matmul(cfg, rng, m, k, n):
    a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
    return _Job(cfg, f"matmul {m}x{k}x{n}", [a, b], matmul_int32(a, b),
                partial(compile_matmul, cfg, m, k, n), ("a_addr", "b_addr", "c_addr"))


def _conv2d(cfg, rng, x, w, stride, padding, dilation):
    x, w = _int8(rng, x), _int8(rng, w)
    lowering = conv2d_lowering(cfg, x.shape, w.shape)
    return _Job(cfg, f"conv2d {lowering} {x.shape} * {w.shape}",
                [x, conv2d_weights(w, lowering)], conv2d_int32(x, w, stride, padding, dilation),
                partial(compile_conv2d, cfg, x.shape, w.shape, stride=stride, padding=padding,
                        dilation=dilation, lowering=lowering), ("x_addr", "w_addr", "y_addr"))


def _attention(cfg, rng, heads, seq, kv, dim, causal):
    q, k, v = (rng.standard_normal((heads, n, dim)) for n in (seq, kv, kv))
    (q, k, v), _, frac = quantize_attention(q, k, v)
    plan = plan_attention(cfg, seq, kv, dim, causal)
    return _Job(cfg, f"attention {heads}x{seq}x{kv}x{dim}{' causal' * causal}",
                list(attention_operands(plan, q, k, v)),
                attention_int8_model(cfg, q, k, v, frac, causal),
                partial(compile_attention, cfg, plan, heads, causal=causal, frac=frac),
                ("q_addr", "kt_addr", "v_addr", "o_addr"))


async def _start(dut):
    """Parameters, a reset core on `HostileAxiRam` with the watchdog set, a seeded rng."""
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    core = CoreDriver(dut, cfg, checker=AxiChecker,
                      ram_class=partial(HostileAxiRam, seed=params["seed"]))
    await core.reset()
    await core.write("WATCHDOG", WATCHDOG)
    return cfg, params, core, np.random.default_rng(params["seed"])


def _slave_stats(core):
    return {"aw_held": core.ram.aw_held, "overtaken": core.ram.overtaken}


@cocotb.test()
async def replay(dut):
    """A matmul, a conv2d and (if asked for) an attention job on `HostileAxiRam` (AWREADY held
    until WVALID, random stalls on every channel, latencies up to 64 cycles, read IDs
    reordered): done, bit-exact, no AXI rule broken."""
    cfg, params, core, rng = await _start(dut)
    jobs = [_matmul(cfg, rng, *params["matmul"]), _conv2d(cfg, rng, **params["conv2d"])]
    if "attention" in params:
        jobs.append(_attention(cfg, rng, **params["attention"]))
    runs = []
    for job in jobs:
        await job.prepare(core)
        result = await core.run(job.program, job.base)
        job.check(core, result)
        runs.append({"name": job.name, **result.counters})
    core.write_stats({"runs": runs, "slave": _slave_stats(core)})


@cocotb.test()
async def locked_registers(dut):
    """While a matmul runs, the host writes every register of the configuration it runs with
    (program base and length, watchdog, windows) with values that would move the program to an
    END outside the windows, stop it at once and open all memory: every write answers SLVERR
    and changes nothing, the matmul ends exact within the windows latched at START. Once the
    core is idle the same writes answer OKAY and take effect."""
    cfg, params, core, rng = await _start(dut)
    job = _matmul(cfg, rng, *params["matmul"])
    await job.prepare(core)
    elsewhere = job.base + 0x10000
    core.ram.write(elsewhere, Program().end().to_bytes())
    wide = window_writes([(0, 1 << 31, True, True)] * NUM_WINDOWS)
    moves = {**dict(wide), "PROGRAM_BASE": elsewhere, "PROGRAM_LENGTH": 1, "WATCHDOG": 1}

    await core.write("IRQ_ENABLE", 1)
    await core.start(job.program, job.base)
    before = {name: await core.read(name) for name in moves}
    answers = {name: await core.write(name, value) for name, value in moves.items()}
    during = {name: await core.read(name) for name in moves}
    busy = register("STATUS").fields_of(await core.read("STATUS")).busy
    accepted = {name: answer.name for name, answer in answers.items() if answer != AxiResp.SLVERR}
    assert not accepted, f"written while STATUS.busy, answered: {accepted}"
    assert during == before, f"changed while busy: {before} -> {during}"
    assert busy, "the matmul ended before the host's writes: make it longer"
    job.check(core, await core.outcome(timeout_cycles=1_000_000))

    after = {name: await core.write(name, value) for name, value in moves.items()}
    assert set(after.values()) == {AxiResp.OKAY}, f"written while idle: {after}"
    idle = {name: await core.read(name) for name in moves}
    assert idle == moves, f"read back while idle: {idle}, written {moves}"
    refused = sorted(name for name, answer in answers.items() if answer == AxiResp.SLVERR)
    core.write_stats({"refused": refused, "slave": _slave_stats(core)})
