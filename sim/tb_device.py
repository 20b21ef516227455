"""The simulator side of `SimDevice`: a cocotb test that serves `SimTransport` requests.

TPUGEN_TB carries the config, the memory options, and the host's socket address and key. With
``memory`` "rtl" the model is a `SimSystem` (memory inside it), else a `tpu_core` on AxiRam.
"""
from functools import partial

import cocotb
from cocotbext.axi import AxiRam

from tpugen import CoreConfig

from .core_driver import CoreDriver
from .latency_ram import LatencyAxiRam
from .session import connect_to_host
from .system_driver import SystemDriver


@cocotb.test()
async def serve(dut):
    params, connection = connect_to_host()
    cfg = CoreConfig.from_json(params["config"])
    latency = params["read_latency"]
    if params["memory"] == "rtl":
        core = SystemDriver(dut, cfg)
    else:
        ram_class = partial(LatencyAxiRam, read_latency=latency) if latency else AxiRam
        core = CoreDriver(dut, cfg, memory_size=params["memory_size"],
                          backpressure=params["backpressure"], seed=params["seed"],
                          ram_class=ram_class)
    await core.reset()

    with connection:
        while (request := connection.recv()) is not None:
            kind, *args = request
            if kind == "write_memory":
                core.ram.write(*args)
            elif kind == "read_memory":
                connection.send(core.ram.read(*args))
            elif kind == "write_register":
                await core.write_register(*args)
            elif kind == "read_registers":
                connection.send(await core.read_registers(*args))
            else:
                connection.send(await core.wait_interrupt(*args))
