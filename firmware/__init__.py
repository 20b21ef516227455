"""The runtime: compiles operations to programs and runs them on a core."""
from .device import DeviceError, SimDevice, Stats

__all__ = ["DeviceError", "SimDevice", "Stats"]
