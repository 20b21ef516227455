"""ONNX import (tpugen.onnx): quantized models from onnxruntime's quantizer, run on the core
(and on a numpy stand-in for it), against onnxruntime on the same quantized model."""
import itertools
import json
import os
import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from tpugen import CoreConfig
from tpugen.firmware.device import Resident
from tpugen.onnx import AttentionLayer, CoreLayer, InferenceSession, lower, requant_multiplier
from tpugen.sim.attention_model import attention_int8_model
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32

CORE = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
"""tests/test_device.py's core: its Verilator model is already built by the suite."""
NO_SOFTMAX = replace(CORE, softmax=False)


class NumpyDevice:
    """The Device API's matmul / conv2d on the numpy golden models, with stats of one cycle
    per MAC of the array (so no simulator is needed for the lowering math)."""

    def __init__(self, config=CORE):
        self.config = config
        self.stats = None
        self.memory = {}
        self._regions = itertools.count()

    def _done(self, macs, result):
        self.stats = SimpleNamespace(cycles=max(1, macs // self.config.macs), bytes_read=0,
                                     bytes_written=result.nbytes)
        return result

    def matmul(self, a, b, *, bias=None, requant=None, relu=False):
        acc = matmul_int32(a, b)
        return self._done(a.shape[0] * a.shape[1] * b.shape[1],
                          apply_epilogue(acc, 1, bias=bias, requant=requant, relu=relu))

    def conv2d(self, x, w, stride=1, padding=0, dilation=1, *, bias=None, requant=None,
               relu=False, pool=False):
        acc = conv2d_int32(x, w, stride, padding, dilation)
        y = apply_epilogue(acc, 1, (2, 3), bias=bias, requant=requant, relu=relu, pool=pool)
        return self._done(acc.size * int(np.prod(w.shape[1:])), y)

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        return False

    def attention_int8(self, q, k, v, frac, causal=False):
        o = attention_int8_model(self.config, q, k, v, frac, causal)
        return self._done(2 * q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2], o)

    def prepare_matmul(self, a_shape, b, *, input=None, **options):
        return self._prepare(a_shape, b, input, lambda a: self.matmul(a, b, **options))

    def prepare_conv2d(self, x_shape, w, *args, input=None, **options):
        return self._prepare(x_shape, w, input, lambda x: self.conv2d(x, w, *args, **options))

    def _prepare(self, shape, weights, input, operation):
        """A prepared call whose regions are keys of ``memory`` (numbered, not addresses)."""
        y = operation(np.zeros(shape, np.int8))
        input = input or Resident(next(self._regions), int(np.prod(shape)))
        output = Resident(next(self._regions), y.nbytes)
        return SimpleNamespace(input=input, output=output, input_shape=shape, shape=y.shape,
                               dtype=y.dtype, uploaded=weights.nbytes, run=operation)

    def launch(self, call, x=None):
        if x is not None:
            self.memory[call.input] = x
        self.memory[call.output] = call.run(self.memory[call.input].reshape(call.input_shape))

    def download(self, region, dtype, shape):
        assert self.memory[region].dtype == dtype
        return self.memory[region].reshape(shape)


def _model(nodes, inputs, outputs, weights, opset=17):
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def cnn(seed=0, batch=1):
    """Conv(3x3, pad 1) + ReLU + 2x2 MaxPool, Conv(3x3 stride 1) + ReLU, Flatten, Gemm: awkward
    channel counts (3 -> 5 -> 6) and an odd image (7x7 -> 3x3 after the pool)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1],
                              name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2],
                              name="pool1"),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Flatten", ["r2"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "g", "gb"], ["output"], transB=1, name="fc")]
    weights = {"w1": f(5, 3, 3, 3) * 0.5, "b1": f(5) * 0.1, "w2": f(6, 5, 2, 2) * 0.3,
               "b2": f(6) * 0.1, "g": f(7, 6 * 2 * 2) * 0.3, "gb": f(7) * 0.1}
    return _model(nodes, [("input", [batch, 3, 7, 7])], ["output"], weights)


def mlp(seed=0, batch=5):
    """MatMul + Add, Relu, Gemm: 9 -> 11 -> 6 features."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["input", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["output"], name="fc2")]
    weights = {"w1": f(9, 11) * 0.4, "b1": f(11) * 0.1, "w2": f(11, 6) * 0.4, "b2": f(6) * 0.1}
    return _model(nodes, [("input", [batch, 9])], ["output"], weights)


