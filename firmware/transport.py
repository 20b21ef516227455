"""The one interface between the runtime and a core: its memory and its control registers.

`SimDevice` talks to a Verilator model through it, `BoardDevice` to a board through the UART
bridge; the runtime above (compile, lay out, run, read back) is the same for both.
"""
from abc import ABC, abstractmethod

__all__ = ["Transport", "TransportError"]


class TransportError(RuntimeError):
    """The link to the core failed (timeout, corrupted frame, bus error); nothing was left
    half-done on the core side that a retry or a soft reset does not clear."""


class Transport(ABC):
    """Byte-addressed memory and 32-bit registers of one core."""

    @abstractmethod
    def write_memory(self, address, data):
        """Write ``data`` (bytes) at byte ``address``."""

    @abstractmethod
    def read_memory(self, address, size):
        """``size`` bytes from byte ``address``."""

    @abstractmethod
    def write_register(self, offset, value):
        """Write the 32-bit register at byte ``offset``."""

    @abstractmethod
    def read_registers(self, offset, count):
        """``count`` consecutive 32-bit registers from byte ``offset``, as a list of ints."""

    @abstractmethod
    def wait_interrupt(self, timeout_cycles):
        """Wait until the core's interrupt is raised or ``timeout_cycles`` core clock cycles
        have passed; True if it was raised."""

    def close(self):
        """Release the link."""
