"""Run int8-quantized ONNX models on the core: ``InferenceSession(model, device).run(...)``.

The model is read with the `onnx` package, in either form that onnxruntime's
``quantize_static`` writes: QDQ (QuantizeLinear / DequantizeLinear around float Conv, MatMul,
Gemm) or QOperator (QLinearConv, QLinearMatMul, com.microsoft QGemm). Each Conv / MatMul /
Gemm with constant int8 weights becomes one `CoreLayer`: one conv2d or matmul on the
device whose store epilogue adds the bias (with the zero-point corrections folded in),
requantizes with a 16-bit multiplier and a shift derived from the scales, and max-pools 2x2
when a MaxPool follows. Its weights and program are made resident once per session (unless
the core leaves part of its epilogue to the host: then a call per run), and a
layer whose output only the next core layer reads (through Flatten / Reshape `View`s, which
are new shapes of the same bytes) leaves it in device memory for it. The attention pattern
(MatMul(q, Transpose(k)), scale, causal mask, Softmax, MatMul(probs, v)) becomes one
`AttentionLayer` on the softmax unit when the core has it. Every other node runs on the host
in numpy, by the `onnx.reference` evaluator. docs/onnx.md says what maps where and how
outputs may differ from onnxruntime's.
"""
import json
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from .arch import SOFTMAX_OUT_FRAC
from .firmware.attention import attention_operands, plan_attention
from .firmware.epilogue import Epilogue
from .isa import SoftmaxInstruction

__all__ = ["AttentionLayer", "CoreLayer", "InferenceSession", "NodeReport", "Report", "View",
           "lower", "requant_multiplier"]

_MULTIPLIER_BITS = 16
"""The epilogue multiplies by an unsigned 16-bit integer (`Epilogue`), then shifts right."""
_MAX_SHIFT = 63
_UINT8_OFFSET = 128
"""uint8 activations run as int8 ``value - 128`` (their zero point moves by the same)."""
_SOFTMAX_FRAC_MAX = 2 ** SoftmaxInstruction["frac"].width - 1
"""The most fractional bits of the scores the softmax unit takes."""


def requant_multiplier(scale, node="requant"):
    """(multiplier, shift), each an int, with ``multiplier / 2**shift`` nearest to the real
    ``scale`` (> 0): the multiplier in 2**15..2**16-1 (fewer bits only when the shift would
    pass 63)."""
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"node {node!r}: requantize scale {scale} is invalid: allowed a "
                         "positive finite number")
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    multiplier, shift = round(mantissa * 2 ** _MULTIPLIER_BITS), _MULTIPLIER_BITS - exponent
    if multiplier == 2 ** _MULTIPLIER_BITS:
        multiplier, shift = multiplier // 2, shift - 1
    if shift > _MAX_SHIFT:
        multiplier, shift = round(scale * 2 ** _MAX_SHIFT), _MAX_SHIFT
    if shift < 0 or multiplier == 0:
        raise ValueError(f"node {node!r}: requantize scale {scale} is out of range: allowed "
                         f"2**-{_MAX_SHIFT + 1}..2**{_MULTIPLIER_BITS}")
    return multiplier, shift


@dataclass(frozen=True)
class CoreLayer:
    """One Conv or MatMul/Gemm lowered to device calls, in the core's integers.

    ``weights``: int8, (K, C, R, S) for "conv", (K, N) for "matmul"; None for a MatMul of two
    activations, whose B (tensor ``weight_input``, less ``weight_offset``) comes at run time.
    ``bias``: int64 (N,) accumulator units, the model's bias with the output zero point (and
    for constant weights the input zero point ``input_zero``) folded in.
    ``multiplier``/``shift``: (N,) ints (requantized int8 output), or None for a float output
    ``acc * output_scale``. ``input_offset``/``output_offset``: 128 for uint8 tensors (run as
    int8 ``value - 128``), else 0. Conv padding is done on the host with ``input_zero`` (a
    real zero) unless it is 0.
    """
    name: str
    op: str
    nodes: tuple
    input: str
    output: str
    weights: np.ndarray | None
    bias: np.ndarray
    multiplier: tuple | None
    shift: tuple | None
    output_scale: np.ndarray | None
    input_offset: int
    output_offset: int
    input_zero: int
    pads: tuple = (0, 0, 0, 0)
    stride: int = 1
    dilation: int = 1
    pool: bool = False
    weight_input: str | None = None
    weight_offset: int = 0

    @property
    def inputs(self):
        return [self.input] + ([self.weight_input] if self.weight_input else [])

    def macs(self, input_shape, weight_shape):
        """The operation's own multiply-accumulates for operands of these shapes."""
        if self.op == "matmul":
            return int(np.prod(input_shape[:-1])) * weight_shape[-2] * weight_shape[-1]
        n, _, h, w = input_shape
        k, c, r, s = weight_shape
        top, left, bottom, right = self.pads
        p = (h + top + bottom - self.dilation * (r - 1) - 1) // self.stride + 1
        q = (w + left + right - self.dilation * (s - 1) - 1) // self.stride + 1
        return n * k * p * q * c * r * s

    def _padding(self):
        """(the padding the core applies, the (top, left, bottom, right) pads the host applies
        first with ``input_zero``, or None) of a conv."""
        top, left, bottom, right = self.pads
        padding = top if self.input_zero == 0 and top == left == bottom == right else 0
        return padding, (self.pads if any(self.pads) and not padding else None)

    def resident_on(self, config):
        """Whether a core of ``config`` applies all of this layer's epilogue, as a resident call
        needs (`Epilogue.on_core`: nothing left to the host, such as pooling on a core without
        it); else the layer runs as one call a run."""
        epilogue = Epilogue.from_options(len(self.bias), bias=self.bias,
                                         requant=self._options()["requant"], pool=self.pool)
        return epilogue is None or epilogue.on_core(config)[1] is None

    @property
    def chainable(self):
        """Whether the core can read this layer's input as another layer left it in device
        memory: constant weights, and no padding on the host."""
        return self.weights is not None and (self.op != "conv" or self._padding()[1] is None)

    def core_shape(self, shape):
        """The shape of the operand the device reads for a model input of ``shape``, as it
        lies in device memory after another layer (no host padding: `chainable`)."""
        return (int(np.prod(shape[:-1])), shape[-1]) if self.op == "matmul" else tuple(shape)

    def core_input(self, x):
        """The model's input ``x`` as the int8 operand the device reads (constant weights)."""
        xi = _int8(x, self.input_offset)
        if self.op == "matmul":
            return xi.reshape(-1, xi.shape[-1])
        pads = self._padding()[1]
        if pads is None:
            return xi
        top, left, bottom, right = pads
        return np.pad(xi, ((0, 0), (0, 0), (top, bottom), (left, right)),
                      constant_values=self.input_zero)

    def output_shape(self, x_shape, core_shape):
        """The model's shape of the output, for the model's input shape and the core's output
        shape."""
        return core_shape if self.op == "conv" else (*x_shape[:-1], core_shape[-1])

    def model_output(self, y):
        """The core's result ``y`` (already in the model's shape) as the model's tensor."""
        if self.multiplier is None:
            channel_shape = (-1, 1, 1) if self.op == "conv" else (-1,)
            return y.astype(np.float32) * self.output_scale.reshape(channel_shape)
        return _from_int8(y, self.output_offset)

    def _options(self):
        requant = None if self.multiplier is None else (self.multiplier, self.shift)
        if self.op == "conv":
            return {"stride": self.stride, "padding": self._padding()[0],
                    "dilation": self.dilation, "pool": self.pool, "bias": self.bias,
                    "requant": requant}
        return {"bias": self.bias, "requant": requant}

    def prepare(self, device, core_shape, input=None):
        """This layer (constant weights) made resident on ``device`` for a core input of
        ``core_shape`` (read from `Resident` ``input`` when given): a `PreparedCall`."""
        operation = device.prepare_conv2d if self.op == "conv" else device.prepare_matmul
        return operation(tuple(int(d) for d in core_shape), self.weights, input=input,
                         **self._options())

    def run(self, device, x, b=None):
        """This layer on ``device`` for the model's input ``x`` (and B ``b`` of a MatMul of two
        activations), one call per operation with its operands: (the model's output, the int8
        weights, [(bytes written to the device, `Stats`) per call])."""
        calls = []

        def call(operation, *operands, **options):
            result = operation(*operands, **options)
            calls.append((sum(o.nbytes for o in operands), device.stats))
            return result

        if self.weights is not None:
            w = self.weights
            operation = device.conv2d if self.op == "conv" else device.matmul
            y = call(operation, self.core_input(x), w, **self._options())
            return self.model_output(y.reshape(self.output_shape(x.shape, y.shape))), w, calls
        xi = _int8(x, self.input_offset)
        w = _int8(b, self.weight_offset)
        if w.ndim == 2:
            xi, w_batch = xi.reshape(1, -1, xi.shape[-1]), w[None]
        elif w.shape[:-2] == xi.shape[:-2]:
            xi, w_batch = xi.reshape(-1, *xi.shape[-2:]), w.reshape(-1, *w.shape[-2:])
        else:
            raise ValueError(f"node {self.name!r}: A {x.shape} and B {b.shape} need the "
                             "same leading (batch) dimensions")
        requant = self._options()["requant"]
        y = np.stack([call(device.matmul, a, m, requant=requant, bias=self.bias -
                           self.input_zero * m.astype(np.int64).sum(axis=0))
                      for a, m in zip(xi, w_batch)])
        return self.model_output(y.reshape(*x.shape[:-1], -1)), w, calls


