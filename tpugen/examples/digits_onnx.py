"""Digits classifiers as ONNX models, quantized by onnxruntime's static quantizer and run by
`tpugen.onnx.InferenceSession` on the simulated core, beside onnxruntime on the same model.
``python -m tpugen.examples.digits_onnx [--model mlp|cnn|transformer] [--format QDQ|QOperator]``
runs the committed models (`MODEL_DIR`); ``--write-models`` trains, exports and quantizes
them again (the same bytes: every step is seeded).

- mlp: `digits.train_mlp`'s 64-32-10 MLP as Gemm, Relu, Gemm.
- cnn: Conv 3x3 (8 channels) + ReLU + 2x2 MaxPool, Conv 3x3 (32) + ReLU + MaxPool, Flatten,
  Gemm. The conv filters are fixed random (He scaled, seeded) and only the classifier is
  fitted, by sklearn's RidgeClassifier on their features: no training framework needed.
- transformer: the encoder block of `digits_transformer_onnx`, trained in numpy.
"""
import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import CoreConfig
from .digits import split_digits, train_mlp
from .digits_transformer_onnx import digits_transformer

__all__ = ["DIGITS_CONFIG", "DigitsOnnxResult", "FORMS", "MODELS", "MODEL_DIR", "QUANTIZE_OPTIONS",
           "classify_onnxruntime", "describe", "digits_cnn", "digits_feeds", "digits_mlp",
           "digits_test_set", "evaluate", "float_model_path", "model_path", "onnx_model",
           "quantize_digits", "run_digits_onnx", "write_models"]

DIGITS_TEST_SAMPLES = 360
"""Test images of the split the models are fitted beside (the rest are for training)."""
DIGITS_CONFIG = CoreConfig()
"""The simulated core of the example: the default 8x8 configuration."""


@dataclass(frozen=True)
class DigitsOnnxResult:
    float_accuracy: float | None
    """The float ONNX model on onnxruntime (None: not given)."""
    onnxruntime_accuracy: float
    """The quantized model on onnxruntime."""
    core_accuracy: float
    """The same quantized model on `tpugen.onnx.InferenceSession` and the core."""
    same_predictions: float
    """The fraction of test images both int8 runs classify alike."""
    samples: int
    report: object


def onnx_model(nodes, weights, input_shape, output="logits"):
    """A float model of ``nodes``, initializers ``weights`` (floats as float32), the graph's
    input "input" of ``input_shape`` and output ``output``, opset 17."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "digits", [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32 if np.asarray(v).dtype.kind == "f"
                                     else None), k) for k, v in weights.items()])
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
    return onnx_model(nodes, weights, [None, 64]), split


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
        onnx_model(nodes, weights, [None, 1, 8, 8], "features").SerializeToString(),
        providers=["CPUExecutionProvider"])
    classifier = RidgeClassifier().fit(
        features.run(None, {"input": x_train.astype(np.float32)})[0], y_train)
    weights.update(g=classifier.coef_, gb=classifier.intercept_)
    nodes.append(helper.make_node("Gemm", ["features", "g", "gb"], ["logits"], transB=1,
                                  name="fc"))
    return onnx_model(nodes, weights, [None, 1, 8, 8]), (x_train, x_test, y_train, y_test)


MODELS = {"mlp": digits_mlp, "cnn": digits_cnn, "transformer": digits_transformer}
"""The model builders (each returns (float ONNX model, split)), by name."""
QUANTIZE_OPTIONS = {"transformer": {"ActivationSymmetric": True}}
"""onnxruntime quantizer extra_options by model: the transformer's activations symmetric (zero
points 0), so that without a softmax unit its q k^T and probs v still run on the core."""
FORMS = ("QDQ", "QOperator")
MODEL_DIR = Path(__file__).parent / "models"
"""The committed models: ``digits_<name>.onnx`` (float) and ``digits_<name>.<form>.onnx``."""


def model_path(name, form=None, directory=MODEL_DIR):
    """The file of model ``name`` in ``directory`` (the committed ones by default): the float
    model, or quantized in ``form``."""
    if name not in MODELS:
        raise ValueError(f"model={name!r} is invalid: allowed {', '.join(MODELS)}")
    if form is not None and form not in FORMS:
        raise ValueError(f"form={form!r} is invalid: allowed {', '.join(FORMS)}")
    return Path(directory) / f"digits_{name}{'' if form is None else '.' + form.lower()}.onnx"


def float_model_path(path):
    """The float model beside quantized model file ``path`` (``x.qdq.onnx`` -> ``x.onnx``),
    or None when there is none."""
    path = Path(path)
    stem, dot, form = path.name.removesuffix(".onnx").rpartition(".")
    candidate = path.with_name(f"{stem}.onnx")
    return candidate if dot and form in {f.lower() for f in FORMS} and candidate.is_file() \
        else None


def write_models(names=tuple(MODELS), seed=0, directory=MODEL_DIR):
    """Train, export and quantize the ``names`` models and write them to ``directory`` (the
    committed ones by default)."""
    import onnx

    Path(directory).mkdir(exist_ok=True)
    for name in names:
        float_model, (x_train, *_) = MODELS[name](DIGITS_TEST_SAMPLES, seed)
        onnx.save(float_model, model_path(name, directory=directory))
        for form in FORMS:
            onnx.save(quantize_digits(float_model, x_train.astype(np.float32), form,
                                      **QUANTIZE_OPTIONS.get(name, {})),
                      model_path(name, form, directory))


def quantize_digits(onnx_model, calibration, form="QDQ", **extra):
    """``onnx_model`` quantized to int8 by onnxruntime on ``calibration`` images (float32),
    weights per channel in 7 bits (``reduce_range``: onnxruntime's int8 kernels saturate with
    full-range weights on x86 CPUs without VNNI); ``extra``: the quantizer's extra_options."""
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
                        weight_type=QuantType.QInt8, extra_options=extra)
        return onnx.load(str(target))