def attention(seed=0, batch=2, tokens=5, dim=6, causal=False):
    """Self-attention of one head: q, k, v projections, softmax(q k^T / sqrt(d)) v (with
    ``causal`` an Add of -1e4 where key j > query i), and an output projection: two MatMuls
    of two activations."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: (rng.normal(size=shape) / np.sqrt(dim)).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["input", f"w{n}"], [n], name=f"proj_{n}") for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="transpose"),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
              helper.make_node("Softmax", ["masked" if causal else "scaled"], ["probs"],
                               axis=-1, name="softmax"),
              helper.make_node("MatMul", ["probs", "v"], ["context"], name="context"),
              helper.make_node("MatMul", ["context", "wo"], ["output"], name="proj_out")]
    weights = {**{f"w{n}": f(dim, dim) * 2 for n in "qkvo"},
               "scale": np.array(1 / np.sqrt(dim), np.float32)}
    if causal:
        nodes.insert(6, helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask"))
        weights["mask"] = np.triu(np.full((tokens, tokens), -1e4, np.float32), 1)
    return _model(nodes, [("input", [batch, tokens, dim])], ["output"], weights)


class _Calibration(CalibrationDataReader):
    def __init__(self, model, seed=1, count=8):
        rng = np.random.default_rng(seed)
        inputs = [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim])
                  for i in model.graph.input]
        self.feeds = iter([{n: rng.normal(size=s).astype(np.float32) for n, s in inputs}
                           for _ in range(count)])

    def get_next(self):
        return next(self.feeds, None)


def quantize(model, tmp_path, form, per_channel=False, activations=QuantType.QInt8,
             weights=QuantType.QInt8, **extra):
    """``model`` quantized by onnxruntime's static quantizer on random calibration data, the
    weights to 7 bits (``reduce_range``): on an x86 CPU without VNNI (this one has AVX2 only)
    onnxruntime's int8 kernels add pairs of u8 x s8 products in int16 and saturate with full
    range weights (seen: a pooled output 4 LSB off the exact integer result)."""
    source, target = tmp_path / "float.onnx", tmp_path / f"{form.name}-{per_channel}.onnx"
    onnx.save(model, source)
    quantize_static(str(source), str(target), _Calibration(model), quant_format=form,
                    per_channel=per_channel, reduce_range=True, activation_type=activations,
                    weight_type=weights, extra_options=extra)
    return onnx.load(str(target))


def onnxruntime_run(model, names, feeds):
    """onnxruntime on ``model`` with the tensors ``names`` made graph outputs."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names
                              if n not in known)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(names, feeds)


def core_outputs(model, softmax=True):
    """The quantized output tensor of every core layer of ``model`` (on a core with the softmax
    unit or not)."""
    return [step.output for step in lower(model, softmax)[0]
            if isinstance(step, (CoreLayer, AttentionLayer))]


def compare(model, device, feeds):
    """(ours, onnxruntime's) for every core layer's output and the model's outputs."""
    session = InferenceSession(model, device)
    names = core_outputs(model, device.config.softmax) + [o.name for o in model.graph.output]
    return session, session.run(names, feeds), onnxruntime_run(model, names, feeds)


def lsb_differences(ours, theirs):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    return np.abs(ours.astype(np.int32) - theirs.astype(np.int32))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("form", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_single_layers_match_onnxruntime_within_one_lsb(tmp_path, form, per_channel):
    """The first core layer of each model, whose input both quantize alike: its int8 output
    is exact but for a rare 1 LSB where the two round differently (docs/onnx.md)."""
    rng = np.random.default_rng(7)
    for model in (cnn(batch=2), mlp()):
        quantized = quantize(model, tmp_path, form, per_channel)
        feeds = {"input": rng.normal(size=[d.dim_value for d in
                                           model.graph.input[0].type.tensor_type.shape.dim]
                                     ).astype(np.float32)}
        _, ours, theirs = compare(quantized, NumpyDevice(), feeds)
        layers = core_outputs(quantized)
        assert len(layers) == (3 if model.graph.node[0].op_type == "Conv" else 2)
        first = lsb_differences(ours[0], theirs[0])
        assert first.max() <= 1 and first.mean() < 0.02, (first.max(), first.mean())
        assert ours[0].size > 30


def test_requant_multiplier_is_nearest_16_bit():
    for scale in (1e-4, 0.0123, 0.5, 0.99999, 1.0, 3.7, 2 ** -40, 2 ** -60):
        multiplier, shift = requant_multiplier(scale)
        assert 0 <= shift <= 63 and 0 < multiplier < 2 ** 16
        assert abs(multiplier / 2 ** shift - scale) <= 2 ** (-shift - 1) * 1.0000001
        if shift < 63:
            assert multiplier >= 2 ** 15
    for bad in (0.0, -1.0, float("nan"), 2.0 ** 17):
        with pytest.raises(ValueError, match="requantize scale"):
            requant_multiplier(bad, "conv1")


def _feeds(model, seed):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"input": np.random.default_rng(seed).normal(size=shape).astype(np.float32)}