def _int8(values, offset):
    """A uint8 (``offset`` 128) or int8 tensor as the core's int8."""
    return (values.astype(np.int16) - offset).astype(np.int8)


def _from_int8(values, offset):
    return (values.astype(np.int16) + offset).astype(np.uint8 if offset else np.int8)


class _Graph:
    """Producers, consumers and constants of an ONNX graph."""

    def __init__(self, model):
        graph = model.graph
        self.nodes = list(graph.node)
        for index, node in enumerate(self.nodes):
            node.name = node.name or f"{node.op_type}_{index}"
        self.constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        for node in self.nodes:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.output[0]] = ReferenceEvaluator(node).run(None, {})[0]
        self.outputs = {o.name for o in graph.output}
        self.node_named = {node.name: node for node in self.nodes}
        self.notes = {}
        """Why a node that could have run on the core runs on the host, by node name."""
        self.producer = {name: node for node in self.nodes for name in node.output}
        self.consumers = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def sole_consumer(self, name, op_type):
        """The one node reading tensor ``name``, if it is an ``op_type`` and ``name`` is not a
        graph output; else None."""
        users = self.consumers.get(name, [])
        if len(users) == 1 and name not in self.outputs and users[0].op_type == op_type:
            return users[0]
        return None

    def constant(self, node, index):
        """Input ``index`` of ``node`` as a numpy array, None when absent or not a constant."""
        if index >= len(node.input) or not node.input[index]:
            return None
        return self.constants.get(node.input[index])

    def producer_of(self, node, index, op_type):
        if index >= len(node.input):
            return None
        producer = self.producer.get(node.input[index])
        return producer if producer is not None and producer.op_type == op_type else None


def _attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@dataclass(frozen=True)
class _Quant:
    """Scale and zero point of a quantized tensor."""
    scale: np.ndarray
    zero_point: np.ndarray

    @property
    def dtype(self):
        return self.zero_point.dtype


def _quant(graph, node, scale_index, zero_index, what):
    scale = graph.constant(node, scale_index)
    if scale is None:
        raise ValueError(f"node {node.name!r}: the {what} scale is not a constant")
    zero = graph.constant(node, zero_index)
    if zero is None:
        zero = np.zeros(scale.shape, np.uint8)
    return _Quant(scale.astype(np.float64), zero)


def _activation(node, quant, what):
    """(scale, zero point on the core's int8 scale, offset) of a per-tensor int8 or uint8
    activation: uint8 runs as int8 ``value - 128``."""
    if quant.scale.size != 1 or quant.zero_point.size != 1:
        raise ValueError(f"node {node.name!r}: the {what} is quantized per channel: the core "
                         "needs one scale and zero point per activation tensor")
    if quant.dtype not in (np.int8, np.uint8):
        raise ValueError(f"node {node.name!r}: the {what} is {quant.dtype}: the core runs "
                         "int8 or uint8 activations only")
    offset = _UINT8_OFFSET if quant.dtype == np.uint8 else 0
    return float(quant.scale.reshape(())), int(quant.zero_point.reshape(())) - offset, offset


def _check_pool(graph, name):
    """The 2x2 / stride-2 MaxPool that is the only reader of ``name``, or None."""
    pool = graph.sole_consumer(name, "MaxPool")
    if pool is None or len(pool.output) != 1:
        return None
    a = _attributes(pool)
    if (list(a.get("kernel_shape", [])) == [2, 2] and list(a.get("strides", [1, 1])) == [2, 2]
            and not any(a.get("pads", [])) and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and list(a.get("dilations", [1, 1])) == [1, 1] and not a.get("ceil_mode", 0)):
        return pool
    return None


