"""The runtime: compiles operations to programs and runs them on a core."""
from .board import BoardDevice
from .device import Device, DeviceError, PreparedCall, Resident, SimDevice, Stats
from .transport import Transport, TransportError

__all__ = ["BoardDevice", "Device", "DeviceError", "PreparedCall", "Resident", "SimDevice",
           "Stats", "Transport", "TransportError"]
