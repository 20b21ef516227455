"""tpugen: a generator of TPU-like int8 systolic-array accelerator cores."""
from .config import PRESETS, CoreConfig

__all__ = ["CoreConfig", "PRESETS"]
__version__ = "0.1.0"