@pytest.mark.parametrize("form, weights", [(QuantFormat.QDQ, QuantType.QInt8),
                                           (QuantFormat.QOperator, QuantType.QUInt8)])
def test_uint8_activations_run_as_int8_with_zero_point_correction(tmp_path, form, weights):
    """uint8 activations (asymmetric) run as int8 ``value - 128``, and 7-bit uint8 weights as
    int8 ``value - zero_point``: exact to 1 LSB still."""
    for model in (cnn(), mlp()):
        quantized = quantize(model, tmp_path, form, activations=QuantType.QUInt8,
                             weights=weights)
        _, ours, theirs = compare(quantized, NumpyDevice(), _feeds(model, 3))
        assert ours[0].dtype == np.uint8
        assert lsb_differences(ours[0], theirs[0]).max() <= 1


def test_unsupported_schemes_and_nodes_are_named(tmp_path):
    int16 = quantize(cnn(), tmp_path, QuantFormat.QDQ, activations=QuantType.QInt16)
    with pytest.raises(ValueError, match="node 'conv1'.*input is int16"):
        InferenceSession(int16, NumpyDevice())
    asymmetric = quantize(cnn(), tmp_path, QuantFormat.QOperator)
    zero_point = next(i for i in asymmetric.graph.initializer if i.name == "w1_zero_point")
    zero_point.CopyFrom(numpy_helper.from_array(np.array(100, np.int8), "w1_zero_point"))
    with pytest.raises(ValueError, match="node 'conv1_quant'.*asymmetric weights"):
        InferenceSession(asymmetric, NumpyDevice())
    unknown = mlp()
    unknown.graph.node.append(helper.make_node("Frobnicate", ["output"], ["more"], name="odd",
                                               domain="example.org"))
    unknown.opset_import.append(helper.make_opsetid("example.org", 1))
    with pytest.raises(ValueError, match=r"node 'odd' \(example.org.Frobnicate\) runs neither"):
        InferenceSession(unknown, NumpyDevice())


