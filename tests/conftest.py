import pytest

from tpugen.sim.verilator import run_testbench


@pytest.fixture
def run_tb(tmp_path):
    """Run a cocotb testbench module on the cached model of ``config``; returns its stats."""
    def run(config, module, params, design="systolic_array", testcase=None):
        return run_testbench(config, module, params, tmp_path, design=design, testcase=testcase)
    return run
