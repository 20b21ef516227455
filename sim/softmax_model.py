"""Bit-exact model of the softmax unit (``hdl/softmax.py`` states the numerics).

The online-softmax state of a query is ``m`` (the running maximum in the log2 domain, an
integer; ``M_NONE`` before any valid key) and ``l`` (the running sum of probabilities, LF
fractional bits). Arrays are int64: no intermediate value overflows it.
"""
import numpy as np

from ..firmware.epilogue import epilogue
from ..hdl.softmax import EXP_BITS, EXP_TABLE, L_MAX, LF, SHIFT_MAX
from ..isa import ErrorCode, SoftmaxMode

__all__ = ["M_NONE", "exp2p", "rescale", "key_mask", "block", "reciprocal", "normalize",
           "scale_rows", "run_instruction"]

M_NONE = np.iinfo(np.int64).min
"""``m`` of a query that has seen no valid key (minus infinity)."""

_TABLE = np.array(EXP_TABLE, dtype=np.int64)


def exp2p(d, frac):
    """p = ``256 * 2 ** (-d / 2**frac)``, rounded, saturated to 255, 0 from 2**-16 on, for
    integers ``d >= 0`` (an int, or an int64 array)."""
    d = np.asarray(d, dtype=np.int64)
    if np.any(d < 0):
        raise ValueError("exp2p needs d >= 0")
    n = d >> frac
    f = ((d << EXP_BITS) >> frac) & (2**EXP_BITS - 1)
    n_small = np.minimum(n, 15)
    p = np.minimum(255, (_TABLE[f] + (1 << (n_small + 3))) >> (n_small + 4))
    out = np.where(n < 16, p, 0)
    return int(out) if out.ndim == 0 else out


def rescale(v, shift):
    """``v / 2**shift`` rounded half up (a rounding right shift)."""
    v = np.asarray(v, dtype=np.int64)
    return (v + ((1 << shift) >> 1)) >> shift


def key_mask(count, width, keys, causal, causal_offset):
    """(count, width) bool: key k of query i is valid iff ``k < keys`` and, with ``causal``,
    ``k <= i + causal_offset``."""
    k = np.arange(width)[None, :]
    valid = np.broadcast_to(k < keys, (count, width))
    if causal:
        valid = valid & (k <= np.arange(count)[:, None] + causal_offset)
    return valid


def block(m, l, s, keys, causal, causal_offset, frac, first, o):
    """One BLOCK step for ``count`` queries: ``s`` (count, tiles * cols) scores (key k of
    query i at ``s[i, k]``, ``s / 2**frac`` in log2 units), ``m``, ``l`` (count,) state (ignored
    with ``first``), ``o`` (count, o_cols) output accumulators (ignored with ``first``; may be
    None then).

    Returns the new ``(m, l, p, o)``: ``p`` (count, tiles * cols) probabilities 0..255, ``o``
    rescaled (returned as given with ``first``)."""
    s = np.asarray(s, dtype=np.int64)
    count, width = s.shape
    if first:
        m = np.full(count, M_NONE, dtype=np.int64)
        l = np.zeros(count, dtype=np.int64)
    m = np.asarray(m, dtype=np.int64)
    l = np.asarray(l, dtype=np.int64)
    valid = key_mask(count, width, keys, causal, causal_offset)
    block_max = np.where(valid, s, M_NONE).max(axis=1, initial=M_NONE)
    ceiling = np.where(block_max == M_NONE, M_NONE, -(-block_max >> frac))
    m_new = np.maximum(m, ceiling)
    has_old = m != M_NONE
    shift = np.where(has_old, np.minimum(SHIFT_MAX, np.where(has_old, m_new - m, 0)), SHIFT_MAX)
    top = np.where(m_new == M_NONE, 0, m_new)[:, None] << frac
    p = np.where(valid, exp2p(np.where(valid, top - s, 0), frac), 0)
    l_new = np.minimum(L_MAX, rescale(l, shift) + (p.sum(axis=1) << LF))
    if not first:
        o = rescale(np.asarray(o, dtype=np.int64), shift[:, None])
    return m_new, l_new, p, o


