"""The fused store-path epilogue: checked options, and the PARAMS / STORE fields they become."""
from dataclasses import dataclass, replace

import numpy as np

from ..isa import PARAMS_RESET

__all__ = ["Epilogue", "apply_epilogue", "epilogue", "maxpool2x2", "output_dtype",
           "round_half_even_shift"]

_RESET_ENTRY = (PARAMS_RESET["bias"], PARAMS_RESET["multiplier"], PARAMS_RESET["shift"])


def _per_channel(name, value, channels, low, high):
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and not (array.dtype == object and
                                            all(isinstance(v, int) for v in array.flat)):
        raise TypeError(f"{name} must be an integer or an integer array, not {array.dtype}")
    if array.ndim == 0:
        array = np.full(channels, int(array), dtype=np.int64)
    if array.shape != (channels,):
        raise ValueError(f"{name} must be a scalar or have shape ({channels},), not {array.shape}")
    if array.min() < low or array.max() > high:
        raise ValueError(f"{name} is out of range: allowed {low}..{high}")
    return tuple(int(v) for v in array)


@dataclass(frozen=True)
class Epilogue:
    """Per output channel: ``t = acc + bias``; with requant ``y = sat_int8(round_half_even(t *
    multiplier / 2**shift))``, else ``y = sat_int32(t)``; ``relu``: ``max(y, 0)``; ``pool``:
    2x2 / stride-2 max pooling (conv2d only)."""
    bias: tuple
    multiplier: tuple
    shift: tuple
    use_bias: bool
    requant: bool
    relu: bool
    pool: bool

    @classmethod
    def from_options(cls, channels, *, bias=None, requant=None, relu=False, pool=False):
        """None when no option is set. ``bias``: int or (channels,) int32 values;
        ``requant``: (multiplier, shift), each an int or (channels,) values, multiplier
        0..65535, shift 0..63."""
        for name, flag in (("relu", relu), ("pool", pool)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
        if bias is None and requant is None and not relu and not pool:
            return None
        zeros = (0,) * channels
        bias_values = zeros if bias is None else _per_channel(
            "bias", bias, channels, -2**31, 2**31 - 1)
        if requant is None:
            multiplier, shift = (1,) * channels, zeros
        else:
            if not isinstance(requant, tuple) or len(requant) != 2:
                raise TypeError("requant must be a (multiplier, shift) tuple")
            multiplier = _per_channel("requant multiplier", requant[0], channels, 0, 65535)
            shift = _per_channel("requant shift", requant[1], channels, 0, 63)
        return cls(bias=bias_values, multiplier=multiplier, shift=shift,
                   use_bias=bias is not None, requant=requant is not None, relu=relu, pool=pool)

    @property
    def per_tensor(self):
        return len(set(zip(self.bias, self.multiplier, self.shift))) == 1

    def entries(self, first, count):
        """(bias, multiplier, shift) of channels ``first`` .. ``first + count - 1``."""
        return [(self.bias[c], self.multiplier[c], self.shift[c]) if c < len(self.bias)
                else _RESET_ENTRY for c in range(first, first + count)]

    def on_core(self, config):
        """(the epilogue a core of ``config`` applies or None, the one the host applies to its
        results or None). A core without the epilogue multiplier takes a power-of-two
        multiplier (at most 2**shift) folded into the shift; any other requantization is left
        to the host: the core stores the (pooled) accumulators as int32. A core without pooling
        leaves it to the host. Either is the same: pooling commutes with the epilogue, which is
        monotonic and the same for the four values a pool takes (one channel)."""
        pooled_on_host = self.pool and not config.epilogue_pool
        core = replace(self, pool=False) if pooled_on_host else self
        powers = [m.bit_length() - 1 for m in self.multiplier]
        if config.epilogue_multiplier or not self.requant or set(self.multiplier) == {1}:
            host = None
        elif all(m > 0 and m == 1 << k and k <= s for m, k, s in zip(self.multiplier, powers,
                                                                    self.shift)):
            core = replace(core, multiplier=(1,) * len(self.shift),
                           shift=tuple(s - k for s, k in zip(self.shift, powers)))
            host = None
        else:
            core = Epilogue.from_options(len(self.bias), pool=core.pool)
            host = replace(self, pool=pooled_on_host)
        if pooled_on_host and host is None:
            host = _POOL_ONLY
        if core is not None and not (core.use_bias or core.requant or core.relu or core.pool):
            core = None
        return core, host

    def apply(self, acc, channel_axis, spatial_axes=(2, 3)):
        """This epilogue on the host, on int32 ``acc`` with its channels along
        ``channel_axis`` (and with ``pool`` its height and width along ``spatial_axes``): the
        golden model the core is checked against. Pooling alone keeps ``acc``'s elements."""
        if self == _POOL_ONLY:
            return maxpool2x2(acc, spatial_axes)
        return apply_epilogue(acc, channel_axis, spatial_axes,
                              bias=self.bias if self.use_bias else None,
                              requant=(self.multiplier, self.shift) if self.requant else None,
                              relu=self.relu, pool=self.pool)

    def fields(self, pool_pitch=0, per_row=False):
        """The STORE instruction's `isa.Epilogue` fields; ``per_row``: channels on the
        accumulator rows (parameter entry i1), not on the lanes."""
        return {"bias": int(self.use_bias), "requant": int(self.requant), "relu": int(self.relu),
                "pool": int(self.pool), "pool_pitch": pool_pitch, "per_row": int(per_row)}


_POOL_ONLY = Epilogue(bias=(), multiplier=(), shift=(), use_bias=False, requant=False,
                     relu=False, pool=True)
"""The host's part of an epilogue that the core applies but for pooling (`Epilogue.on_core`)."""


def output_dtype(epilogue):
    """The elements an operation with ``epilogue`` (an `Epilogue` or None) stores."""
    return np.dtype(np.int8 if epilogue is not None and epilogue.requant else np.int32)


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


def epilogue(acc, bias=None, multiplier=None, shift=None, requant=False, relu=False,
             int8=True):
    """The STORE epilogue (see ``tpugen.isa.Epilogue``) of int32 accumulator values ``acc``;
    ``bias``, ``multiplier`` and ``shift`` are scalars or per-lane arrays (the last axis);
    ``requant`` saturates to int8, or with ``int8=False`` to int32 (a STORE of int32 elements)."""
    t = np.asarray(acc, dtype=np.int64)
    if bias is not None:
        t = t + np.asarray(bias, dtype=np.int64)
    if requant:
        product = t * (1 if multiplier is None else np.asarray(multiplier, dtype=np.int64))
        low, high = (-128, 127) if int8 else (-2**31, 2**31 - 1)
        y = np.clip(round_half_even_shift(product, 0 if shift is None else shift), low, high)
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
