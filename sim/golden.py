"""numpy golden models."""
import numpy as np

__all__ = ["matmul_int32", "wrap_int32"]


def wrap_int32(values):
    """Two's-complement wrap of integers to int32, as the accumulators do."""
    return ((np.asarray(values, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def matmul_int32(a, b):
    """int8 x int8 products accumulated in int64, wrapped to int32."""
    return wrap_int32(np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64))
