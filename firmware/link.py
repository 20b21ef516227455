"""The host side of the UART link to a board (``docs/uart-protocol.md``): frame encoding and
`SerialLink`, a `Transport` over a pyserial-like object."""
import time

from ..registers import register
from ..wire import (CRC, FRAME_TIMEOUT_BITS, MAX_WORDS, REGISTER_SPACE, REPLY_SYNC, REQUEST_SYNC,
                    Op, Status)
from .transport import Transport, TransportError

__all__ = ["BridgeStatusError", "LinkCrcError", "LinkError", "LinkTimeoutError", "SerialLink",
           "crc8", "decode_reply", "encode_request"]

READ_OPS = (Op.MEM_READ, Op.REG_READ)
BITS_PER_BYTE = 10
"""8N1: start bit, 8 data bits, stop bit."""


def crc8(data):
    """The wire format's CRC-8 (`wire.CRC`, CRC-8/SMBUS) of ``data``."""
    return CRC.compute(data)


def encode_request(op, address, count, data=None):
    """A request frame. ``data`` (the write data, or any bytes) gets its own CRC; ``op`` and
    ``count`` are not checked against the protocol, so malformed requests can be built too."""
    for name, value, limit in (("op", op, 1 << 8), ("address", address, 1 << 32),
                               ("count", count, 1 << 16)):
        if not (isinstance(value, int) and 0 <= value < limit):
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer in 0..{limit - 1}")
    header = bytes([op]) + address.to_bytes(4, "little") + count.to_bytes(2, "little")
    frame = bytes([REQUEST_SYNC]) + header + bytes([crc8(header)])
    if data is not None:
        frame += bytes(data) + bytes([crc8(data)])
    return frame


def decode_reply(frame):
    """(Status, data) of a complete reply frame; LinkCrcError if it does not check."""
    if len(frame) < 3 or frame[0] != REPLY_SYNC:
        raise LinkCrcError(f"reply {bytes(frame[:8]).hex()} does not start with "
                           f"{REPLY_SYNC:#04x}, status, ...")
    if crc8(frame[1:]) != CRC.residue():
        raise LinkCrcError(f"reply of {len(frame)} bytes fails its CRC")
    try:
        status = Status(frame[1])
    except ValueError:
        raise LinkCrcError(f"reply has unknown status {frame[1]:#04x}") from None
    return status, bytes(frame[2:-1])


class LinkError(TransportError):
    """The UART link to a board failed."""


class LinkTimeoutError(LinkError):
    """No complete reply arrived within the link's timeout."""


