"""Golden models of attention: the core's fused int8 attention, bit-exact, and the float
reference it approximates."""
import numpy as np

from ..firmware.attention import plan_attention
from .softmax_model import block, normalize

__all__ = ["attention_float", "attention_int8_model", "softmax_int8_model"]


def attention_float(q, k, v, causal=False):
    """``softmax(q k^T / sqrt(d)) v`` in float64, (heads, L, d) arrays; causal masks key j of
    query i when ``j > i + S - L``."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if causal:
        seq, kv = scores.shape[-2:]
        scores = np.where(np.arange(kv)[None, :] > np.arange(seq)[:, None] + kv - seq,
                          -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v


def attention_int8_model(config, q, k, v, frac, causal=False):
    """What `SimDevice.attention_int8` returns: int8 (heads, L, d), (heads, S, d) x2 ->
    int32 (heads, L, d) in units of v / 256, with the key blocks of the core's program."""
    heads, seq, dim = q.shape
    kv = k.shape[1]
    plan = plan_attention(config, seq, kv, dim, causal)
    out = np.zeros((heads, seq, dim), dtype=np.int64)
    for h in range(heads):
        scores = q[h].astype(np.int64) @ k[h].astype(np.int64).T
        m = l = o = None
        for k0 in range(0, kv, plan.block_keys):
            width = min(plan.block_keys, kv - k0)
            m, l, p, o = block(m, l, scores[:, k0:k0 + width], width, causal, kv - seq - k0,
                               frac, k0 == 0, o)
            pv = p.astype(np.int64) @ v[h, k0:k0 + width].astype(np.int64)
            o = pv if k0 == 0 else o + pv
        out[h] = normalize(l, o)
    return out.astype(np.int32)


def softmax_int8_model(x, frac):
    """What `SimDevice.softmax` computes before its final / 256: int8 (rows, n) -> int32."""
    x = np.asarray(x, dtype=np.int64)
    _, l, p, _ = block(None, None, x, x.shape[1], False, 0, frac, True, None)
    return normalize(l, p).astype(np.int32)