def _conv_geometry(node, weights):
    """(pads, stride, dilation) of a Conv/QLinearConv the core runs, or None."""
    a = _attributes(node)
    if (weights.ndim != 4 or a.get("group", 1) != 1
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")):
        return None
    strides, dilations = list(a.get("strides", [1, 1])), list(a.get("dilations", [1, 1]))
    if strides[0] != strides[1] or dilations[0] != dilations[1]:
        return None
    top, left, bottom, right = a.get("pads", [0, 0, 0, 0])
    return (top, left, bottom, right), strides[0], dilations[0]


def _layer(node, op, nodes, input_name, output_name, x, w, w_q, bias, y, alpha=1.0, pool=False,
           geometry=((0, 0, 0, 0), 1, 1)):
    """A `CoreLayer` with constant weights from the quantization parameters: ``x``/``w``/``y``
    `_Quant` (``y`` None: float output), ``w_q`` the integer weights with output channels on
    axis 0 for conv, axis 1 for matmul, ``bias`` the int32 bias in units of x_scale *
    w_scale, or None."""
    channels = w_q.shape[0] if op == "conv" else w_q.shape[1]
    w_scale = np.broadcast_to(w.scale.reshape(-1), (channels,)) if w.scale.size in (1, channels) \
        else None
    w_zero = np.broadcast_to(w.zero_point.reshape(-1).astype(np.int64), (channels,)) \
        if w.zero_point.size in (1, channels) else None
    if w_scale is None or w_zero is None:
        raise ValueError(f"node {node.name!r}: weight scale {w.scale.shape} and zero point "
                         f"{w.zero_point.shape} are neither per tensor nor per output channel "
                         f"({channels})")
    channel_shape = (-1, 1, 1, 1) if op == "conv" else (1, -1)
    centred = w_q.astype(np.int64) - w_zero.reshape(channel_shape)
    if centred.min() < -128 or centred.max() > 127:
        raise ValueError(f"node {node.name!r}: weights minus their zero point do not fit int8 "
                         "(asymmetric weights): quantize the weights symmetric")
    x_scale, x_zero, x_offset = _activation(node, x, "input")
    per_channel_sum = centred.sum(axis=(1, 2, 3)) if op == "conv" else centred.sum(axis=0)
    total = (np.zeros(channels, np.int64) if bias is None
             else np.broadcast_to(bias.reshape(-1).astype(np.int64), (channels,)).copy())
    total -= x_zero * per_channel_sum
    terms = _output_terms(node, alpha * x_scale * w_scale, y)
    return CoreLayer(name=node.name, op=op, nodes=tuple(nodes), input=input_name,
                     output=output_name, weights=centred.astype(np.int8),
                     bias=_check_bias(node, total + terms["bias"]),
                     **{k: v for k, v in terms.items() if k != "bias"}, input_offset=x_offset,
                     input_zero=x_zero, pads=geometry[0], stride=geometry[1],
                     dilation=geometry[2], pool=pool)


def _activations_matmul(node, nodes, a_name, b_name, output_name, a, b, y):
    """A `CoreLayer` for a MatMul of two activations A @ B, or None (host) when B's zero
    point is not a real zero of int8 (0 for int8, 128 for uint8): the core's per-column bias
    corrects A's zero point (``- za * column sums of B``, added at run time), not B's."""
    b_scale, b_zero, b_offset = _activation(node, b, "B")
    if b_zero != 0:
        return None
    a_scale, a_zero, a_offset = _activation(node, a, "input")
    terms = _output_terms(node, np.array([a_scale * b_scale]), y)
    if terms["multiplier"] is not None:
        terms.update(multiplier=terms["multiplier"][0], shift=terms["shift"][0])
    return CoreLayer(name=node.name, op="matmul", nodes=tuple(nodes), input=a_name,
                     output=output_name, weights=None, bias=_check_bias(node, terms.pop("bias")),
                     **terms, input_offset=a_offset, input_zero=a_zero, weight_input=b_name,
                     weight_offset=b_offset)


def _output_terms(node, accumulator_scale, y):
    """The `CoreLayer` fields of the output, for accumulators in units of
    ``accumulator_scale`` (per channel): requantized to ``y`` (`_Quant`), or float (None)."""
    if y is None:
        return {"bias": np.zeros(1, np.int64), "multiplier": None, "shift": None,
                "output_offset": 0, "output_scale": accumulator_scale.astype(np.float32)}
    y_scale, y_zero, y_offset = _activation(node, y, "output")
    pairs = [requant_multiplier(s / y_scale, node.name) for s in accumulator_scale]
    multiplier, shift = (tuple(int(v) for v in column) for column in zip(*pairs))
    # The output zero point as a bias in accumulator units: m * bias / 2**s = y_zero.
    return {"bias": np.array([round(y_zero * 2 ** s / m) for m, s in pairs], np.int64),
            "multiplier": multiplier, "shift": shift, "output_offset": y_offset,
            "output_scale": None}


def _check_bias(node, bias):
    if bias.min() < -2 ** 31 or bias.max() >= 2 ** 31:
        raise ValueError(f"node {node.name!r}: the folded bias does not fit int32")
    return bias


def _qoperator_layer(graph, node):
    """A `CoreLayer` for a QLinearConv / QLinearMatMul / QGemm node, or None (host)."""
    if node.op_type == "QLinearConv" and node.domain in ("", "ai.onnx"):
        w_q = graph.constant(node, 3)
        if w_q is None or graph.constant(node, 0) is not None:
            return None
        geometry = _conv_geometry(node, w_q)
        if geometry is None:
            return None
        return _with_pool(graph, node, "conv", node.output[0], graph.constant(node, 8), w_q,
                          _quant(graph, node, 1, 2, "input"), _quant(graph, node, 4, 5, "weight"),
                          _quant(graph, node, 6, 7, "output"), geometry=geometry)
    if node.op_type == "QLinearMatMul" and node.domain in ("", "ai.onnx"):
        w_q = graph.constant(node, 3)
        a, b = _quant(graph, node, 1, 2, "input"), _quant(graph, node, 4, 5, "weight")
        y = _quant(graph, node, 6, 7, "output")
        if w_q is None:
            return _activations_matmul(node, [node.name], node.input[0], node.input[3],
                                       node.output[0], a, b, y)
        if w_q.ndim != 2:
            return None
        return _layer(node, "matmul", [node.name], node.input[0], node.output[0], a, b, w_q,
                      None, y)
    if node.op_type == "QGemm" and node.domain == "com.microsoft":
        a = _attributes(node)
        w_q = graph.constant(node, 3)
        bias = graph.constant(node, 6)
        if (w_q is None or w_q.ndim != 2 or a.get("transA", 0) or a.get("beta", 1.0) != 1.0
                or (len(node.input) > 6 and node.input[6] and bias is None)):
            return None
        w_q = w_q.T if a.get("transB", 0) else w_q
        y = _quant(graph, node, 7, 8, "output") if len(node.input) > 7 and node.input[7] else None
        return _layer(node, "matmul", [node.name], node.input[0], node.output[0],
                      _quant(graph, node, 1, 2, "input"), _quant(graph, node, 4, 5, "weight"),
                      w_q, bias, y, alpha=a.get("alpha", 1.0))
    return None


def _with_pool(graph, node, op, output, bias, w_q, x, w, y, geometry, nodes=None):
    """`_layer` for a conv whose quantized output is ``output``, fusing a following MaxPool."""
    nodes = list(nodes or [node.name])
    pool = _check_pool(graph, output)
    if pool is not None:
        nodes.append(pool.name)
        output = pool.output[0]
    return _layer(node, op, nodes, node.input[0], output, x, w, w_q, bias, y,
                  pool=pool is not None, geometry=geometry)


def _dequantized(graph, node, index, constant):
    """The DequantizeLinear producing input ``index`` of ``node`` whose own input is a
    constant (``constant`` True) or not, or None."""
    dq = graph.producer_of(node, index, "DequantizeLinear")
    if dq is None or (graph.constant(dq, 0) is not None) != constant:
        return None
    return dq


def _qdq_layer(graph, node):
    """A `CoreLayer` for a float Conv / MatMul / Gemm between DequantizeLinear and
    QuantizeLinear nodes (QDQ), or None (host)."""
    if node.op_type not in ("Conv", "MatMul", "Gemm") or node.domain not in ("", "ai.onnx"):
        return None
    x_dq, w_dq = _dequantized(graph, node, 0, False), _dequantized(graph, node, 1, True)
    activation_b = _dequantized(graph, node, 1, False) if node.op_type == "MatMul" else None
    if x_dq is None or (w_dq is None and activation_b is None):
        return None
    nodes, output, y = _quantized_output(graph, node)
    if activation_b is not None:
        return _activations_matmul(node, nodes, x_dq.input[0], activation_b.input[0], output,
                                   _quant(graph, x_dq, 1, 2, "input"),
                                   _quant(graph, activation_b, 1, 2, "B"), y)
    b_dq = _dequantized(graph, node, 2, True) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b_dq is None:
        return None
    x, w = _quant(graph, x_dq, 1, 2, "input"), _quant(graph, w_dq, 1, 2, "weight")
    w_q = graph.constant(w_dq, 0)
    a = _attributes(node)
    channel_axis = 0 if node.op_type == "Conv" or a.get("transB", 0) else 1
    if w.scale.size > 1 and _attributes(w_dq).get("axis", 1) % w_q.ndim != channel_axis:
        raise ValueError(f"node {node.name!r}: the weights are quantized per channel along "
                         "another axis than the output channels")
    bias = None if b_dq is None else _bias_in_accumulator_units(graph, b_dq, x, w)
    if node.op_type == "Conv":
        geometry = _conv_geometry(node, w_q)
        if geometry is None:
            return None
        q = graph.producer.get(output) if y is not None else None
        pool_dq = graph.sole_consumer(output, "DequantizeLinear") if q is not None else None
        pool = pool_dq is not None and _check_pool(graph, pool_dq.output[0])
        pool_q = pool and graph.sole_consumer(pool.output[0], "QuantizeLinear")
        if pool_q and _same_quant(graph, q, pool_q) and _same_quant(graph, q, pool_dq):
            nodes += [pool_dq.name, pool.name, pool_q.name]
            output = pool_q.output[0]
        else:
            pool_q = None
        return _layer(node, "conv", nodes, x_dq.input[0], output, x, w, w_q, bias, y,
                      pool=bool(pool_q), geometry=geometry)
    if w_q.ndim != 2:
        return None
    if node.op_type == "Gemm":
        if a.get("transA", 0) or a.get("beta", 1.0) != 1.0:
            return None
        w_q = w_q.T if a.get("transB", 0) else w_q
    return _layer(node, "matmul", nodes, x_dq.input[0], output, x, w, w_q, bias, y,
                  alpha=a.get("alpha", 1.0))


def _quantized_output(graph, node):
    """([names of the nodes], output tensor, `_Quant` or None) of a float node: through the
    QuantizeLinear that is the only reader of its output, if there is one."""
    q = graph.sole_consumer(node.output[0], "QuantizeLinear")
    if q is None:
        return [node.name], node.output[0], None
    return [node.name, q.name], q.output[0], _quant(graph, q, 1, 2, "output")


def _bias_in_accumulator_units(graph, dequantize, x, w):
    """The constant bias that ``dequantize`` (a DequantizeLinear) reads, rescaled to units of
    x_scale * w_scale (the quantizer writes it in those units already: then unchanged)."""
    bias = _quant(graph, dequantize, 1, 2, "bias")
    values = graph.constant(dequantize, 0).astype(np.float64) - bias.zero_point
    return np.rint(values * bias.scale / (x.scale * w.scale.reshape(-1))).astype(np.int64)


@dataclass(frozen=True)
class AttentionLayer:
    """The attention pattern ``MatMul(q, Transpose(k)) -> Mul/Div by a constant -> Add of a
    constant causal mask -> Softmax -> MatMul(probs, v)`` (the Mul and the Add optional; with
    its QuantizeLinear/DequantizeLinear pairs, or as QOperator nodes) as one
    `Device.attention_int8` call: the scores stay on the core, the softmax is the softmax
    unit's (not onnxruntime's: docs/onnx.md gives the tolerance).

    ``q``/``k``/``v``: the model's int8 (uint8) tensors, (..., L, d), (..., S, d), (..., S, d),
    the leading axes the heads. Each is centred on its zero point and multiplied by its
    factor (``factors``) on the host: q's so that ``q k^T / 2**frac`` are the scores in log2 units
    (``alpha * sq * sk * log2(e)``, no power of two in general, rounded into q), k's and v's
    (1 unless ``value - zero`` leaves int8) to fit int8. ``output_unit``: the real value of
    one unit of the unit's int32 output; ``output``: requantized to ``output_quant`` (scale,
    int8 zero point, dtype), or float when None.
    """
    name: str
    nodes: tuple
    q: str
    k: str
    v: str
    output: str
    offsets: tuple
    """(q, k, v): 128 for a uint8 tensor, else 0."""
    zeros: tuple
    """(q, k, v) zero points on the int8 scale."""
    factors: tuple
    """(q, k, v) multipliers of the centred values."""
    frac: int
    output_unit: float
    output_quant: tuple | None
    causal: bool = False
    """A constant causal mask was added to the scores: the unit's causal mode."""
    op = "attention"

    @property
    def inputs(self):
        return [self.q, self.k, self.v]

    def core_operands(self, q, k, v):
        """The model's q, k, v as `Device.attention_int8`'s int8 (heads, L, d), (heads, S, d),
        (heads, S, d)."""
        operands = []
        for x, offset, zero, factor in zip((q, k, v), self.offsets, self.zeros, self.factors):
            centred = _int8(x, offset).astype(np.int32) - zero
            scaled = centred * factor if factor != 1 else centred
            operands.append(np.clip(np.rint(scaled), -128, 127).astype(np.int8)
                            .reshape(-1, *x.shape[-2:]))
        return operands

    def macs(self, q_shape, k_shape):
        """q k^T and probs v: 2 L S d per head."""
        return 2 * int(np.prod(q_shape[:-1])) * k_shape[-2] * q_shape[-1]

    def model_output(self, o, q_shape):
        """The unit's int32 output ``o`` as the model's tensor of shape ``q_shape``."""
        real = (o.astype(np.float64) * self.output_unit).reshape(q_shape)
        if self.output_quant is None:
            return real.astype(np.float32)
        scale, zero, dtype = self.output_quant
        return _requantize(real, scale, np.asarray(zero, dtype))


def _centred_bound(zero):
    """The largest ``|value - zero|`` of an int8 value."""
    return max(127 - zero, zero + 128)


def _fit_factor(zero):
    """1 when int8 values less ``zero`` stay int8 (``zero`` 0), else the factor that brings
    them into -127..127."""
    return 1.0 if zero == 0 else 127 / _centred_bound(zero)


def _attention_layer(graph, softmax, nodes, tensors, alpha, output, y, causal=False):
    """An `AttentionLayer`, or None when a tensor inside the pattern is read outside it;
    ValueError when the scores' scale does not fit the softmax unit. ``tensors``: ((name,
    `_Quant`) of q, k, v); ``y``: the output `_Quant` or None; ``causal``: the pattern's
    mask is the unit's causal mode."""
    if not _exclusive(graph, nodes):
        return None
    (sq, zq, oq), (sk, zk, ok), (sv, zv, ov) = (
        _activation(softmax, quant, what) for (_, quant), what in zip(tensors, "qkv"))
    k_factor, v_factor = _fit_factor(zk), _fit_factor(zv)
    step = alpha * sq * sk * math.log2(math.e) / k_factor
    frac = min(_SOFTMAX_FRAC_MAX, math.floor(math.log2(127 / (step * _centred_bound(zq))))) \
        if step > 0 else -1
    if frac < 0:
        raise ValueError(f"the scores' step {step:.3g} (log2 units per q k^T unit) is out of "
                         "the softmax unit's range")
    output_quant = None
    if y is not None:
        y_scale, _, _ = _activation(softmax, y, "output")
        output_quant = (y_scale, y.zero_point.reshape(()).item(), y.dtype)
    return AttentionLayer(
        name=softmax.name, nodes=tuple(nodes), q=tensors[0][0], k=tensors[1][0],
        v=tensors[2][0], output=output, offsets=(oq, ok, ov), zeros=(zq, zk, zv),
        factors=(step * 2 ** frac, k_factor, v_factor), frac=frac, causal=causal,
        output_unit=sv / v_factor / 2 ** SOFTMAX_OUT_FRAC, output_quant=output_quant)


def _real_constant(graph, node, index):
    """Input ``index`` of ``node`` as a float64 array when it is a constant, directly or
    through a DequantizeLinear of one; else None."""
    value = graph.constant(node, index)
    if value is not None:
        return value.astype(np.float64)
    dq = _dequantized(graph, node, index, True)
    if dq is None:
        return None
    quant = _quant(graph, dq, 1, 2, "constant")
    return (graph.constant(dq, 0).astype(np.float64) - quant.zero_point) * quant.scale


def _scalar(graph, node, index):
    """Input ``index`` of ``node`` as a float when it is a one-element constant (directly or
    through a DequantizeLinear), else None."""
    value = _real_constant(graph, node, index)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


_MASKED = -1e3
"""A mask value at most this (or -inf) removes the key: exp(-1000) is 0 in float32."""


def _is_causal(mask):
    """Whether constant ``mask`` (..., L, S), any leading axes 1, is the unit's causal mode: 0
    where key j <= query i + S - L, at most `_MASKED` elsewhere."""
    if mask is None or mask.ndim < 2 or any(d != 1 for d in mask.shape[:-2]):
        return False
    mask = mask.reshape(mask.shape[-2:])
    seq, kv = mask.shape
    masked = np.arange(kv)[None, :] > np.arange(seq)[:, None] + kv - seq
    return seq <= kv and bool(np.all(mask[~masked] == 0) and np.all(mask[masked] <= _MASKED))


def _qdq_copy(graph, name):
    """(the float tensor that ``name`` is a QuantizeLinear -> DequantizeLinear copy of, [the
    two nodes]), or (``name``, []) when it is not one."""
    dq = graph.producer.get(name)
    q = dq is not None and dq.op_type == "DequantizeLinear" and graph.producer.get(dq.input[0])
    if not q or q.op_type != "QuantizeLinear":
        return name, []
    return q.input[0], [q.name, dq.name]


def _swaps_last_axes(transpose):
    perm = list(_attributes(transpose).get("perm", []))
    return len(perm) >= 2 and perm == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]


