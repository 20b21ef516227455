"""A tiny transformer encoder block on sklearn's digits, trained in numpy and exported to ONNX.

Each 8x8 image is 8 tokens (its rows) of 8 pixels. Embedding Gemm (8 -> 16) plus a learned
position embedding; one attention head: q, k, v and output projections (MatMul),
``softmax(q k^T / 4) v`` (MatMul, Transpose, Mul, Softmax, MatMul); residual; an MLP
(Gemm 16 -> 32, Relu, Gemm 32 -> 16) per token; residual; the mean over the tokens; a Gemm
classifier (16 -> 10). Trained by full-batch Adam on hand-written gradients (a few seconds,
no training framework); `digits_onnx.write_models` quantizes and commits it.
"""
import numpy as np

from .digits import split_digits

__all__ = ["TOKENS", "WIDTH", "digits_transformer", "train_transformer"]

TOKENS, FEATURES, WIDTH, HIDDEN, CLASSES = 8, 8, 16, 32, 10
"""Tokens per image, pixels per token, model width, MLP width, classes."""
_SCALE = 1 / np.sqrt(WIDTH)
"""The attention scores' scale, 1 / sqrt(d)."""
_SHAPES = {"we": (FEATURES, WIDTH), "be": (WIDTH,), "pos": (TOKENS, WIDTH),
           "wq": (WIDTH, WIDTH), "wk": (WIDTH, WIDTH), "wv": (WIDTH, WIDTH), "wo": (WIDTH, WIDTH),
           "w1": (WIDTH, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, WIDTH), "b2": (WIDTH,),
           "wc": (WIDTH, CLASSES), "bc": (CLASSES,)}


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _forward(p, x):
    """(logits, the intermediates `_backward` needs) for images ``x`` (B, TOKENS, FEATURES)."""
    e = x @ p["we"] + p["be"] + p["pos"]
    q, k, v = e @ p["wq"], e @ p["wk"], e @ p["wv"]
    probs = _softmax(q @ k.transpose(0, 2, 1) * _SCALE)
    a = probs @ v
    h = e + a @ p["wo"]
    z1 = h @ p["w1"] + p["b1"]
    r = np.maximum(z1, 0)
    h2 = h + r @ p["w2"] + p["b2"]
    pooled = h2.mean(axis=1)
    return pooled @ p["wc"] + p["bc"], locals()