def digits_test_set(samples=None):
    """(images (N, 64) float32 in 0..1, labels) of the test split the models were fitted
    beside (`split_digits` of `DIGITS_TEST_SAMPLES`, seed 0): the first ``samples`` (all
    when None)."""
    _, x_test, _, y_test = split_digits(DIGITS_TEST_SAMPLES, 0)
    if samples is not None and (not isinstance(samples, int) or not
                                1 <= samples <= DIGITS_TEST_SAMPLES):
        raise ValueError(f"samples={samples!r} is invalid: allowed 1..{DIGITS_TEST_SAMPLES}")
    return x_test[:samples].astype(np.float32), y_test[:samples]


def _input_shape(model, count):
    """The shape of ``count`` digits images as ``model``'s input (N, 64), (N, 1, 8, 8), ..."""
    (graph_input,) = [i for i in model.graph.input
                      if i.name not in {t.name for t in model.graph.initializer}]
    dims = [d.dim_value for d in graph_input.type.tensor_type.shape.dim][1:]
    if not all(dims) or int(np.prod(dims)) != 64:
        raise ValueError(f"model input {graph_input.name!r} {['N', *dims]} does not hold an "
                         "8x8 digits image per sample")
    return graph_input.name, (count, *dims)


def classify_onnxruntime(model, images):
    """The top-1 classes onnxruntime gives ``model`` (`onnx.ModelProto`) for ``images`` (any
    shape with 64 values an image)."""
    import onnxruntime

    name, shape = _input_shape(model, len(images))
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {name: images.reshape(shape)})[0].argmax(axis=-1)


def digits_feeds(model, samples=None):
    """(the feeds of the first ``samples`` digits test images for ``model``, their labels):
    ValueError before any work when ``samples`` or the model's input does not fit."""
    images, labels = digits_test_set(samples)
    name, shape = _input_shape(model, len(images))
    return {name: images.reshape(shape)}, labels


def evaluate(model, device, samples=None, float_model=None):
    """A `DigitsOnnxResult` of quantized ``model`` (a path or `onnx.ModelProto`) on the
    digits test set (its first ``samples``): on ``device`` by `InferenceSession`, on
    onnxruntime, and ``float_model`` (optional) on onnxruntime."""
    import onnx

    from ..onnx import InferenceSession

    load = lambda m: m if isinstance(m, onnx.ModelProto) else onnx.load(str(m))  # noqa: E731
    model = load(model)
    feeds, labels = digits_feeds(model, samples)
    images = next(iter(feeds.values()))
    session = InferenceSession(model, device)
    ours = session.run(None, feeds)[0].argmax(axis=-1)
    theirs = classify_onnxruntime(model, images)
    accuracy = lambda predicted: float(np.mean(predicted == labels))  # noqa: E731
    return DigitsOnnxResult(
        float_accuracy=None if float_model is None else
        accuracy(classify_onnxruntime(load(float_model), images)),
        onnxruntime_accuracy=accuracy(theirs), core_accuracy=accuracy(ours),
        same_predictions=float(np.mean(ours == theirs)), samples=len(images),
        report=session.report())


def run_digits_onnx(model="mlp", form="QDQ", samples=None, config=DIGITS_CONFIG):
    """The committed ``model`` of `MODELS`, quantized in ``form``, on onnxruntime and on a
    `SimDevice` of ``config``: a `DigitsOnnxResult`."""
    from ..sim import SimDevice

    with SimDevice(config) as device:
        return evaluate(model_path(model, form), device, samples, model_path(model))


def describe(result, title):
    """``result`` (`DigitsOnnxResult`) as the lines the example and `tpugen run-model`
    print: the accuracies, then the report."""
    lines = [f"{title}: {result.samples} digits test images"]
    if result.float_accuracy is not None:
        lines.append(f"  float model on onnxruntime   {result.float_accuracy:.1%}")
    lines += [f"  int8 on onnxruntime          {result.onnxruntime_accuracy:.1%}",
              f"  int8 on the core (tpugen)    {result.core_accuracy:.1%}  (same prediction as "
              f"onnxruntime on {result.same_predictions:.1%})",
              str(result.report)]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--format", choices=FORMS, default="QDQ")
    parser.add_argument("--samples", type=int, help="the first N test images (default: all)")
    parser.add_argument("--report", type=Path, help="write the per-node report as JSON here")
    parser.add_argument("--plot", type=Path, help="write a plot of time per node here (PNG)")
    parser.add_argument("--write-models", action="store_true",
                        help=f"train, export, quantize and write the models to {MODEL_DIR}")
    args = parser.parse_args(argv)
    if args.write_models:
        write_models()
        return
    result = run_digits_onnx(args.model, args.format, args.samples)
    print(describe(result, f"digits {args.model}, ONNX {args.format} int8, 8x8 core"))
    if args.report:
        args.report.write_text(result.report.to_json())
    if args.plot:
        result.report.plot(args.plot)


if __name__ == "__main__":
    main()
