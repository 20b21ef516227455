"""The runtime: compiles operations to programs and runs them on a core."""
from .board import BoardDevice
from .device import Device, DeviceError, PreparedCall, Resident, Stats
from .transport import Transport, TransportError

__all__ = ["BoardDevice", "Device", "DeviceError", "PreparedCall", "Resident", "Stats",
           "Transport", "TransportError"]
