"""A timed matmul on `SimSystem`: the memory is inside the model, so Python only loads the
operands, starts the core, sleeps until ``irq`` and reads the result back.

TPUGEN_TB carries ``config``, ``m``, ``k``, ``n``, ``seed``, ``memory_bytes`` and
``timeout_cycles``; the timings and counters go to stats.json.
"""
import json
import os
import time

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time

from tpugen import CoreConfig

from ..firmware.device import access_windows, operand_layout, program_placement
from ..firmware.matmul import compile_matmul
from ..isa import INSTRUCTION_BYTES
from .golden import matmul_int32
from .system_driver import SystemDriver


@cocotb.test()
async def matmul(dut):
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    m, k, n = params["m"], params["k"], params["n"]
    rng = np.random.default_rng(params["seed"])
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c_bytes = 4 * m * n
    ((a_addr, b_addr), (c_addr,)), _ = operand_layout([a.nbytes, b.nbytes], [c_bytes])
    program_addr = program_placement([(c_addr, c_bytes)])
    code = compile_matmul(cfg, m, k, n, a_addr=a_addr, b_addr=b_addr, c_addr=c_addr).to_bytes()
    assert program_addr + len(code) <= params["memory_bytes"], \
        f"{m}x{k}x{n} needs {program_addr + len(code)} bytes of memory"

    system = SystemDriver(dut, cfg)
    await system.reset()
    memory = system.ram

    stats = {}
    started = time.perf_counter()
    memory.write(a_addr, a.tobytes())
    memory.write(b_addr, b.tobytes())
    memory.write(program_addr, code)
    stats["load_seconds"] = time.perf_counter() - started

    windows = access_windows([(a_addr, a.nbytes), (b_addr, b.nbytes)], [(c_addr, c_bytes)],
                             program_addr, len(code), count=cfg.windows)
    await system.set_windows(windows)
    # The program is already in memory: not `system.start`, which would write it again, timed.
    await system.prepare(program_addr, len(code) // INSTRUCTION_BYTES, interrupt=True)

    started, cpu_started, sim_started = time.perf_counter(), time.process_time(), get_sim_time("ns")
    await system.launch()
    assert await system.wait_interrupt(params["timeout_cycles"]), "no interrupt"
    stats["run_seconds"] = time.perf_counter() - started
    stats["run_cpu_seconds"] = time.process_time() - cpu_started
    stats["sim_cycles"] = round((get_sim_time("ns") - sim_started) / system.period_ns)

    run = await system.outcome(0)  # the interrupt is up: no wait
    assert run.done, f"the core stopped with {run.error.name}"
    stats.update(run.counters)

    started = time.perf_counter()
    got = np.frombuffer(memory.read(c_addr, c_bytes), "<i4").reshape(m, n)
    stats["read_seconds"] = time.perf_counter() - started
    bad = np.argwhere(got != matmul_int32(a, b))
    assert not len(bad), f"{len(bad)} of {m * n} results differ, the first at {bad[0].tolist()}"
    with open("stats.json", "w") as f:
        json.dump(stats, f)