@pytest.mark.verilator
def test_cnn_mlp_and_attention_on_the_simulated_core(tmp_path):
    """The core reproduces the numpy stand-in bit for bit and onnxruntime to 1 LSB; the report
    says where each node ran and counts what it moved."""
    from tpugen.sim import SimDevice

    models = [
        (quantize(cnn(batch=2), tmp_path, QuantFormat.QOperator, per_channel=True),
         [("conv1_quant", "pool1"), ("conv2_quant",), ("fc_quant",)]),
        (quantize(mlp(), tmp_path, QuantFormat.QDQ),
         [("fc1", "h_QuantizeLinear"), ("fc2", "output_QuantizeLinear")]),
        (quantize(attention(batch=1), tmp_path, QuantFormat.QDQ, ActivationSymmetric=True),
         [(f"proj_{n}", f"{n}_QuantizeLinear") for n in "qkv"] +
         [("scores", "scores_QuantizeLinear", "scores_DequantizeLinear", "scale",
           "scaled_QuantizeLinear", "scaled_DequantizeLinear", "softmax", "probs_QuantizeLinear",
           "probs_DequantizeLinear", "context", "context_QuantizeLinear"),
          ("proj_out", "output_QuantizeLinear")])]
    with SimDevice(CORE, memory="axiram") as device:
        for model, fused in models:
            feeds = _feeds(model, 5)
            session, ours, theirs = compare(model, device, feeds)
            _, numpy_ours, _ = compare(model, NumpyDevice(), feeds)
            # The fused attention's softmax is the unit's own: from there on, not to 1 LSB.
            layers = [s for s in session.steps if isinstance(s, (CoreLayer, AttentionLayer))]
            exact = itertools.takewhile(lambda s: not isinstance(s, AttentionLayer), layers)
            for layer, mine, stand_in, reference in itertools.zip_longest(
                    exact, ours, numpy_ours, theirs):
                np.testing.assert_array_equal(mine, stand_in)
                if layer is not None and mine.dtype.kind != "f":
                    assert lsb_differences(mine, reference).max() <= 1
            report = session.report()
            core = [n for n in report.nodes if n.where == "core"]
            assert [n.nodes for n in core] == fused
            assert all(n.cycles > 0 and 0 < n.mac_utilization <= 1 for n in core)
            assert all(n.core_bytes_read > 0 and n.bytes_from_device > 0 for n in core)
            host = {n.op for n in report.nodes if n.where == "host"}
            assert "QuantizeLinear" in host
            assert {"conv", "matmul", "attention"} >= {n.op for n in core}
            totals = json.loads(report.to_json())["totals"]
            assert totals["cycles"] == sum(n.cycles for n in core)
            assert totals["mac_utilization"] == pytest.approx(
                sum(n.macs for n in core) / (totals["cycles"] * CORE.macs))
            assert "total" in str(report) and str(report).count("\n") == len(report.nodes) + 1
        model = models[0][0]
        chained = _check_resident_matches_per_call(model, device, _feeds(model, 6))
        assert chained == {"conv1_quant", "conv2_quant"}
        _check_prepared_call_windows(device)


def _check_resident_matches_per_call(model, device, feeds):
    """Two runs of ``model`` on the resident path equal the per-call path bit for bit; the
    second writes no weights, and a chained layer's output is neither read back nor written
    again. The names of the layers whose output stayed on the device."""
    per_call = InferenceSession(model, device, resident=False)
    (expected,) = per_call.run(None, feeds)
    before = {n.name: n for n in per_call.report().nodes if n.where == "core"}
    session = InferenceSession(model, device)
    for _ in range(2):
        (output,) = session.run(None, feeds)
        np.testing.assert_array_equal(output, expected)
    after = {n.name: n for n in session.report().nodes if n.where == "core"}
    assert after.keys() == before.keys()
    chained = {name for name, n in after.items() if n.bytes_from_device == 0}
    steps = [s for s in session.steps if isinstance(s, (CoreLayer, AttentionLayer))]
    for layer, next_layer in zip(steps, steps[1:]):
        if layer.name in chained:
            assert after[next_layer.name].bytes_to_device == 0
    for name, n in after.items():
        assert n.cycles == before[name].cycles
        weights = next(getattr(s, "weights", None) for s in steps if s.name == name)
        assert (n.bytes_to_device <= before[name].bytes_to_device - weights.nbytes
                if weights is not None else n.bytes_to_device == before[name].bytes_to_device)
    return chained


def _check_prepared_call_windows(device):
    """A prepared call's windows admit its program, input, weights and output and nothing
    else: the program reading weights or writing its output elsewhere stops with a window
    error."""
    from dataclasses import replace

    from tpugen.firmware import DeviceError

    rng = np.random.default_rng(11)
    a, b = (rng.integers(-128, 128, size=s, dtype=np.int8) for s in ((6, 5), (5, 7)))
    call = device.prepare_matmul(a.shape, b, requant=(3, 4))
    elsewhere = device.upload(np.zeros(64, np.int8))
    for field, error in (("weights", "LOAD_WINDOW"), ("output", "STORE_WINDOW")):
        moved = replace(call, **{field: Resident(elsewhere.address, getattr(call, field).size)})
        with pytest.raises(DeviceError, match=error):
            device.launch(moved, a)
    device.launch(call, a)
    np.testing.assert_array_equal(device.download(call.output, np.int8, (6, 7)),
                                  device.matmul(a, b, requant=(3, 4)))


