"""cocotb module: the fuzz cases of `sim/fuzz.py` on the core, one after another in one session.

TPUGEN_TB (JSON) carries ``config``, ``cases`` (the path of a JSON list of cases), ``seed``,
``backpressure`` and ``slack`` (the cycle bound of a case is ``slack`` times its model's
bound, unless the case gives its own ``bound``). The memory is a `LatencyAxiRam`; a case may
set its own ``timing``: ``stall``, the probability that each AXI channel of the memory pauses
in a cycle (instead of ``backpressure``'s 0.3 for every case), and ``latency``, the (least,
most) cycles from a burst to its data or response, drawn per burst. What the core did with
each case goes to stats.json; tests/test_fuzz_verilator.py compares it with the case. The core
is soft reset after an error, after an outcome the case does not allow (so the next case starts
clean), and when the case asks for it; a case that does not end within its bound stops the
session.
"""
import itertools
import json
import os
import random
from functools import partial
from pathlib import Path

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge, SimTimeoutError, with_timeout

from tpugen import CoreConfig

from ..registers import register
from ..isa import ErrorCode
from .axi_checker import AxiChecker
from .core_driver import CoreDriver
from .fuzz_model import MEMORY_SIZE
from .latency_ram import LatencyAxiRam

CLOCK_NS = 10


def _set_timing(core, timing, rng):
    """Pause every AXI channel of the memory with probability ``timing["stall"]`` a cycle and
    answer each burst ``timing["latency"]`` (least, most) cycles late."""
    ram = core.ram
    for channel in (ram.write_if.aw_channel, ram.write_if.w_channel, ram.write_if.b_channel,
                    ram.read_if.ar_channel, ram.read_if.r_channel):
        channel.set_pause_generator(itertools.cycle(
            [rng.random() < timing["stall"] for _ in range(997)]))
    ram.read_if.latency = ram.write_if.latency = tuple(timing["latency"])


async def _run(core, case, slack, rng):
    """Run one case; its outcome as plain data."""
    dut = core.dut
    if "timing" in case:
        _set_timing(core, case["timing"], rng)
    core.ram.mem.clear()
    for offset, data in case["memory"]:
        core.ram.write(offset, bytes.fromhex(data))
    windows = [tuple(w) for w in case["windows"]]
    if windows != core.windows:
        await core.set_windows(windows)
    outcome = {"irq_before": int(dut.irq.value)}  # before `prepare` clears stale causes
    await core.write("WATCHDOG", case["watchdog"])
    await core.prepare(case["program_base"], case["program_length"])
    seen = len(core.checker.errors)
    started = get_sim_time("ns")
    await core.launch()
    try:
        bound = case.get("bound", slack * case["cycles"])
        await with_timeout(RisingEdge(dut.irq), bound * CLOCK_NS, "ns")
    except SimTimeoutError:
        return {**outcome, "hang": True, "status": await core.read("STATUS"),
                "checker": core.checker.errors[seen:]}
    outcome["latency"] = int((get_sim_time("ns") - started) // CLOCK_NS)
    status = register("STATUS").fields_of(await core.read("STATUS"))
    outcome.update({
        "hang": False, "busy": int(status.busy), "done": int(status.done),
        "error_bit": int(status.error),
        "error": ErrorCode(await core.read("ERROR_CODE")).name,
        "index": await core.read("ERROR_INDEX"),
        "cycles": await core.read("CYCLES_LO"),
        "irq_status": await core.read("IRQ_STATUS"),
    })
    await core.write("IRQ_STATUS", register("IRQ_STATUS").mask)
    outcome["irq_after_ack"] = int(dut.irq.value)
    outcome["check"] = [core.ram.read(address, len(content) // 2).hex()
                        for address, content in case["check"]]
    ended = [outcome["error"], None if outcome["error"] == "NONE" else outcome["index"]]
    if outcome["error"] != "NONE" or case["soft_reset"] or ended not in case["expect"]:
        await core.soft_reset()
        outcome["status_after_reset"] = await core.read("STATUS")
    outcome["checker"] = core.checker.errors[seen:]
    return outcome


@cocotb.test()
async def fuzz(dut):
    """Every case: start, wait for the interrupt (bounded), record the outcome."""
    params = json.loads(os.environ["TPUGEN_TB"])
    config = CoreConfig.from_json(params["config"])
    cases = json.loads(Path(params["cases"]).read_text())
    core = CoreDriver(dut, config, memory_size=MEMORY_SIZE, backpressure=params["backpressure"],
                      seed=params["seed"], checker=AxiChecker,
                      ram_class=partial(LatencyAxiRam, read_latency=0))
    rng = random.Random(params["seed"])
    await core.reset()
    await core.write("IRQ_ENABLE", 1)
    outcomes = []
    for case in cases:
        outcomes.append(await _run(core, case, params["slack"], rng))
        if outcomes[-1]["hang"]:
            break
    core.write_stats({"programs": len(outcomes), "outcomes": outcomes})

