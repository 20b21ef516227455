import json

import pytest

from tpugen.sim.verilator import build_model


@pytest.fixture
def run_tb(tmp_path):
    """Run a cocotb testbench module on the cached model of ``config``; returns its stats.json."""
    def run(config, module, params, design="systolic_array"):
        model = build_model(config, design)
        model.run(module, tmp_path, env={"TPUGEN_TB": json.dumps({"config": config.to_json(),
                                                                   **params})})
        return json.loads((tmp_path / "stats.json").read_text())
    return run
