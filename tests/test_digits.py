"""The digits example: int8 on the core keeps the float model's accuracy."""
from tpugen import CoreConfig
from tpugen.examples.digits import run_digits


def test_int8_on_the_core_matches_numpy_and_keeps_accuracy():
    result = run_digits(CoreConfig(rows=8, cols=8, scratchpad_kib=16, accumulator_kib=8),
                        samples=120)
    assert result.core_matches_host  # the core is bit-exact, so predictions are identical
    assert result.float_accuracy > 0.9
    assert result.int8_core_accuracy >= result.float_accuracy - 0.03
