import gc
import warnings
from pathlib import Path

import pytest

from tpugen.sim.verilator import run_testbench


@pytest.fixture
def run_tb(tmp_path):
    """Run a cocotb testbench module on the cached model of ``config``; returns its stats.

    A run of the whole core must have been watched by the AXI checker (sim/axi_checker.py):
    no error, and a handshake on every channel (a checker that saw nothing checked nothing)."""
    def run(config, module, params, design="systolic_array", testcase=None):
        stats = run_testbench(config, module, params, tmp_path, design=design, testcase=testcase)
        if design == "tpu_core":
            axi = stats["axi"]
            assert axi["errors"] == [], f"AXI checker: {axi['error_count']} errors"
            assert all(axi["handshakes"].values()), f"AXI checker saw {axi['handshakes']}"
        return stats
    return run


@pytest.fixture
def refuses():
    """``refuses(make, match)``: ``make()`` raises ValueError matching ``match``. The component
    it half built is never elaborated; its UnusedElaboratable warning is silenced here."""
    def check(make, match):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError, match=match) as info:
                make()
            del info
            gc.collect()
    return check


TIERS = {
    "unit": "pure Python: models, compilers, the CLI, Verilog generation (seconds)",
    "pysim": "amaranth.sim simulations of single blocks",
    "verilator": "cocotb on Verilator: the whole core, SimDevice, boards over UART",
    "formal": "SymbiYosys proofs",
    "fpga": "yosys synthesis and nextpnr builds",
    "dask": "dask.distributed clusters of local processes (the sweep, with its synthesis faked)",
}
"""Test tiers, one pytest marker each: ``pytest -m unit`` is a loop of seconds."""

FILE_TIERS = {
    "pysim": {"test_array_pysim", "test_axi_memory_pysim", "test_c_driver", "test_csr_pysim",
              "test_controller_pysim", "test_dma_pysim", "test_epilogue_pysim", "test_execute_pysim",
              "test_im2col_pysim", "test_pe_multipliers", "test_softmax_pysim",
              "test_uart_bridge_pysim"},
    "verilator": {"test_array_verilator", "test_attention", "test_axi_compliance",
                  "test_board_sim", "test_configs_verilator", "test_core_verilator",
                  "test_device", "test_digits", "test_faults_verilator", "test_fuzz_verilator",
                  "test_latency_ram", "test_limits_verilator", "test_portability",
                  "test_profiles", "test_sim_speed", "test_matmul_tb"},
    "formal": {"test_formal"},
    "fpga": {"test_fpga_build", "test_synthesis"},
}
"""The tier of each test file that is not ``unit``; a test may name its own tier instead."""


def pytest_configure(config):
    for name, text in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(items):
    for item in items:
        if not any(item.get_closest_marker(name) for name in TIERS):
            module = Path(str(item.fspath)).stem
            tier = next((t for t, files in FILE_TIERS.items() if module in files), "unit")
            item.add_marker(getattr(pytest.mark, tier))
