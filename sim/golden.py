"""numpy golden models."""
import numpy as np

__all__ = ["im2col", "matmul_int32", "wrap_int32", "conv2d_int32", "round_half_even_shift",
           "epilogue", "maxpool2x2", "apply_epilogue"]


def wrap_int32(values):
    """Two's-complement wrap of integers to int32, as the accumulators do."""
    return ((np.asarray(values, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def matmul_int32(a, b):
    """int8 x int8 products accumulated in int64, wrapped to int32."""
    return wrap_int32(np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64))


def im2col(x, kernel_h, kernel_w, stride=1, dilation=1, padding=0):
    """The lowered matrix of a conv2d of NCHW ``x``, zero padded: shape (N*P*Q, C*R*S), rows
    (n, p, q) and columns (c, r, s), the last index fastest."""
    x = np.asarray(x)
    n, c, h, w = x.shape
    p = (h + 2 * padding - dilation * (kernel_h - 1) - 1) // stride + 1
    q = (w + 2 * padding - dilation * (kernel_w - 1) - 1) // stride + 1
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    rows = np.arange(p)[:, None] * stride + np.arange(kernel_h)[None, :] * dilation  # (P, R)
    cols = np.arange(q)[:, None] * stride + np.arange(kernel_w)[None, :] * dilation  # (Q, S)
    patches = padded[:, :, rows[:, None, :, None], cols[None, :, None, :]]  # (N, C, P, Q, R, S)
    return patches.transpose(0, 2, 3, 1, 4, 5).reshape(n * p * q, c * kernel_h * kernel_w)


def conv2d_int32(x, w, stride=1, padding=0, dilation=1):
    """Direct NCHW conv2d of int8 ``x`` (N, C, H, W) with ``w`` (K, C, R, S), int64 sums
    wrapped to int32: shape (N, K, P, Q)."""
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    n, c, h, width = x.shape
    k, _, r, s = w.shape
    p = (h + 2 * padding - dilation * (r - 1) - 1) // stride + 1
    q = (width + 2 * padding - dilation * (s - 1) - 1) // stride + 1
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out = np.zeros((n, k, p, q), dtype=np.int64)
    for i in range(r):
        for j in range(s):
            window = padded[:, :, i * dilation:i * dilation + stride * (p - 1) + 1:stride,
                            j * dilation:j * dilation + stride * (q - 1) + 1:stride]
            out += np.einsum("nchw,kc->nkhw", window, w[:, :, i, j])
    return wrap_int32(out)


def round_half_even_shift(values, shift):
    """``values / 2**shift`` rounded to the nearest integer, ties to even (integers; ``shift``
    in 0..63, broadcast against ``values``)."""
    values = np.asarray(values, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    quotient = values >> shift
    remainder = values - (quotient << shift)  # 0 <= remainder < 2**shift
    half = np.int64(1) << np.maximum(shift - 1, 0)
    up = (shift > 0) & ((remainder > half) | ((remainder == half) & (quotient % 2 == 1)))
    return quotient + up


def epilogue(acc, bias=None, multiplier=None, shift=None, requant=False, relu=False):
    """The STORE epilogue (see ``tpugen.isa.Epilogue``) of int32 accumulator values ``acc``;
    ``bias``, ``multiplier`` and ``shift`` are scalars or per-lane arrays (the last axis)."""
    t = np.asarray(acc, dtype=np.int64)
    if bias is not None:
        t = t + np.asarray(bias, dtype=np.int64)
    if requant:
        product = t * (1 if multiplier is None else np.asarray(multiplier, dtype=np.int64))
        y = np.clip(round_half_even_shift(product, 0 if shift is None else shift), -128, 127)
    else:
        y = np.clip(t, -2**31, 2**31 - 1)
    return np.maximum(y, 0) if relu else y


def maxpool2x2(y, axes=(0, 1)):
    """2x2, stride-2 max pooling over ``axes`` (height, width) of ``y``; an odd last row or
    column is dropped."""
    y = np.moveaxis(np.asarray(y), axes, (0, 1))
    h, w = y.shape[0] // 2, y.shape[1] // 2
    y = y[:2 * h, :2 * w].reshape(h, 2, w, 2, *y.shape[2:]).max(axis=(1, 3))
    return np.moveaxis(y, (0, 1), axes)


def apply_epilogue(acc, channel_axis, spatial_axes=None, bias=None, requant=None, relu=False,
                   pool=False):
    """The runtime's epilogue options on an accumulator tensor: per-channel (or scalar) ``bias``
    and ``requant=(multiplier, shift)`` along ``channel_axis``, ``relu``, and with ``pool`` 2x2
    max pooling over ``spatial_axes``; int8 when requantized, else int32."""
    moved = np.moveaxis(np.asarray(acc, dtype=np.int64), channel_axis, -1)
    multiplier, shift = requant if requant is not None else (None, None)
    y = epilogue(moved, bias=bias, multiplier=multiplier, shift=shift,
                 requant=requant is not None, relu=relu)
    y = np.moveaxis(y, -1, channel_axis)
    if pool:
        y = maxpool2x2(y, spatial_axes)
    return y.astype(np.int8 if requant is not None else np.int32)
