"""The pytest runner of matmul_tb.py, in the style of cocotb's examples/matrix_multiplier:
``pytest examples/matmul_tb`` builds the generated core with Verilator (cached) and runs the
cocotb module against it."""
import pytest

from tpugen import PRESETS
from tpugen.sim.verilator import build_model


@pytest.mark.parametrize("preset", ["micro"])  # the UP5K core; any preset or CoreConfig works
def test_matmul_tb(preset, tmp_path):
    config = PRESETS[preset]
    model = build_model(config, "tpu_core")
    model.run("matmul_tb", tmp_path, env={"TPUGEN_CONFIG": config.to_json()})
