import gc
import warnings

import pytest

from tpugen.sim.verilator import run_testbench


@pytest.fixture
def run_tb(tmp_path):
    """Run a cocotb testbench module on the cached model of ``config``; returns its stats."""
    def run(config, module, params, design="systolic_array", testcase=None):
        return run_testbench(config, module, params, tmp_path, design=design, testcase=testcase)
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
