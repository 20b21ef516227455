"""`SimDevice`: the runtime's `Device` on a simulated core (Verilator), the simulation backend's
entry point. It lives here, not in firmware/, so imports flow one way: sim/ uses the runtime,
the runtime never uses sim/."""
import shutil
import tempfile
from pathlib import Path

from ..config import CoreConfig, check_config
from ..firmware.device import Device, check_option
from .session import SimTransport, SimulationThread
from .vcd_window import check_window, window_vcd

__all__ = ["SimDevice"]


class SimDevice(Device):
    """A `tpu_core` for ``config`` on Verilator, with ``memory_size`` bytes of memory (default
    64 MiB, or the core's address space if smaller: `CoreConfig.address_width`).

    ``with SimDevice(cfg) as dev:`` builds the model (cached) and starts one simulation that
    serves every call until the block ends. ``memory``: "rtl" (the default), `AxiMemory`
    inside the model (`SimSystem`, ``memory_size`` a power of two): no Python runs per clock
    cycle, 5-6 times faster; or "axiram", cocotbext-axi's AxiRam beside the model, for
    bus-level testing (``backpressure``). ``backpressure`` ("axiram" only)
    pauses the memory's AXI channels at random (fixed ``seed``). ``read_latency``: clock cycles
    from a read request to its data, pipelined; with "axiram" also from a write burst to its
    response (`LatencyAxiRam`), with "rtl" on top of the memory's own cycle (`AxiReadDelay`).
    ``waves``: a path; the whole session is traced there as VCD, or only clock cycles
    ``waves_from`` to ``waves_until`` of it (`sim.vcd_window`; cycle 0 starts with the clock).
    """

    def __init__(self, config=CoreConfig(), *, memory="rtl", memory_size=None,
                 backpressure=False, seed=0, read_latency=0, waves=None, waves_from=None,
                 waves_until=None, start_timeout=600.0):
        check_config(config)
        if memory_size is None:
            memory_size = min(64 << 20, 1 << config.address_width)
        super().__init__(config, memory_size)
        check_window(waves_from, waves_until)
        if waves is None and (waves_from, waves_until) != (None, None):
            raise ValueError("waves_from and waves_until need waves (a path)")
        check_option("read_latency", read_latency, 0, 10_000)
        if memory not in ("axiram", "rtl"):
            raise ValueError(f'memory={memory!r} is invalid: allowed "axiram" or "rtl"')
        if memory == "rtl" and backpressure:
            raise ValueError('backpressure needs memory="axiram"')
        if memory == "rtl" and memory_size & (memory_size - 1):
            raise ValueError(f'memory_size={memory_size!r} is invalid with memory="rtl": '
                             "allowed a power of two")
        self.memory = memory
        self.backpressure = backpressure
        self.read_latency = read_latency
        self.seed = seed
        self.waves = Path(waves) if waves is not None else None
        self.waves_window = (waves_from, waves_until)
        self.start_timeout = start_timeout

    def __enter__(self):
        from .verilator import build_model  # loads the HDL generator: only when a model is built

        waves = self.waves is not None
        if self.memory == "rtl":
            model = build_model(self.config, "sim_system", waves=waves,
                                memory_kib=self.memory_size >> 10,
                                read_latency=self.read_latency)
        else:
            model = build_model(self.config, "tpu_core", waves=waves)
        self.build_seconds = model.build_seconds
        self._tmp = tempfile.TemporaryDirectory(prefix="tpugen-device-")
        self._simulation = SimulationThread(
            model, "tpugen.sim.tb_device", Path(self._tmp.name),
            {"config": self.config.to_json(), "memory_size": self.memory_size,
             "backpressure": self.backpressure, "seed": self.seed,
             "read_latency": self.read_latency, "memory": self.memory},
            waves=waves)
        self._transport = SimTransport(self._simulation.connect(self.start_timeout),
                                       self._simulation)
        return self

    def __exit__(self, *exc_info):
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._simulation.join()
        trace = Path(self._tmp.name) / "sim" / "dump.vcd"
        if self.waves is not None and self.waves_window == (None, None):
            shutil.copyfile(trace, self.waves)
        elif self.waves is not None:
            window_vcd(trace, self.waves, *self.waves_window)
        self._tmp.cleanup()
        return False
