"""The simulator side of `SimDevice`: a cocotb test that serves jobs from the host process.

A job is plain data: memory writes, access windows, a program and the reads to return; all the
firmware logic stays in the host. TPUGEN_TB carries the config, the socket address and the
key (hex), and the memory options.
"""
import json
import os
from multiprocessing.connection import Client

import cocotb

from tpugen import CoreConfig

from .core_driver import CoreDriver


@cocotb.test()
async def serve(dut):
    params = json.loads(os.environ["TPUGEN_TB"])
    cfg = CoreConfig.from_json(params["config"])
    core = CoreDriver(dut, cfg, memory_size=params["memory_size"],
                      backpressure=params["backpressure"], seed=params["seed"], monitor=False)
    await core.reset()
    with Client(params["address"], authkey=bytes.fromhex(params["key"])) as connection:
        while (job := connection.recv()) is not None:
            for address, data in job["writes"]:
                core.ram.write(address, data)
            await core.set_windows(job["windows"])
            result = await core.run(job["program"], job["program_address"],
                                    timeout_cycles=job["timeout_cycles"])
            connection.send({
                "done": result.done, "error": result.error.name, "error_index": result.error_index,
                "counters": result.counters,
                "reads": [core.ram.read(address, size) for address, size in job["reads"]],
            })
            if not result.done:
                await core.soft_reset()
    with open("stats.json", "w") as f:
        json.dump({}, f)
