"""The runtime: compiles operations to programs and runs them on a core."""
from .board import BoardDevice
from .device import Device, DeviceError, SimDevice, Stats
from .transport import Transport, TransportError

__all__ = ["BoardDevice", "Device", "DeviceError", "SimDevice", "Stats", "Transport",
           "TransportError"]