class LinkCrcError(LinkError):
    """A frame was corrupted on the line: the reply failed its check (``status`` None), or the
    bridge rejected the request with ``status`` BAD_CRC or FRAME, before executing any of it."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class BridgeStatusError(LinkError):
    """The bridge refused the request (BAD_OP, BAD_ADDRESS, BAD_LENGTH) or the register bus
    failed it (BUS_ERROR): ``status``."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class SerialLink(Transport):
    """A core on a board, reached through its UART bridge.

    ``serial``: an object with pyserial's ``write(bytes)``, ``read(n)`` (fewer bytes on its read
    timeout, which should be short) and ``reset_input_buffer()``; ``close()`` is called if it has
    one. ``baud`` defaults to ``serial.baudrate``; ``clock_hz`` is the core clock, for
    `wait_interrupt`. A reply must arrive within ``timeout`` seconds. Reads and memory writes are
    retried ``retries`` times on a timeout or a corrupted frame; a register write only when the
    bridge reported that it did not execute it (CONTROL.start is not idempotent). Before a retry
    and after every refused request the link waits until the bridge has dropped the frame.
    """

    def __init__(self, serial, *, clock_hz, baud=None, timeout=1.0, retries=2):
        baud = getattr(serial, "baudrate", None) if baud is None else baud
        for name, value in (("clock_hz", clock_hz), ("baud", baud), ("timeout", timeout)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}={value!r} is invalid: allowed a positive number")
        if not (isinstance(retries, int) and retries >= 0):
            raise ValueError(f"retries={retries!r} is invalid: allowed an integer >= 0")
        self.serial = serial
        self.clock_hz = clock_hz
        self.baud = baud
        self.timeout = timeout
        self.retries = retries
        self._line_free_at = 0.0

    def write_memory(self, address, data):
        data = bytes(data)
        _check_span(address, len(data))
        if not data:
            return
        start, end = address & ~3, -(-(address + len(data)) // 4) * 4
        span = bytearray(end - start)
        if address != start:
            span[:4] = self._read_words(Op.MEM_READ, start, 1)
        if address + len(data) != end and not (address != start and end - start == 4):
            span[-4:] = self._read_words(Op.MEM_READ, end - 4, 1)
        span[address - start:address - start + len(data)] = data
        for offset in range(0, len(span), 4 * MAX_WORDS):
            chunk = span[offset:offset + 4 * MAX_WORDS]
            self._transact(Op.MEM_WRITE, start + offset, len(chunk) // 4, chunk, idempotent=True)

    def read_memory(self, address, size):
        _check_span(address, size)
        if size == 0:
            return b""
        start, end = address & ~3, -(-(address + size) // 4) * 4
        span = self._read_words(Op.MEM_READ, start, (end - start) // 4)
        return span[address - start:address - start + size]

    def write_register(self, offset, value):
        _check_registers(offset, 1)
        if not (isinstance(value, int) and 0 <= value < 1 << 32):
            raise ValueError(f"value={value!r} is invalid: allowed an integer in 0..2**32-1")
        self._transact(Op.REG_WRITE, offset, 1, value.to_bytes(4, "little"), idempotent=False)

    def read_registers(self, offset, count):
        _check_registers(offset, count)
        words = self._read_words(Op.REG_READ, offset, count)
        return [int.from_bytes(words[i:i + 4], "little") for i in range(0, len(words), 4)]

    def wait_interrupt(self, timeout_cycles):
        """Poll STATUS until ``busy`` is clear (True) or ``timeout_cycles`` core cycles of wall
        clock time have passed (False); STATUS is read at least once."""
        deadline = time.monotonic() + timeout_cycles / self.clock_hz
        status = register("STATUS")
        while True:
            value, = self.read_registers(status.offset, 1)
            if not status.fields_of(value).busy:
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self):
        close = getattr(self.serial, "close", None)
        if close is not None:
            close()

    def _read_words(self, op, address, count):
        data = bytearray()
        for offset in range(0, 4 * count, 4 * MAX_WORDS):
            words = min(MAX_WORDS, count - offset // 4)
            data += self._transact(op, address + offset, words, idempotent=True)
        return bytes(data)

    def _transact(self, op, address, count, data=None, *, idempotent):
        """The reply data of one request, retried as the class docstring says."""
        request = encode_request(op, address, count, None if data is None else bytes(data))
        for attempt in range(self.retries + 1):
            try:
                return self._exchange(request, 4 * count if op in READ_OPS else 0)
            except BridgeStatusError as error:
                if error.status != Status.BUS_ERROR:
                    self._resynchronize()
                raise
            except (LinkTimeoutError, LinkCrcError) as error:
                self._resynchronize()
                not_executed = isinstance(error, LinkCrcError) and error.status is not None
                if attempt == self.retries or not (idempotent or not_executed):
                    error.add_note(f"{op.name} at {address:#x}: {attempt + 1} attempt(s)")
                    raise

    def _exchange(self, request, reply_bytes):
        self._line_free_at = (max(time.monotonic(), self._line_free_at)
                              + len(request) * BITS_PER_BYTE / self.baud)
        self.serial.write(request)
        deadline = time.monotonic() + self.timeout
        head = self._receive(2, deadline)
        ok = head[0] == REPLY_SYNC and head[1] == Status.OK
        status, data = decode_reply(head + self._receive(1 + (reply_bytes if ok else 0), deadline))
        if status in (Status.BAD_CRC, Status.FRAME):
            raise LinkCrcError(f"the bridge received a corrupted request ({status.name})", status)
        if status != Status.OK:
            raise BridgeStatusError(f"the bridge answered {status.name}", status)
        return data

    def _receive(self, size, deadline):
        data = bytearray()
        while len(data) < size:
            data += self.serial.read(size - len(data))
            if len(data) < size and time.monotonic() >= deadline:
                raise LinkTimeoutError(f"no complete reply within {self.timeout} s: got "
                                       f"{len(data)} of {size} bytes")
        return bytes(data)

    def _resynchronize(self):
        """Wait until the bridge has seen a quiet line for twice its frame timeout (so it has
        dropped any partial frame and ended its quiet period), then drop stale input."""
        quiet_until = (max(time.monotonic(), self._line_free_at)
                       + 2 * FRAME_TIMEOUT_BITS / self.baud)
        time.sleep(max(0.0, quiet_until - time.monotonic()))
        self.serial.reset_input_buffer()


def _check_span(address, size):
    if not (isinstance(address, int) and address >= 0):
        raise ValueError(f"address={address!r} is invalid: allowed an integer >= 0")
    if not (isinstance(size, int) and 0 <= size and address + size <= 1 << 32):
        raise ValueError(f"size={size!r} is invalid: allowed 0..2**32 - address")


def _check_registers(offset, count):
    if not (isinstance(offset, int) and 0 <= offset < REGISTER_SPACE and offset % 4 == 0):
        raise ValueError(f"offset={offset!r} is invalid: allowed a multiple of 4 below "
                         f"{REGISTER_SPACE:#x}")
    if not (isinstance(count, int) and 1 <= count <= (REGISTER_SPACE - offset) // 4):
        raise ValueError(f"count={count!r} is invalid: allowed 1..{(REGISTER_SPACE - offset) // 4}")
