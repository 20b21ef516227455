"""A small MLP on scikit-learn's bundled digits (8x8 images), quantized to int8 and run layer
by layer on the simulated core. ``python -m tpugen.examples.digits``.

Each layer's int8 x int8 products run on the core (int32 accumulators); bias, ReLU and the
requantization to int8 for the next layer run on the host until the fused epilogue lands.
"""
import argparse
from dataclasses import dataclass

import numpy as np

from ..config import CoreConfig

__all__ = ["DigitsResult", "run_digits", "split_digits", "train_mlp"]


@dataclass(frozen=True)
class DigitsResult:
    float_accuracy: float
    int8_host_accuracy: float
    """The same int8 arithmetic in numpy: what the core must reproduce exactly."""
    int8_core_accuracy: float
    samples: int
    core_matches_host: bool
    cycles: int


def _symmetric_scale(values):
    return float(np.max(np.abs(values))) / 127 or 1.0


def _quantize(values, scale):
    return np.clip(np.round(values / scale), -128, 127).astype(np.int8)


def split_digits(samples=360, seed=0):
    """(x_train, x_test, y_train, y_test): sklearn's digits, ``samples`` of them for testing,
    pixels (N, 64) scaled to 0..1."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    return train_test_split(digits.data / 16.0, digits.target, test_size=samples,
                            random_state=seed)


def train_mlp(samples=360, hidden=32, seed=0):
    """(model, x_train, x_test, y_train, y_test): the float MLP trained on `split_digits`."""
    from sklearn.neural_network import MLPClassifier

    x_train, x_test, y_train, y_test = split_digits(samples, seed)
    model = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=1000, random_state=seed)
    model.fit(x_train, y_train)
    return model, x_train, x_test, y_train, y_test


def run_digits(config=CoreConfig(), samples=360, hidden=32, seed=0):
    from ..sim import SimDevice
    from ..sim.golden import matmul_int32

    model, x_train, x_test, y_train, y_test = train_mlp(samples, hidden, seed)
    float_accuracy = float(model.score(x_test, y_test))

    (w1, w2), (b1, b2) = model.coefs_, model.intercepts_
    x_scale, w1_scale, w2_scale = 1 / 127, _symmetric_scale(w1), _symmetric_scale(w2)
    hidden_scale = _symmetric_scale(np.maximum(x_train @ w1 + b1, 0))
    x_q, w1_q, w2_q = _quantize(x_test, x_scale), _quantize(w1, w1_scale), _quantize(w2, w2_scale)

    def requantize(acc):
        real = acc * (x_scale * w1_scale) + b1
        return _quantize(np.maximum(real, 0), hidden_scale)

    def classify(matmul):
        h = requantize(matmul(x_q, w1_q))
        return np.argmax(matmul(h, w2_q) * (hidden_scale * w2_scale) + b2, axis=1)

    host = classify(matmul_int32)
    with SimDevice(config) as dev:
        cycles = 0

        def on_core(a, b):
            nonlocal cycles
            result = dev.matmul(a, b)
            cycles += dev.stats.cycles
            return result

        core = classify(on_core)
    return DigitsResult(float_accuracy=float_accuracy,
                        int8_host_accuracy=float(np.mean(host == y_test)),
                        int8_core_accuracy=float(np.mean(core == y_test)), samples=samples,
                        core_matches_host=bool(np.array_equal(core, host)), cycles=cycles)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=360)
    args = parser.parse_args(argv)
    result = run_digits(samples=args.samples)
    print(f"digits, {result.samples} test images, 64-32-10 MLP")
    print(f"  float model           {result.float_accuracy:.1%}")
    print(f"  int8 on tpu_core      {result.int8_core_accuracy:.1%}  ({result.cycles} cycles; "
          f"{'identical to' if result.core_matches_host else 'DIFFERENT from'} numpy int8)")


if __name__ == "__main__":
    main()
