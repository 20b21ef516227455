"""The digits MLP as an ONNX model, quantized by onnxruntime's static quantizer and run by
`tpugen.onnx.InferenceSession` on the simulated core, beside onnxruntime on the same model.
``python -m tpugen.examples.digits_onnx [--format QDQ|QOperator] [--report FILE.json]``."""
import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import CoreConfig
from .digits import train_mlp

__all__ = ["DigitsOnnxResult", "mlp_to_onnx", "quantize_digits", "run_digits_onnx"]


@dataclass(frozen=True)
class DigitsOnnxResult:
    float_accuracy: float
    onnxruntime_accuracy: float
    """The quantized model on onnxruntime."""
    core_accuracy: float
    """The same quantized model on `tpugen.onnx.InferenceSession` and the core."""
    same_predictions: float
    """The fraction of test images both int8 runs classify alike."""
    samples: int
    report: object


def mlp_to_onnx(model):
    """An sklearn `MLPClassifier` with ReLU hidden layers as an ONNX graph of Gemm and Relu:
    input "input" (N, features) float, output "logits" (N, classes)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, weights, previous = [], [], "input"
    layers = list(zip(model.coefs_, model.intercepts_))
    for index, (w, b) in enumerate(layers):
        last = index == len(layers) - 1
        gemm = "logits" if last else f"fc{index}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{index}", f"b{index}"], [gemm],
                                      name=f"fc{index}"))
        weights += [numpy_helper.from_array(w.astype(np.float32), f"w{index}"),
                    numpy_helper.from_array(b.astype(np.float32), f"b{index}")]
        previous = gemm
        if not last:
            nodes.append(helper.make_node("Relu", [gemm], [f"relu{index}"], name=f"relu{index}"))
            previous = f"relu{index}"
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, layers[0][0].shape[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], weights)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    return onnx_model


def quantize_digits(onnx_model, calibration, form="QDQ"):
    """``onnx_model`` quantized to int8 by onnxruntime on ``calibration`` images (float32
    (N, 64)), weights per channel in 7 bits (``reduce_range``: onnxruntime's int8 kernels
    saturate with full-range weights on x86 CPUs without VNNI)."""
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


def run_digits_onnx(config=CoreConfig(rows=8, cols=8, scratchpad_kib=16, accumulator_kib=8),
                    samples=360, form="QDQ", seed=0):
    import onnxruntime

    from ..firmware import SimDevice
    from ..onnx import InferenceSession

    model, x_train, x_test, _, y_test = train_mlp(samples, seed=seed)
    quantized = quantize_digits(mlp_to_onnx(model), x_train.astype(np.float32), form)
    feeds = {"input": x_test.astype(np.float32)}
    reference = onnxruntime.InferenceSession(quantized.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    (theirs,) = reference.run(["logits"], feeds)
    with SimDevice(config) as device:
        session = InferenceSession(quantized, device)
        (ours,) = session.run(["logits"], feeds)
    ours, theirs = ours.argmax(axis=1), theirs.argmax(axis=1)
    return DigitsOnnxResult(
        float_accuracy=float(model.score(x_test, y_test)),
        onnxruntime_accuracy=float(np.mean(theirs == y_test)),
        core_accuracy=float(np.mean(ours == y_test)),
        same_predictions=float(np.mean(ours == theirs)), samples=samples,
        report=session.report())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=360)
    parser.add_argument("--format", choices=["QDQ", "QOperator"], default="QDQ")
    parser.add_argument("--report", type=Path, help="write the per-node report as JSON here")
    parser.add_argument("--plot", type=Path, help="write a plot of time per node here (PNG)")
    args = parser.parse_args(argv)
    result = run_digits_onnx(samples=args.samples, form=args.format)
    print(f"digits, {result.samples} test images, 64-32-10 MLP, ONNX {args.format} int8")
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
