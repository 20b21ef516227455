"""The fused store-path epilogue: checked options, and the PARAMS / STORE fields they become."""
from dataclasses import dataclass, replace

import numpy as np

from ..isa import PARAMS_RESET
from ..sim.golden import apply_epilogue

__all__ = ["Epilogue", "output_dtype"]

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
        to the host: the core stores the (pooled) accumulators as int32 (pooling them first is
        the same, as the epilogue is monotonic)."""
        if config.epilogue_multiplier or not self.requant or set(self.multiplier) == {1}:
            return self, None
        powers = [m.bit_length() - 1 for m in self.multiplier]
        if all(m == 1 << k and k <= s for m, k, s in zip(self.multiplier, powers, self.shift)):
            return replace(self, multiplier=(1,) * len(self.shift),
                           shift=tuple(s - k for s, k in zip(self.shift, powers))), None
        core = Epilogue.from_options(len(self.bias), pool=self.pool)
        return core, replace(self, pool=False)

    def apply(self, acc, channel_axis):
        """This epilogue (without pooling) on the host, on int32 ``acc`` with its channels
        along ``channel_axis``: the golden model the core is checked against."""
        return apply_epilogue(acc, channel_axis, bias=self.bias if self.use_bias else None,
                              requant=(self.multiplier, self.shift) if self.requant else None,
                              relu=self.relu)

    def fields(self, pool_pitch=0):
        """The STORE instruction's `isa.Epilogue` fields."""
        return {"bias": int(self.use_bias), "requant": int(self.requant), "relu": int(self.relu),
                "pool": int(self.pool), "pool_pitch": pool_pitch}


def output_dtype(epilogue):
    """The elements an operation with ``epilogue`` (an `Epilogue` or None) stores."""
    return np.dtype(np.int8 if epilogue is not None and epilogue.requant else np.int32)