def reciprocal(l):
    """The row scale NORMALIZE writes for ``l``: ``(r, sh)`` with ``r / 2**sh`` ~ ``2**(8 + LF)
    / l``: ``r = min(2**47 // mant, 2**16 - 1)``, ``mant`` = ``l`` (32 bits) normalized to
    [2**31, 2**32); ``(0, 0)`` for ``l = 0``."""
    l = int(l)
    if l == 0:
        return 0, 0
    r = (1 << 47) // (l << (32 - l.bit_length()))
    return min(r, (1 << 16) - 1), l.bit_length() - 1


def normalize(l, o):
    """O / l as a STORE of ``o`` (count, o_cols) with the row scales of ``l`` stores it
    (``Epilogue.row_scale``): ``o * 2**(8 + LF) / l``, rounded half to even, saturated to
    int32."""
    scales = np.array([reciprocal(li) for li in np.asarray(l)], dtype=np.int64).reshape(-1, 2)
    return scale_rows(o, scales)


def scale_rows(o, scales):
    """The store epilogue's ``row_scale``: row i of ``o`` times ``scales[i]`` (multiplier,
    shift), to int32."""
    return epilogue(o, multiplier=scales[:, :1], shift=scales[:, 1:], requant=True, int8=False)


def _check(config, f):
    block_mode = f["mode"] == SoftmaxMode.BLOCK
    if f["count"] == 0 or block_mode and (f["o_tiles"] == 0 or f["tiles"] == 0):
        return ErrorCode.BAD_EXTENT
    count, acc_rows, p_rows = f["count"], config.accumulator_rows, config.probability_rows
    if (f["state_row"] + count > p_rows
            or block_mode and (f["o_row"] + f["o_tiles"] * count > acc_rows
                               or f["score_row"] + f["tiles"] * count > acc_rows
                               or f["p_row"] + f["tiles"] * count > p_rows)):
        return ErrorCode.SRAM_RANGE
    return ErrorCode.NONE


def run_instruction(config, fields, acc, prob, state_m, state_l, scales):
    """A SOFTMAX instruction (``fields`` as for ``isa.encode``) on the unit's memories, in
    place: ``acc`` (accumulator_rows, cols), ``prob`` (probability_rows, lanes), ``state_m``,
    ``state_l`` (probability_rows,), ``scales`` (probability_rows, 2: the row scales' multiplier
    and shift). Returns the ErrorCode (a bad instruction changes nothing)."""
    f = {name: 0 for name in ("first", "causal", "count", "tiles", "o_tiles", "keys",
                              "causal_offset", "score_row", "p_row", "o_row", "state_row",
                              "frac")}
    f.update(fields)
    try:
        f["mode"] = SoftmaxMode(f.get("mode", SoftmaxMode.BLOCK))
    except ValueError:
        return ErrorCode.UNKNOWN_OPCODE
    error = _check(config, f)
    if error != ErrorCode.NONE:
        return error
    cols, count = config.cols, f["count"]
    queries = np.arange(count)
    states = f["state_row"] + queries
    if f["mode"] == SoftmaxMode.NORMALIZE:
        scales[states] = [reciprocal(l) for l in state_l[states]]
        return ErrorCode.NONE
    o_rows = [f["o_row"] + u * count + queries for u in range(f["o_tiles"])]
    o = np.concatenate([acc[rows] for rows in o_rows], axis=1)
    s_rows = [f["score_row"] + t * count + queries for t in range(f["tiles"])]
    s = np.concatenate([acc[rows] for rows in s_rows], axis=1)
    m, l, p, o = block(state_m[states], state_l[states], s, f["keys"], f["causal"],
                       f["causal_offset"], f["frac"], f["first"], o)
    state_m[states], state_l[states] = m, l
    for t in range(f["tiles"]):
        rows = f["p_row"] + t * count + queries
        prob[rows] = 0
        prob[rows, :cols] = p[:, t * cols:(t + 1) * cols]
    if f["first"]:
        return ErrorCode.NONE
    for u, rows in enumerate(o_rows):
        acc[rows] = o[:, u * cols:(u + 1) * cols]
    return ErrorCode.NONE
