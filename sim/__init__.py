"""tpugen.sim: the simulation backend, and the verification code beside it.

`BACKEND` is what the product runs: `SimDevice` and the simulated board (Verilator builds,
the cocotb side of a session, the memory models), the CLI's waveforms, and the numpy golden
models the demo and the benchmarks check against. `VERIFICATION` is for the tests only (the
fuzz model, the formal harnesses, the AXI checker, the fault, hostile and amaranth.sim
memories, the testbenches). The backend never imports verification code:
``tests/test_arch.py`` checks both lists and that.
"""
from .device import SimDevice

__all__ = ["BACKEND", "SimDevice", "VERIFICATION"]

BACKEND = ("attention_model", "axi_bursts", "board_sim", "core_driver", "device", "golden",
           "gtkw", "latency_ram", "session", "softmax_model", "speed", "system_driver", "tb_board",
           "tb_device", "tb_speed", "vcd_window", "verilator")
"""Modules of the simulation backend."""

VERIFICATION = ("axi_checker", "fault_memory", "formal", "fuzz", "fuzz_model", "hostile_ram",
                "icarus", "pysim_axi", "pysim_axil", "register_model", "tb_array",
                "tb_compliance", "tb_core", "tb_faults", "tb_fuzz", "tb_limits", "testbench")
"""Modules for verification only."""
