"""The UART wire format of a board's host link (``docs/uart-protocol.md``): the one definition
used by the bridge (`hdl.uart_bridge.UartBridge`) and the host (`firmware.link.SerialLink`)."""
from amaranth.lib import data, enum
from amaranth.lib.crc.catalog import CRC8_SMBUS

from .registers import ADDR_WIDTH

__all__ = ["BUS_TIMEOUT_CYCLES", "CRC", "FRAME_TIMEOUT_BITS", "MAX_WORDS", "OP_BITS",
           "REGISTER_SPACE", "REPLY_SYNC", "REQUEST_SYNC", "Header", "Op", "Status"]

REQUEST_SYNC = 0x5A
REPLY_SYNC = 0xA5
CRC = CRC8_SMBUS(data_width=8)
"""The CRC of headers and data: CRC-8 x^8 + x^2 + x + 1, initial value 0, not reflected, no
final XOR, a byte at a time. A frame with its CRC appended checks to ``CRC.residue()`` (0)."""
MAX_WORDS = 128
"""Largest COUNT: a frame's data fits the bridge's 512-byte buffer (one iCE40 block RAM)."""
FRAME_TIMEOUT_BITS = 1000
"""Bit times of silence that end a stalled frame, or the quiet period after an error."""
BUS_TIMEOUT_CYCLES = 256
"""Clock cycles an AXI4-Lite access may take before it fails with BUS_ERROR."""
REGISTER_SPACE = 1 << ADDR_WIDTH
"""Bytes of register offsets: 0..0xFFF."""


class Op(enum.IntEnum, shape=8):
    """Request operation."""
    MEM_WRITE = 0x10
    MEM_READ = 0x11
    REG_WRITE = 0x12
    REG_READ = 0x13


OP_BITS = data.StructLayout({"read": 1, "register": 1, "kind": 6})
"""The bits of an `Op`: the four ops share one ``kind``, bit 0 is set for the reads and bit 1
for the register accesses (the bridge decodes them so)."""


class Status(enum.IntEnum, shape=8):
    """Reply status."""
    OK = 0
    BAD_CRC = 1
    BAD_OP = 2
    BAD_ADDRESS = 3
    BAD_LENGTH = 4
    BUS_ERROR = 5
    FRAME = 6


Header = data.StructLayout({"op": Op, "address": 32, "count": 16, "crc": 8})
"""The request bytes after SYNC, in wire order (little-endian fields)."""