def _qdq_attention(graph, softmax):
    """`_attention_layer` of the QDQ pattern ending in Softmax node ``softmax``, or None."""
    if softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx") \
            or _attributes(softmax).get("axis", -1) != -1:
        return None
    scaled, nodes = _qdq_copy(graph, softmax.input[0])
    mask, causal = graph.producer.get(scaled), False
    if mask is not None and mask.op_type == "Add":
        index = next((i for i in (1, 0) if _is_causal(_real_constant(graph, mask, i))), None)
        if index is None:
            return None
        scaled, around_mask = _qdq_copy(graph, mask.input[1 - index])
        nodes, causal = around_mask + [mask.name] + nodes, True
    scale, alpha = graph.producer.get(scaled), 1.0
    if scale is not None and scale.op_type in ("Mul", "Div"):
        index = next((i for i in (1, 0) if _scalar(graph, scale, i) is not None), None)
        if index is None or (scale.op_type == "Div" and index == 0):
            return None
        value = _scalar(graph, scale, index)
        alpha = value if scale.op_type == "Mul" else 1 / value
        scores, around_scores = _qdq_copy(graph, scale.input[1 - index])
        nodes = around_scores + [scale.name] + nodes
    else:
        scores = scaled
    matmul = graph.producer.get(scores)
    if matmul is None or matmul.op_type != "MatMul":
        return None
    q_dq = _dequantized(graph, matmul, 0, False)
    key, around_key = _qdq_copy(graph, matmul.input[1])
    transpose = graph.producer.get(key)
    if q_dq is None or transpose is None or transpose.op_type != "Transpose" \
            or not _swaps_last_axes(transpose):
        return None
    k_dq = _dequantized(graph, transpose, 0, False)
    if k_dq is None or (around_key and not _same_quant(
            graph, k_dq, graph.node_named[around_key[0]])):
        return None
    probs_q = graph.sole_consumer(softmax.output[0], "QuantizeLinear")
    probs_dq = probs_q and graph.sole_consumer(probs_q.output[0], "DequantizeLinear")
    context = probs_dq and graph.sole_consumer(probs_dq.output[0], "MatMul")
    if not context or context.input[0] != probs_dq.output[0]:
        return None
    v_dq = _dequantized(graph, context, 1, False)
    if v_dq is None:
        return None
    tail, output, y = _quantized_output(graph, context)
    nodes = [matmul.name] + nodes + [softmax.name, probs_q.name, probs_dq.name] + tail
    tensors = [(dq.input[0], _quant(graph, dq, 1, 2, what))
               for dq, what in ((q_dq, "q"), (k_dq, "k"), (v_dq, "v"))]
    return _attention_layer(graph, softmax, nodes, tensors, alpha, output, y, causal)


