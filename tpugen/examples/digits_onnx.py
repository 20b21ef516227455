"""Digits classifiers as ONNX models, quantized by onnxruntime's static quantizer and run by
`tpugen.onnx.InferenceSession` on the simulated core, beside onnxruntime on the same model.
``python -m tpugen.examples.digits_onnx [--model mlp|cnn] [--format QDQ|QOperator]``.

- mlp: `digits.train_mlp`'s 64-32-10 MLP as Gemm, Relu, Gemm.
- cnn: Conv 3x3 (8 channels) + ReLU + 2x2 MaxPool, Conv 3x3 (32) + ReLU + MaxPool, Flatten,
  Gemm. The conv filters are fixed random (He scaled, seeded) and only the classifier is
  fitted, by sklearn's RidgeClassifier on their features: no training framework needed.
"""
import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import CoreConfig
from .digits import split_digits, train_mlp

__all__ = ["DigitsOnnxResult", "MODELS", "digits_cnn", "digits_mlp", "quantize_digits",
           "run_digits_onnx"]


@dataclass(frozen=True)
class DigitsOnnxResult:
    float_accuracy: float
    """The float ONNX model on onnxruntime."""
    onnxruntime_accuracy: float
    """The quantized model on onnxruntime."""
    core_accuracy: float
    """The same quantized model on `tpugen.onnx.InferenceSession` and the core."""
    same_predictions: float
    """The fraction of test images both int8 runs classify alike."""
    samples: int
    report: object


def _onnx_model(nodes, weights, input_shape, output="logits"):
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "digits", [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def digits_mlp(samples=360, seed=0):
    """(float ONNX model, (x_train, x_test, y_train, y_test)): `train_mlp`'s MLP as Gemm and
    Relu nodes, input (N, 64)."""
    from onnx import helper

    model, *split = train_mlp(samples, seed=seed)
    nodes, weights, previous = [], {}, "input"
    layers = list(zip(model.coefs_, model.intercepts_))
    for index, (w, b) in enumerate(layers):
        gemm = "logits" if index == len(layers) - 1 else f"fc{index}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{index}", f"b{index}"], [gemm],
                                      name=f"fc{index}"))
        weights.update({f"w{index}": w, f"b{index}": b})
        previous = gemm
        if gemm != "logits":
            previous = f"relu{index}"
            nodes.append(helper.make_node("Relu", [gemm], [previous], name=previous))
    return _onnx_model(nodes, weights, [None, 64]), split


def digits_cnn(samples=360, seed=0, channels=(8, 32)):
    """(float ONNX model, (x_train, x_test, y_train, y_test)): the random-filter CNN of the
    module docstring, its classifier fitted on the training images; input (N, 1, 8, 8)."""
    import onnxruntime
    from onnx import helper
    from sklearn.linear_model import RidgeClassifier

    x_train, x_test, y_train, y_test = split_digits(samples, seed)
    x_train, x_test = (x.reshape(-1, 1, 8, 8) for x in (x_train, x_test))
    rng = np.random.default_rng(seed)
    weights, nodes, previous = {}, [], "input"
    for index, (fan_in, out) in enumerate(zip((1,) + channels[:-1], channels), start=1):
        weights[f"w{index}"] = rng.normal(size=(out, fan_in, 3, 3)) * np.sqrt(2 / (9 * fan_in))
        nodes += [helper.make_node("Conv", [previous, f"w{index}"], [f"c{index}"],
                                   pads=[1, 1, 1, 1], name=f"conv{index}"),
                  helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}"),
                  helper.make_node("MaxPool", [f"r{index}"], [f"p{index}"],
                                   kernel_shape=[2, 2], strides=[2, 2], name=f"pool{index}")]
        previous = f"p{index}"
    nodes.append(helper.make_node("Flatten", [previous], ["features"], name="flatten"))
    features = onnxruntime.InferenceSession(
        _onnx_model(nodes, weights, [None, 1, 8, 8], "features").SerializeToString(),
        providers=["CPUExecutionProvider"])
    classifier = RidgeClassifier().fit(
        features.run(None, {"input": x_train.astype(np.float32)})[0], y_train)
    weights.update(g=classifier.coef_, gb=classifier.intercept_)
    nodes.append(helper.make_node("Gemm", ["features", "g", "gb"], ["logits"], transB=1,
                                  name="fc"))
    return _onnx_model(nodes, weights, [None, 1, 8, 8]), (x_train, x_test, y_train, y_test)


MODELS = {"mlp": digits_mlp, "cnn": digits_cnn}


def quantize_digits(onnx_model, calibration, form="QDQ"):
    """``onnx_model`` quantized to int8 by onnxruntime on ``calibration`` images (float32),
    weights per channel in 7 bits (``reduce_range``: onnxruntime's int8 kernels saturate with
    full-range weights on x86 CPUs without VNNI)."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"input": calibration}])

        def get_next(self):
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as directory:
        source, target = Path(directory) / "float.onnx", Path(directory) / "int8.onnx"
        onnx.save(onnx_model, source)
        quantize_static(str(source), str(target), Calibration(), quant_format=QuantFormat[form],
                        per_channel=True, reduce_range=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        return onnx.load(str(target))


def run_digits_onnx(model="mlp", form="QDQ", samples=360, seed=0,
                    config=CoreConfig(rows=8, cols=8, scratchpad_kib=16, accumulator_kib=8)):
    """The ``model`` of `MODELS`, quantized in ``form``, on onnxruntime and on a `SimDevice`
    of ``config`` (by default tests/test_digits.py's 8x8 core)."""
    import onnxruntime

    from ..firmware import SimDevice
    from ..onnx import InferenceSession

    float_model, (x_train, x_test, _, y_test) = MODELS[model](samples, seed)
    quantized = quantize_digits(float_model, x_train.astype(np.float32), form)
    feeds = {"input": x_test.astype(np.float32)}

    def classify(onnx_model):
        session = onnxruntime.InferenceSession(onnx_model.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        return session.run(["logits"], feeds)[0].argmax(axis=1)

    theirs = classify(quantized)
    with SimDevice(config) as device:
        session = InferenceSession(quantized, device)
        ours = session.run(["logits"], feeds)[0].argmax(axis=1)
    return DigitsOnnxResult(
        float_accuracy=float(np.mean(classify(float_model) == y_test)),
        onnxruntime_accuracy=float(np.mean(theirs == y_test)),
        core_accuracy=float(np.mean(ours == y_test)),
        same_predictions=float(np.mean(ours == theirs)), samples=samples,
        report=session.report())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--format", choices=["QDQ", "QOperator"], default="QDQ")
    parser.add_argument("--samples", type=int, default=360)
    parser.add_argument("--report", type=Path, help="write the per-node report as JSON here")
    parser.add_argument("--plot", type=Path, help="write a plot of time per node here (PNG)")
    args = parser.parse_args(argv)
    result = run_digits_onnx(args.model, args.format, args.samples)
    print(f"digits {args.model}, {result.samples} test images, ONNX {args.format} int8, "
          "8x8 core")
    print(f"  float model                 {result.float_accuracy:.1%}")
    print(f"  int8 on onnxruntime         {result.onnxruntime_accuracy:.1%}")
    print(f"  int8 on tpu_core (tpugen)   {result.core_accuracy:.1%}  "
          f"(same prediction as onnxruntime on {result.same_predictions:.1%})")
    print(result.report)
    if args.report:
        args.report.write_text(result.report.to_json())
    if args.plot:
        result.report.plot(args.plot)


if __name__ == "__main__":
    main()
