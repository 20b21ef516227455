"""Golden models of attention: the core's fused int8 attention, bit-exact, and the float
reference it approximates."""
import numpy as np

from ..firmware.attention import plan_attention
from .softmax_model import M_NONE, block, normalize

__all__ = ["attention_float", "attention_int8_model", "softmax_int8_model", "speculation_hits"]


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


def _flash_attention(config, q, k, v, frac, causal):
    """The core's program on the bit-exact model: its query tiles and blocks of keys
    (`AttentionPlan.query_blocks`) in order. Returns (int64 O, speculation hits, query blocks
    without ``first``): a hit is a query whose m is valid and unchanged by a BLOCK."""
    heads, seq, dim = q.shape
    kv = k.shape[1]
    plan = plan_attention(config, seq, kv, dim, causal)
    out = np.zeros((heads, seq, dim), dtype=np.int64)
    hits = speculative = 0
    for h in range(heads):
        scores = q[h].astype(np.int64) @ k[h].astype(np.int64).T
        for q0, count, blocks in plan.query_blocks(causal):
            queries = slice(q0, q0 + count)
            m = l = o = None
            for b, (k0, tiles) in enumerate(blocks):
                keys = slice(k0, k0 + tiles * plan.cols)
                m_new, l, p, o = block(m, l, scores[queries, keys], min(plan.block_keys, kv - k0),
                                       causal, q0 - k0 + kv - seq, frac, b == 0, o)
                if b:
                    hits += int(np.sum((m != M_NONE) & (m_new == m)))
                    speculative += count
                m = m_new
                pv = p.astype(np.int64) @ v[h, keys].astype(np.int64)
                o = pv if b == 0 else o + pv
            out[h, queries] = normalize(l, o)
    return out, hits, speculative


def attention_int8_model(config, q, k, v, frac, causal=False):
    """What `SimDevice.attention_int8` returns: int8 (heads, L, d), (heads, S, d) x2 ->
    int32 (heads, L, d) in units of v / 256, with the query tiles and key blocks of the core's
    program."""
    return _flash_attention(config, q, k, v, frac, causal)[0].astype(np.int32)


def speculation_hits(config, q, k, v, frac, causal=False):
    """(hits, query blocks) of the softmax unit's speculative max pass on the core's program
    for the inputs of `attention_int8_model`: of the queries of every BLOCK without ``first``,
    those whose running max m is valid and unchanged (each costs ``tiles`` cycles instead of
    ``2 * tiles + o_tiles``, `arch.block_query_cycles`)."""
    return _flash_attention(config, q, k, v, frac, causal)[1:]


def softmax_int8_model(x, frac):
    """What `SimDevice.softmax` computes before its final / 256: int8 (rows, n) -> int32."""
    x = np.asarray(x, dtype=np.int64)
    _, l, p, _ = block(None, None, x, x.shape[1], False, 0, frac, True, None)
    return normalize(l, p).astype(np.int32)