def _backward(p, x, labels):
    """(cross-entropy loss, its gradient for each parameter) on a batch."""
    logits, f = _forward(p, x)
    probabilities = _softmax(logits)
    loss = -np.mean(np.log(probabilities[np.arange(len(x)), labels] + 1e-12))
    d_logits = probabilities
    d_logits[np.arange(len(x)), labels] -= 1
    d_logits /= len(x)
    g = {"wc": f["pooled"].T @ d_logits, "bc": d_logits.sum(0)}
    d_h2 = np.repeat((d_logits @ p["wc"].T)[:, None, :] / TOKENS, TOKENS, axis=1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    g["w2"], g["b2"] = flat(f["r"]).T @ flat(d_h2), d_h2.sum((0, 1))
    d_z1 = (d_h2 @ p["w2"].T) * (f["z1"] > 0)
    g["w1"], g["b1"] = flat(f["h"]).T @ flat(d_z1), d_z1.sum((0, 1))
    d_h = d_h2 + d_z1 @ p["w1"].T
    g["wo"] = flat(f["a"]).T @ flat(d_h)
    d_a = d_h @ p["wo"].T
    d_probs = d_a @ f["v"].transpose(0, 2, 1)
    d_v = f["probs"].transpose(0, 2, 1) @ d_a
    d_scores = f["probs"] * (d_probs - (d_probs * f["probs"]).sum(-1, keepdims=True)) * _SCALE
    d_q, d_k = d_scores @ f["k"], d_scores.transpose(0, 2, 1) @ f["q"]
    e = flat(f["e"])
    g["wq"], g["wk"], g["wv"] = (e.T @ flat(d) for d in (d_q, d_k, d_v))
    d_e = d_h + d_q @ p["wq"].T + d_k @ p["wk"].T + d_v @ p["wv"].T
    g["we"], g["be"], g["pos"] = flat(x).T @ flat(d_e), d_e.sum((0, 1)), d_e.sum(0)
    return loss, g


def train_transformer(x, labels, steps=200, rate=0.02, seed=0):
    """The parameters ({name: float32 array}) fitted to images ``x`` (B, TOKENS, FEATURES) by
    full-batch Adam, on one BLAS thread (its many small products run ten times slower on a
    busy machine with more)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _adam(x, labels, steps, rate, seed)


def _adam(x, labels, steps, rate, seed):
    rng = np.random.default_rng(seed)
    p = {name: (rng.normal(size=shape) / np.sqrt(shape[0]) if len(shape) == 2 and name != "pos"
                else np.zeros(shape)) for name, shape in _SHAPES.items()}
    p["pos"] = rng.normal(size=_SHAPES["pos"]) * 0.1
    moments = {name: (np.zeros(shape), np.zeros(shape)) for name, shape in _SHAPES.items()}
    for step in range(1, steps + 1):
        _, grads = _backward(p, x, labels)
        for name, grad in grads.items():
            m, v = moments[name]
            m[...] = 0.9 * m + 0.1 * grad
            v[...] = 0.999 * v + 0.001 * grad ** 2
            p[name] -= rate * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return {name: value.astype(np.float32) for name, value in p.items()}


def digits_transformer(samples=360, seed=0):
    """(float ONNX model, (x_train, x_test, y_train, y_test)): the block of the module
    docstring trained on `split_digits`; input (N, TOKENS, FEATURES)."""
    from onnx import helper

    from .digits_onnx import onnx_model

    x_train, x_test, y_train, y_test = split_digits(samples, seed)
    x_train, x_test = (x.reshape(-1, TOKENS, FEATURES) for x in (x_train, x_test))
    p = train_transformer(x_train, y_train, seed=seed)
    weights = {**p, "scale": np.float32(_SCALE), "tokens": np.array([-1, FEATURES], np.int64),
               "sequence": np.array([-1, TOKENS, WIDTH], np.int64),
               "rows": np.array([-1, WIDTH], np.int64)}
    node = helper.make_node
    nodes = [node("Reshape", ["input", "tokens"], ["x_tokens"], name="to_tokens"),
             node("Gemm", ["x_tokens", "we", "be"], ["embedded"], name="embed"),
             node("Reshape", ["embedded", "sequence"], ["embedded_3d"], name="to_sequence"),
             node("Add", ["embedded_3d", "pos"], ["e"], name="position")]
    nodes += [node("MatMul", ["e", f"w{n}"], [n], name=f"proj_{n}") for n in "qkv"]
    nodes += [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="transpose_k"),
              node("MatMul", ["q", "kt"], ["scores"], name="scores"),
              node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
              node("Softmax", ["scaled"], ["probs"], axis=-1, name="softmax"),
              node("MatMul", ["probs", "v"], ["context"], name="context"),
              node("MatMul", ["context", "wo"], ["attended"], name="proj_out"),
              node("Add", ["e", "attended"], ["h"], name="residual1"),
              node("Reshape", ["h", "rows"], ["h_rows"], name="to_rows"),
              node("Gemm", ["h_rows", "w1", "b1"], ["z1"], name="mlp1"),
              node("Relu", ["z1"], ["r1"], name="relu"),
              node("Gemm", ["r1", "w2", "b2"], ["m"], name="mlp2"),
              node("Add", ["h_rows", "m"], ["h2_rows"], name="residual2"),
              node("Reshape", ["h2_rows", "sequence"], ["h2"], name="to_sequence2"),
              node("ReduceMean", ["h2"], ["pooled"], axes=[1], keepdims=0, name="pool"),
              node("Gemm", ["pooled", "wc", "bc"], ["logits"], name="classifier")]
    return onnx_model(nodes, weights, [None, TOKENS, FEATURES]), \
        (x_train, x_test, y_train, y_test)