@pytest.mark.parametrize("form", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_resident_chained_path_matches_per_call_path(tmp_path, form):
    """On the numpy stand-in: conv1 -> pool -> conv2 chains in device memory (conv2's padding
    is none), and conv2 -> Flatten -> fc (the Flatten a new shape of the int8 buffer, nothing
    moved); the MLP's Relu runs on the host, so that does not."""
    for model, chained, symmetric in ((cnn(batch=2), {"conv1", "conv2"}, False),
                                      (mlp(), set(), False),
                                      (attention(batch=1), set(), True)):
        quantized = quantize(model, tmp_path, form, ActivationSymmetric=symmetric)
        device = NumpyDevice()
        names = _check_resident_matches_per_call(quantized, device, _feeds(model, 8))
        assert {name.removesuffix("_quant") for name in names} == chained
        session = InferenceSession(quantized, device)
        session.run(None, _feeds(model, 8))
        views = {n.name: n.where for n in session.report().nodes if n.op in ("Flatten",
                                                                             "Reshape")}
        assert views == ({"flatten": "device"} if "conv2" in chained else {})
        totals = session.report().totals
        assert totals["device_views"] == len(views)
        assert totals["nodes"] == totals["core_nodes"] + totals["host_nodes"] + len(views)
    with pytest.raises(ValueError, match="resident"):
        InferenceSession(quantized, NumpyDevice(), resident=1)


def test_report_plot_has_a_bar_per_node(tmp_path):
    pytest.importorskip("matplotlib")
    session = InferenceSession(quantize(mlp(), tmp_path, QuantFormat.QOperator), NumpyDevice())
    session.run(None, _feeds(mlp(), 2))
    path = tmp_path / "time.png"
    session.report().plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(RuntimeError, match="run"):
        InferenceSession(quantize(mlp(), tmp_path, QuantFormat.QDQ), NumpyDevice()).report()


@pytest.mark.parametrize("name, core_layers", [("mlp", 2), ("cnn", 3), ("transformer", 9)])
def test_committed_digits_models_classify_as_onnxruntime(name, core_layers):
    """The committed models (no training): on the numpy stand-in of the default 8x8 core,
    both forms give onnxruntime's top-1 class on the first 24 test images."""
    from tpugen.examples.digits_onnx import FORMS, evaluate, float_model_path, model_path

    for form in FORMS:
        path = model_path(name, form)
        assert float_model_path(path) == model_path(name)
        result = evaluate(path, NumpyDevice(CoreConfig()), 24, model_path(name))
        assert result.samples == 24 and result.same_predictions == 1.0
        assert result.core_accuracy == result.onnxruntime_accuracy >= 0.85
        assert result.float_accuracy >= 0.85
        assert sum(n.where == "core" for n in result.report.nodes) == core_layers


@pytest.mark.skipif(not os.environ.get("TPUGEN_ONNX_REGENERATE"),
                    reason="opt-in (trains the three models: ~20-40 s): TPUGEN_ONNX_REGENERATE=1")
def test_committed_models_are_what_the_scripts_write(tmp_path):
    """write_models (training, export, quantization) writes the committed files byte for
    byte."""
    from tpugen.examples.digits_onnx import FORMS, MODELS, model_path, write_models

    write_models(directory=tmp_path)
    for name in MODELS:
        for form in (None, *FORMS):
            assert model_path(name, form, tmp_path).read_bytes() == \
                model_path(name, form).read_bytes(), (name, form)


@pytest.mark.verilator
@pytest.mark.skipif(not os.environ.get("TPUGEN_ONNX_DIGITS"),
                    reason="opt-in (the four: ~3 minutes): TPUGEN_ONNX_DIGITS=1")
@pytest.mark.parametrize("model, form", [("mlp", "QDQ"), ("mlp", "QOperator"), ("cnn", "QDQ"),
                                         ("transformer", "QDQ")])
def test_digits_accuracy_equals_onnxruntime(model, form):
    """The committed models on the simulated default 8x8 core, all 360 test images: the
    core's predictions are onnxruntime's (the transformer's attention runs on the softmax
    unit, which is not onnxruntime's softmax: measured 100% alike, asserted 99%)."""
    from tpugen.examples.digits_onnx import run_digits_onnx

    result = run_digits_onnx(model, form)
    assert result.samples == 360
    if model == "transformer":
        assert result.same_predictions >= 0.99
        assert abs(result.core_accuracy - result.onnxruntime_accuracy) <= 0.01
    else:
        assert result.core_accuracy == result.onnxruntime_accuracy
        assert result.same_predictions == 1.0
    assert result.core_accuracy >= result.float_accuracy - 0.02


def test_float_output_layer_dequantizes_the_accumulators(tmp_path):
    """A Gemm whose output is not quantized again returns float ``acc * x_scale * w_scale``."""
    model = quantize(mlp(), tmp_path, QuantFormat.QDQ, per_channel=True)
    nodes = list(model.graph.node)
    last_q, last_dq = (next(n for n in nodes if n.output[0] == name) for name in
                       ("output_QuantizeLinear_Output", "output"))
    fc2 = next(n for n in nodes if n.name == "fc2")
    fc2.output[0] = "output"
    model.graph.node.remove(last_q)
    model.graph.node.remove(last_dq)
    assert [s.nodes for s in lower(model)[0] if not isinstance(s, onnx.NodeProto)][-1] == ("fc2",)
    feeds = _feeds(model, 4)
    (ours,) = InferenceSession(model, NumpyDevice()).run(["output"], feeds)
    (theirs,) = onnxruntime_run(model, ["output"], feeds)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_run_checks_feeds_and_output_names(tmp_path):
    session = InferenceSession(quantize(cnn(), tmp_path, QuantFormat.QDQ), NumpyDevice())
    with pytest.raises(ValueError, match=r"lacks the model inputs \['input'\]"):
        session.run(None, {})
    with pytest.raises(ValueError, match=r"\['c1'\] are not tensors .*fused"):
        session.run(["c1"], _feeds(cnn(), 0))


@pytest.mark.parametrize("form", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_attention_matmuls_of_two_activations(tmp_path, form):
    """Without the softmax unit, q k^T and probs v run on the core when B's zero point is 0
    (symmetric activations), A's zero point corrected per call; with asymmetric activations
    they stay on the host. The report says why the Softmax ran on the host."""
    model = attention()
    for symmetric, on_core in ((True, 6), (False, 4)):
        quantized = quantize(model, tmp_path, form, ActivationSymmetric=symmetric)
        session, ours, theirs = compare(quantized, NumpyDevice(NO_SOFTMAX), _feeds(model, 3))
        report = session.report()
        assert sum(n.where == "core" for n in report.nodes) == on_core
        (softmax,) = [n for n in report.nodes if "Softmax" in n.op]
        assert "no softmax unit" in softmax.note
        assert str(report).endswith(f"{softmax.name}: {softmax.note}")
        hosts = {n.name for n in report.nodes if n.where == "host"}
        assert symmetric or {"scores", "context"} <= {name.removesuffix("_quant")
                                                      for name in hosts}
        for mine, reference in zip(ours[:-1], theirs[:-1]):
            assert lsb_differences(mine, reference).max() <= (1 if symmetric else 2)
    classifier = mlp()  # a Softmax that is no attention: no note
    classifier.graph.node.append(helper.make_node("Softmax", ["output"], ["p"], name="p"))
    assert lower(classifier, softmax=False)[1].notes == {}


@pytest.mark.parametrize("form", [QuantFormat.QDQ, QuantFormat.QOperator])
@pytest.mark.parametrize("symmetric", [True, False])
def test_attention_pattern_runs_on_the_softmax_unit(tmp_path, form, symmetric):
    """MatMul(q, Transpose(k)), Mul, Softmax, MatMul(probs, v) is one attention call on a
    core with the softmax unit: its output within 6 LSB of onnxruntime's, 0.75 LSB on average
    (onnxruntime quantizes the scores and probabilities to int8 on the way; the unit's
    softmax is its own, with 8-bit probabilities; measured here: 3-4 and 0.5), and about as
    close to the float model as onnxruntime's int8 (measured: mean error 1.0-1.34x
    onnxruntime's; asserted at most 1.5x)."""
    model = attention(batch=4, tokens=7)
    quantized = quantize(model, tmp_path, form, ActivationSymmetric=symmetric)
    feeds = _feeds(model, 9)
    session, ours, theirs = compare(quantized, NumpyDevice(), feeds)
    (layer,) = [s for s in session.steps if isinstance(s, AttentionLayer)]
    assert [n.op for n in session.report().nodes if n.where == "core"] == \
        ["matmul"] * 3 + ["attention", "matmul"]
    assert layer.nodes[0].startswith("scores") and layer.nodes[-1].startswith("context")
    index = core_outputs(quantized).index(layer.output)
    difference = lsb_differences(ours[index], theirs[index])
    assert difference.max() <= 6 and difference.mean() < 0.75, (difference.max(),
                                                                 difference.mean())
    (reference,) = onnxruntime_run(model, ["context"], feeds)
    scale = layer.output_quant[0]
    errors = [np.abs((x.astype(np.float64) - layer.output_quant[1]) * scale - reference).mean()
              for x in (ours[index], theirs[index])]
    assert errors[0] <= 1.5 * errors[1], errors
    report = session.report()
    (node,) = [n for n in report.nodes if n.op == "attention"]
    assert node.macs == 2 * 4 * 7 * 7 * 6 and node.cycles > 0


def test_run_model_rejects_bad_paths_and_models_in_one_line(tmp_path, capsys):
    """tpugen run-model: a missing file, a file that is not ONNX, a model whose input is not
    a digits image, a bad --samples: one line on stderr, exit status 2, before any
    simulation."""
    from tpugen.cli import main
    from tpugen.examples.digits_onnx import model_path

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    other = tmp_path / "other.onnx"
    onnx.save(quantize(mlp(), tmp_path, QuantFormat.QDQ), other)
    for argv, message in (
            ([str(tmp_path / "missing.onnx")], "cannot read MODEL .*missing.onnx"),
            ([str(garbage)], "garbage.onnx is not a valid ONNX model"),
            ([str(other)], r"model input 'input' \['N', 9\] does not hold an 8x8 digits image"),
            ([str(model_path("mlp", "QDQ")), "--samples", "0"], "samples=0 is invalid"),
            ([str(model_path("mlp", "QDQ")), "--json", str(tmp_path)], "--json .* is a "
                                                                        "directory")):
        assert main(["run-model", *argv]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and error.startswith("tpugen: error: ")
        assert re.search(message, error), error


def test_run_model_prints_accuracy_and_report(tmp_path, capsys, monkeypatch):
    """tpugen run-model on the committed MLP, 3 test images, the numpy stand-in in place of
    SimDevice (the simulated core is tested above): the accuracies beside onnxruntime's, the
    table, the JSON report."""
    from tpugen import sim
    from tpugen.cli import main
    from tpugen.examples.digits_onnx import model_path

    monkeypatch.setattr(sim, "SimDevice", lambda config, memory: NumpyDevice(config))

    report = tmp_path / "report.json"
    assert main(["run-model", str(model_path("mlp", "QOperator")), "--samples", "3",
                 "--rows", "4", "--cols", "4", "--scratchpad-kib", "1", "--accumulator-kib", "1",
                 "--axi-data-width", "64", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "on the simulated 4x4 core: 3 digits test images" in out
    for line in ("float model on onnxruntime", "int8 on onnxruntime",
                 "int8 on the core (tpugen)", "same prediction as onnxruntime on 100.0%"):
        assert line in out
    totals = json.loads(report.read_text())["totals"]
    assert totals["core_nodes"] == 2 and totals["cycles"] > 0
    assert f"{totals['cycles']}" in out


@pytest.mark.parametrize("form", [QuantFormat.QDQ, QuantFormat.QOperator])
def test_causal_mask_add_is_the_units_causal_mode(tmp_path, form):
    """An Add of a constant causal mask (-1e4 above the diagonal) between the scale and the
    Softmax is matched as the unit's causal mode. onnxruntime quantizes the masked scores
    with the mask's range (scale ~ 1e4 / 255), which leaves nothing of the unmasked scores;
    the fused call keeps them: its output is nearer the float model than onnxruntime's."""
    model = attention(batch=3, tokens=6, causal=True)
    quantized = quantize(model, tmp_path, form, ActivationSymmetric=True)
    feeds = _feeds(model, 4)
    session, ours, theirs = compare(quantized, NumpyDevice(), feeds)
    (layer,) = [s for s in session.steps if isinstance(s, AttentionLayer)]
    assert layer.causal and any(name.startswith("mask") for name in layer.nodes)
    index = core_outputs(quantized).index(layer.output)
    (reference,) = onnxruntime_run(model, ["context"], feeds)
    scale = layer.output_quant[0]
    errors = [np.abs(x.astype(np.float64) * scale - reference).mean()
              for x in (ours[index], theirs[index])]
    assert errors[0] < errors[1] and errors[0] < 3 * scale, errors
    unmasked = quantize(attention(batch=3, tokens=6), tmp_path, form, ActivationSymmetric=True)
    assert not [s for s in lower(unmasked)[0] if isinstance(s, AttentionLayer)][0].causal
