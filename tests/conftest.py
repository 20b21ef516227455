import gc
import warnings

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
