"""numpy golden models."""
import numpy as np

__all__ = ["im2col", "matmul_int32", "wrap_int32"]


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
