"""numpy golden models. The epilogue's (`apply_epilogue` and its parts) is the runtime's own
(`firmware/epilogue.py`), which also applies it on the host for a core without the multiplier."""
import numpy as np

from ..firmware.epilogue import apply_epilogue, epilogue, maxpool2x2, round_half_even_shift

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