def _qoperator_attention(graph, softmax):
    """`_attention_layer` of the QOperator pattern (QLinearMatMul, QLinearMul,
    QLinearSoftmax, QLinearMatMul) ending in ``softmax``, or None."""
    if softmax.op_type != "QLinearSoftmax" or _attributes(softmax).get("axis", -1) != -1:
        return None
    scale, alpha, nodes = graph.producer.get(softmax.input[0]), 1.0, [softmax.name]
    causal = scale is not None and scale.op_type == "QLinearAdd"
    if causal:
        index = next((i for i in (3, 0) if _is_causal(_qlinear_constant(graph, scale, i))),
                     None)
        if index is None:
            return None
        nodes.insert(0, scale.name)
        scale = graph.producer.get(scale.input[3 - index])
    if scale is not None and scale.op_type == "QLinearMul":
        index = next((i for i in (3, 0) if graph.constant(scale, i) is not None), None)
        if index is None or graph.constant(scale, index).size != 1:
            return None
        alpha = float(_qlinear_constant(graph, scale, index).reshape(-1)[0])
        nodes.insert(0, scale.name)
        scale = graph.producer.get(scale.input[3 - index])
    matmul, transpose = scale, None
    if matmul is not None and matmul.op_type == "QLinearMatMul":
        transpose = graph.producer.get(matmul.input[3])
    context = graph.sole_consumer(softmax.output[0], "QLinearMatMul")
    if (transpose is None or transpose.op_type != "Transpose" or not _swaps_last_axes(transpose)
            or not context or context.input[0] != softmax.output[0]):
        return None
    tensors = [(matmul.input[0], _quant(graph, matmul, 1, 2, "q")),
               (transpose.input[0], _quant(graph, matmul, 4, 5, "k")),
               (context.input[3], _quant(graph, context, 4, 5, "v"))]
    return _attention_layer(graph, softmax, [matmul.name] + nodes + [context.name], tensors,
                            alpha, context.output[0], _quant(graph, context, 6, 7, "output"),
                            causal)


def _qlinear_constant(graph, node, index):
    """Input ``index`` of a QLinearAdd / QLinearMul (its scale and zero point the next two
    inputs) dequantized, when it is a constant; else None."""
    value = graph.constant(node, index)
    if value is None:
        return None
    quant = _quant(graph, node, index + 1, index + 2, "constant")
    return (value.astype(np.float64) - quant.zero_point) * quant.scale


@dataclass(frozen=True)
class View:
    """A Flatten or Reshape (with a constant shape) of an int8 tensor, also in QDQ form
    between a DequantizeLinear and a QuantizeLinear of the same scale and zero point (which
    then cancel exactly): a relabeling of the tensor's row-major bytes. On the host a
    reshape of the int8 array; between two core layers nothing at all (the next layer reads
    the first one's output region as it lies)."""
    name: str
    op: str
    nodes: tuple
    input: str
    output: str
    axis: int = 1
    """Flatten's."""
    shape: tuple | None = None
    """Reshape's target (0: the input's dimension, -1: the rest), None for Flatten."""

    @property
    def inputs(self):
        return [self.input]

    def output_shape(self, shape):
        if self.shape is None:
            axis = self.axis % len(shape) if self.axis < 0 else self.axis
            return (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
        target = [shape[i] if d == 0 else d for i, d in enumerate(self.shape)]
        return np.empty(shape, np.int8).reshape(target).shape


def _exclusive(graph, nodes):
    """Whether every output of ``nodes`` but the last node's is read only by ``nodes`` and is
    not a graph output."""
    covered = set(nodes)
    return not any(tensor in graph.outputs or any(c.name not in covered
                                                  for c in graph.consumers.get(tensor, []))
                   for name in nodes[:-1] for tensor in graph.node_named[name].output)


def _view(graph, node, int8_tensors):
    """A `View` of a Flatten / Reshape ``node``: of an int8 tensor (one of ``int8_tensors``,
    the QOperator form) or as DequantizeLinear -> node -> QuantizeLinear with one scale and
    zero point (QDQ); else None."""
    if node.op_type not in ("Flatten", "Reshape") or node.domain not in ("", "ai.onnx"):
        return None
    a = _attributes(node)
    options = {"axis": a.get("axis", 1)}
    if node.op_type == "Reshape":
        shape = graph.constant(node, 1)
        if shape is None or a.get("allowzero", 0):
            return None
        options = {"shape": tuple(int(d) for d in shape)}
    if node.input[0] in int8_tensors:
        return View(name=node.name, op=node.op_type, nodes=(node.name,), input=node.input[0],
                    output=node.output[0], **options)
    dq = _dequantized(graph, node, 0, False)
    q = graph.sole_consumer(node.output[0], "QuantizeLinear")
    if dq is None or q is None or not _same_quant(graph, dq, q):
        return None
    nodes = (dq.name, node.name, q.name)
    if not _exclusive(graph, nodes):
        return None
    return View(name=node.name, op=node.op_type, nodes=nodes, input=dq.input[0],
                output=q.output[0], **options)


def _same_quant(graph, first, second):
    return all(np.array_equal(graph.constant(first, i), graph.constant(second, i)) for i in (1, 2))


_NO_SOFTMAX_UNIT = ("attention on the host: the core has no softmax unit "
                    "(CoreConfig.softmax=False)")


def lower(model, softmax=True):
    """([step], graph): each step a `CoreLayer`, an `AttentionLayer` (when ``softmax``: the
    core has the softmax unit), a `View` or an ONNX node run on the host, in an order that
    computes every input before its use. ``graph.notes`` says why an attention pattern did
    not go to the core."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = _Graph(copy)
    layers, covered = {}, {}
    for node in graph.nodes:
        try:
            attention = _qdq_attention(graph, node) or _qoperator_attention(graph, node)
        except ValueError as error:  # a quantization the unit cannot take: on the host
            graph.notes[node.name] = f"attention on the host: {error}"
            continue
        if attention is not None and not softmax:
            graph.notes[node.name] = _NO_SOFTMAX_UNIT
        elif attention is not None:
            layers[attention.nodes[-1]] = attention
            covered.update(dict.fromkeys(attention.nodes, attention))
    for node in graph.nodes:
        if node.name in covered:
            continue
        layer = _qoperator_layer(graph, node) or _qdq_layer(graph, node)
        if layer is not None and not any(name in covered for name in layer.nodes):
            layers[layer.nodes[-1]] = layer
            covered.update(dict.fromkeys(layer.nodes, layer))
    int8_tensors = {layer.output for layer in layers.values()
                    if isinstance(layer, CoreLayer) and layer.multiplier is not None}
    for node in graph.nodes:
        if node.op_type == "QuantizeLinear":
            int8_tensors.add(node.output[0])
        view = None if node.name in covered else _view(graph, node, int8_tensors)
        if view is not None and not any(name in covered for name in view.nodes):
            layers[view.nodes[-1]] = view
            covered.update(dict.fromkeys(view.nodes, view))
            int8_tensors.add(view.output)
    steps = []
    for node in graph.nodes:
        if node.name in layers:
            steps.append(layers[node.name])
        elif node.name not in covered and not (node.op_type == "Constant" and not node.domain):
            steps.append(node)
    return steps, graph


@dataclass(frozen=True)
class NodeReport:
    """One step of a run: a `CoreLayer` (``where`` "core") or an ONNX node ("host")."""
    name: str
    op: str
    where: str
    nodes: tuple
    seconds: float
    cycles: int = 0
    macs: int = 0
    mac_utilization: float = 0.0
    """The node's own MACs / (cycles * rows * cols)."""
    bytes_to_device: int = 0
    """Operands the host wrote for this node; on the resident path also, at the node's first
    run, its weights and program (0 input bytes when the layer before left them on the
    device)."""
    bytes_from_device: int = 0
    """What the host read back (0 when the output stays on the device for the next layer)."""
    core_bytes_read: int = 0
    core_bytes_written: int = 0
    note: str = ""
    """Why a node the core could run ran on the host (e.g. no softmax unit)."""


@dataclass(frozen=True)
class Report:
    """The per-node report of `InferenceSession.run`: ``str()`` a table, `to_json`, `plot`."""
    nodes: tuple
    array_macs: int

    @property
    def totals(self):
        core = [n for n in self.nodes if n.where == "core"]
        cycles = sum(n.cycles for n in core)
        macs = sum(n.macs for n in core)
        return {"nodes": len(self.nodes), "core_nodes": len(core),
                "host_nodes": sum(n.where == "host" for n in self.nodes),
                "device_views": sum(n.where == "device" for n in self.nodes),
                "cycles": cycles, "macs": macs,
                "mac_utilization": macs / max(1, cycles * self.array_macs),
                "seconds": sum(n.seconds for n in self.nodes),
                **{key: sum(getattr(n, key) for n in self.nodes)
                   for key in ("bytes_to_device", "bytes_from_device", "core_bytes_read",
                               "core_bytes_written")}}

    def to_json(self):
        return json.dumps({"nodes": [asdict(n) for n in self.nodes], "totals": self.totals},
                          indent=2)

    def __str__(self):
        header = ("node", "op", "where", "cycles", "MACs", "MAC util", "to dev B", "from dev B",
                  "core rd B", "core wr B", "ms")

        def row(n):
            return (n.name, n.op, n.where, n.cycles, n.macs, f"{n.mac_utilization:.1%}",
                    n.bytes_to_device, n.bytes_from_device, n.core_bytes_read,
                    n.core_bytes_written, f"{n.seconds * 1e3:.1f}")
        t = self.totals
        where = f"{t['core_nodes']} core, {t['host_nodes']} host" + (
            f", {t['device_views']} device" if t["device_views"] else "")
        rows = [header] + [tuple(map(str, row(n))) for n in self.nodes] + [tuple(map(str, (
            "total", where, "", t["cycles"], t["macs"],
            f"{t['mac_utilization']:.1%}", t["bytes_to_device"], t["bytes_from_device"],
            t["core_bytes_read"], t["core_bytes_written"], f"{t['seconds'] * 1e3:.1f}")))]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        return "\n".join(["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                                    for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                          for r in rows] + [f"{n.name}: {n.note}" for n in self.nodes if n.note])

    def plot(self, path):
        """Bars of each node's time: core cycles, and host wall-clock milliseconds
        (needs matplotlib, the ``plot`` extra)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (core, host) = plt.subplots(2, 1, figsize=(8, 6), constrained_layout=True)
        for axis, where, values, label in (
                (core, "core", lambda n: n.cycles, "cycles"),
                (host, "host", lambda n: n.seconds * 1e3, "ms (wall clock)")):
            nodes = [n for n in self.nodes if n.where == where]
            axis.barh([n.name for n in nodes], [values(n) for n in nodes])
            axis.invert_yaxis()
            axis.set_xlabel(label)
            axis.set_title(f"{where} nodes")
        fig.savefig(path)
        plt.close(fig)


def _requantize(real, scale, zero_point):
    """QuantizeLinear of float ``real``: round half to even, saturate to the zero point's type
    (uint8 when there is none)."""
    zero_point = np.asarray(0 if zero_point is None else zero_point,
                            np.uint8 if zero_point is None else zero_point.dtype)
    info = np.iinfo(zero_point.dtype)
    return np.clip(np.rint(real / scale) + zero_point, info.min, info.max).astype(info.dtype)


class _QLinearBinary(OpRun):
    """com.microsoft QLinearAdd / QLinearMul (written by the QOperator quantizer for Add / Mul),
    in float: dequantize both, combine, quantize."""
    op_domain = "com.microsoft"

    def _run(self, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
        real = [(x.astype(np.float32) - z) * s
                for x, s, z in ((a, a_scale, a_zero), (b, b_scale, b_zero))]
        return (_requantize(self.combine(*real), c_scale, c_zero),)


class QLinearAdd(_QLinearBinary):
    combine = staticmethod(np.add)


class QLinearMul(_QLinearBinary):
    combine = staticmethod(np.multiply)


class QLinearSoftmax(OpRun):
    """com.microsoft QLinearSoftmax (the QOperator quantizer's Softmax), in float."""
    op_domain = "com.microsoft"

    def _run(self, x, x_scale, x_zero, y_scale, y_zero=None, axis=None, opset=None):
        real = (x.astype(np.float32) - x_zero) * x_scale
        exp = np.exp(real - real.max(axis=-1 if axis is None else axis, keepdims=True))
        probabilities = exp / exp.sum(axis=-1 if axis is None else axis, keepdims=True)
        return (_requantize(probabilities, y_scale, y_zero),)


_HOST_OPS = [QLinearAdd, QLinearMul, QLinearSoftmax]
"""Host implementations of onnxruntime's contrib ops, which `onnx.reference` does not have."""


def _host_evaluator(node, opsets):
    """`onnx.reference`'s numpy implementation of ``node`` at the model's opset, or at the
    newest when it has none for that opset (QuantizeLinear / DequantizeLinear below 19)."""
    try:
        return ReferenceEvaluator(node, opsets=opsets, new_ops=_HOST_OPS)
    except RuntimeError:
        return ReferenceEvaluator(node, new_ops=_HOST_OPS)


def _step_outputs(step):
    return list(step.output) if isinstance(step, onnx.NodeProto) else [step.output]


def _resident(step, config):
    """Whether ``step`` is a core layer with constant weights that a core of ``config`` runs as
    a resident call (`CoreLayer.resident_on`)."""
    return (isinstance(step, CoreLayer) and step.weights is not None
            and step.resident_on(config))


def _step_inputs(step):
    return list(step.input) if isinstance(step, onnx.NodeProto) else step.inputs


class InferenceSession:
    """An int8 ONNX model (path, bytes or `onnx.ModelProto`) run on ``device`` (a `Device`,
    open), with onnxruntime's interface: ``run(output_names or None, {name: array})``.

    ``resident`` (the default): each core layer with constant weights is prepared on the
    device once per input shape (`Device.prepare_matmul` / `prepare_conv2d`: weights,
    program with the epilogue, output region), and a layer whose output only the next core
    layer reads leaves it in device memory as that layer's input (no host round trip).
    ``resident=False``: one self-contained device call per layer and run (operands written,
    output read back each time)."""

    def __init__(self, model, device, *, resident=True):
        if not isinstance(resident, bool):
            raise ValueError(f"resident={resident!r} is invalid: allowed True or False")
        self.resident = resident
        self._prepared = {}
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_model_from_string(model) if isinstance(model, bytes) \
                else onnx.load(str(model))
        self.model = model
        self.device = device
        self.steps, self._graph = lower(model, softmax=device.config.softmax)
        opsets = {o.domain or "": o.version for o in model.opset_import}
        self._host = {}
        for step in self.steps:
            if isinstance(step, onnx.NodeProto):
                try:
                    self._host[step.name] = _host_evaluator(step, opsets)
                except (NotImplementedError, RuntimeError, KeyError, TypeError) as error:
                    raise ValueError(f"node {step.name!r} ({step.domain or 'ai.onnx'}."
                                     f"{step.op_type}) runs neither on the core nor on the "
                                     f"host: {error}") from None
        self._report = None

    def get_inputs(self):
        return [i for i in self.model.graph.input if i.name not in self._graph.constants]

    def get_outputs(self):
        return list(self.model.graph.output)

    def run(self, output_names, feeds):
        """The outputs named (all the graph's when None), for ``feeds`` {input name: array}."""
        names = [o.name for o in self.get_outputs()] if output_names is None else output_names
        missing = [i.name for i in self.get_inputs() if i.name not in feeds]
        if missing:
            raise ValueError(f"feeds lacks the model inputs {missing}")
        values = {**self._graph.constants, **feeds}
        produced = {name for step in self.steps for name in _step_outputs(step)}
        unknown = [n for n in names if n not in produced and n not in values]
        if unknown:
            raise ValueError(f"output_names: {unknown} are not tensors of the model (or are "
                             "inside a fused core layer)")
        needed, live = set(names), []
        for step in reversed(self.steps):
            if needed.intersection(_step_outputs(step)):
                live.append(step)
                needed.update(_step_inputs(step))
        live.reverse()
        config = self.device.config
        on_device = self._chained(live, names, config) if self.resident else set()
        reports, device_values = [], {}
        for step in live:
            start = time.perf_counter()
            if _resident(step, config) and self.resident:
                reports.append(self._run_resident(step, values, device_values, on_device,
                                                  start))
            elif isinstance(step, CoreLayer):
                reports.append(self._run_core(step, values, start))
            elif isinstance(step, AttentionLayer):
                reports.append(self._run_attention(step, values, start))
            elif isinstance(step, View):
                reports.append(self._run_view(step, values, device_values, start))
            else:
                results = self._host[step.name].run(None, {n: values[n] for n in step.input if n})
                values.update(zip(step.output, results))
                reports.append(NodeReport(name=step.name, op=step.op_type, where="host",
                                          nodes=(step.name,),
                                          seconds=time.perf_counter() - start,
                                          note=self._graph.notes.get(step.name, "")))
        self._report = Report(nodes=tuple(reports), array_macs=self.device.config.macs)
        return [values[n] for n in names]

    @staticmethod
    def _chained(steps, names, config):
        """The tensors that stay in device memory: the int8 output of a resident core layer
        (`_resident` on a core of ``config``) that only the next step reads, through any `View`s
        each read only by the next, up to a resident core layer that can read it there
        (`CoreLayer.chainable`); none of them asked for."""
        readers = {}
        for step in steps:
            for name in _step_inputs(step):
                readers.setdefault(name, []).append(step)

        def only_reader(name, step):
            return name not in names and [id(r) for r in readers[name]] == [id(step)]

        kept = set()
        for index, first in enumerate(steps):
            if not (_resident(first, config) and first.multiplier is not None):
                continue
            path = [first.output]
            following = steps[index + 1:] + [None]
            while isinstance(following[0], View) and only_reader(path[-1], following[0]):
                path.append(following.pop(0).output)
            second = following[0]
            if (_resident(second, config) and second.chainable and second.input == path[-1]
                    and only_reader(path[-1], second)):
                kept.update(path)
        return kept

    def _run_view(self, view, values, device_values, start):
        """``view`` as a new shape of its input: in device memory (nothing moves) when the
        layer before left it there, else a reshape of the host's int8 array."""
        source = device_values.get(view.input)
        if source is None:
            x = values[view.input]
            values[view.output] = x.reshape(view.output_shape(x.shape))
            where, note = "host", ""
        else:
            shape, region = source
            device_values[view.output] = (view.output_shape(shape), region)
            where, note = "device", "a new shape of the int8 tensor in device memory"
        return NodeReport(name=view.name, op=view.op, where=where, nodes=view.nodes,
                          seconds=time.perf_counter() - start, note=note)

    def _run_resident(self, layer, values, device_values, on_device, start):
        """``layer`` as a `PreparedCall` (prepared at its first use for this input): its input
        from device memory when the layer before left it there, else written from the host;
        its output left there when in ``on_device``, else read back."""
        source = device_values.get(layer.input)
        if source is None:
            x_shape = values[layer.input].shape
            x = layer.core_input(values[layer.input])
            core_shape, input_region, sent = x.shape, None, x.nbytes
        else:
            x_shape, input_region = source
            x, core_shape, sent = None, layer.core_shape(x_shape), 0
        key = (layer.name, core_shape, input_region)
        call = self._prepared.get(key)
        if call is None:
            call = self._prepared[key] = layer.prepare(self.device, core_shape, input_region)
            sent += call.uploaded
        self.device.launch(call, x)
        shape = layer.output_shape(x_shape, call.shape)
        received = 0
        if layer.output in on_device:
            device_values[layer.output] = (shape, call.output)
        else:
            y = self.device.download(call.output, call.dtype, call.shape)
            values[layer.output] = layer.model_output(y.reshape(shape))
            received = y.nbytes
        return self._core_report(layer, start, layer.macs(x_shape, layer.weights.shape),
                                 [(sent, self.device.stats)], received)

    def _run_core(self, layer, values, start):
        x = values[layer.input]
        y, weights, calls = layer.run(self.device, x, *(values[n] for n in layer.inputs[1:]))
        values[layer.output] = y
        return self._core_report(layer, start, layer.macs(x.shape, weights.shape), calls,
                                 y.nbytes)

    def _run_attention(self, layer, values, start):
        """``layer`` as one `Device.attention_int8` call, its operands written from the host
        (padded as the program reads them) and its output read back."""
        q, k, v = (values[name] for name in layer.inputs)
        operands = layer.core_operands(q, k, v)
        o = self.device.attention_int8(*operands, layer.frac, causal=layer.causal)
        values[layer.output] = layer.model_output(o, q.shape)
        plan = plan_attention(self.device.config, *operands[0].shape[1:2],
                              *operands[1].shape[1:3], layer.causal)
        sent = sum(a.nbytes for a in attention_operands(plan, *operands))
        return self._core_report(layer, start, layer.macs(q.shape, k.shape),
                                 [(sent, self.device.stats)], o.nbytes)

    def _core_report(self, layer, start, macs, calls, received):
        """The `NodeReport` of ``layer``: ``calls`` [(bytes written, `Stats`)], ``received``
        bytes read back."""
        cycles = sum(stats.cycles for _, stats in calls)
        return NodeReport(
            name=layer.name, op=layer.op, where="core", nodes=layer.nodes,
            seconds=time.perf_counter() - start, cycles=cycles, macs=macs,
            mac_utilization=macs / max(1, cycles * self.device.config.macs),
            bytes_to_device=sum(sent for sent, _ in calls), bytes_from_device=received,
            core_bytes_read=sum(stats.bytes_read for _, stats in calls),
            core_bytes_written=sum(stats.bytes_written for _, stats in calls))

    def report(self):
        """The `Report` of the last `run`."""
        if self._report is None:
            raise RuntimeError("report() needs a run() first")
        return self._report
