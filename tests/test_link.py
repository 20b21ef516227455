"""The host side of the UART link (firmware/link.py) against a Python model of the bridge."""
import math
import random
import time

import pytest

from tpugen.firmware.link import (BridgeStatusError, LinkCrcError, LinkTimeoutError, SerialLink,
                                  crc8, decode_reply, encode_request)
from tpugen.firmware.transport import TransportError
from tpugen.registers import ID_MAGIC, REGISTERS, register
from tpugen.wire import (FRAME_TIMEOUT_BITS, MAX_WORDS, REGISTER_SPACE, REPLY_SYNC, REQUEST_SYNC,
                         Op, Status)

HEADER_BYTES = 9
CONTROL_START = register("CONTROL").value(start=1)
STATUS_BUSY = register("STATUS").value(busy=1)


class FakeBridge:
    """docs/uart-protocol.md in Python behind pyserial's interface. Registers are a dict (a
    missing offset is a bus error); CONTROL.start makes STATUS busy for ``busy_polls`` reads.
    Each entry of ``faults`` spoils one request written (or its reply)."""

    def __init__(self, memory_bytes=4096, baudrate=100_000, busy_polls=3):
        self.baudrate = baudrate
        self.memory = bytearray(memory_bytes)
        self.registers = {reg.offset: reg.reset for reg in REGISTERS}
        self.registers[register("ID").offset] = ID_MAGIC
        self.busy_polls = busy_polls
        self.busy_left = 0
        self.faults = []
        self.executed = []
        self.requests = 0
        self._received = bytearray()
        self._output = bytearray()
        self._last_byte_at = -math.inf
        self._draining = False
        self._random = random.Random(1)

    # pyserial's interface
    def write(self, data):
        now = time.monotonic()
        if now - self._last_byte_at >= FRAME_TIMEOUT_BITS / self.baudrate:
            self._received.clear()
            self._draining = False
        self._last_byte_at = now
        self.requests += 1
        fault = self.faults.pop(0) if self.faults else None
        data = bytearray(data)
        if fault == "corrupt_request":
            data[self._random.randrange(1, len(data))] ^= 1 << self._random.randrange(8)
        elif fault == "truncate_request":
            del data[-1]
        replied = len(self._output)
        if not self._draining:
            self._received += data
            self._serve()
        if fault == "corrupt_reply":
            self._output[self._random.randrange(replied, len(self._output))] ^= 0x10
        elif fault == "drop_reply":
            del self._output[replied:]
        return len(data)

    def read(self, size):
        """At most 5 bytes a call, as a serial port whose bytes trickle in."""
        if not self._output:
            time.sleep(0.001)
        data = bytes(self._output[:min(size, 5)])
        del self._output[:len(data)]
        return data

    def reset_input_buffer(self):
        self._output.clear()

    # the bridge
    def _serve(self):
        while True:
            start = self._received.find(REQUEST_SYNC)
            if start < 0:
                self._received.clear()
                return
            del self._received[:start]
            if len(self._received) < HEADER_BYTES:
                return
            header = bytes(self._received[1:HEADER_BYTES])
            op, address, count = (header[0], int.from_bytes(header[1:5], "little"),
                                  int.from_bytes(header[5:7], "little"))
            refused = self._check(header, op, address, count)
            if refused is not None:
                return self._refuse(refused)
            size = HEADER_BYTES + (0 if op in (Op.MEM_READ, Op.REG_READ) else 4 * count + 1)
            if len(self._received) < size:
                return
            payload = bytes(self._received[HEADER_BYTES:size])
            del self._received[:size]
            if crc8(payload) != 0:
                return self._refuse(Status.BAD_CRC)
            self._reply(*self._execute(Op(op), address, count, payload[:-1]))

    def _check(self, header, op, address, count):
        limit = REGISTER_SPACE if op in (Op.REG_WRITE, Op.REG_READ) else len(self.memory)
        if crc8(header) != 0:
            return Status.BAD_CRC
        if op not in set(Op):
            return Status.BAD_OP
        if not 1 <= count <= MAX_WORDS:
            return Status.BAD_LENGTH
        if address % 4 or address + 4 * count > limit:
            return Status.BAD_ADDRESS
        return None

    def _refuse(self, status):
        self._reply(status, b"")
        self._draining = True
        self._received.clear()

    def _reply(self, status, data):
        body = bytes([status]) + data
        self._output += bytes([REPLY_SYNC]) + body + bytes([crc8(body)])

    def _execute(self, op, address, count, data):
        self.executed.append((op, address, count))
        if op == Op.MEM_WRITE:
            self.memory[address:address + 4 * count] = data
            return Status.OK, b""
        if op == Op.MEM_READ:
            return Status.OK, bytes(self.memory[address:address + 4 * count])
        read = bytearray()
        for i in range(count):
            offset = address + 4 * i
            if offset not in self.registers:
                return Status.BUS_ERROR, b""
            if op == Op.REG_WRITE:
                value = int.from_bytes(data[4 * i:4 * i + 4], "little")
                if offset == register("CONTROL").offset and value & CONTROL_START:
                    self.busy_left = self.busy_polls
                else:
                    self.registers[offset] = value
            elif offset == register("STATUS").offset:
                read += (STATUS_BUSY if self.busy_left else 0).to_bytes(4, "little")
                self.busy_left = max(0, self.busy_left - 1)
            else:
                read += self.registers[offset].to_bytes(4, "little")
        return Status.OK, bytes(read)


def make_link(fake=None, **kwargs):
    fake = FakeBridge() if fake is None else fake
    return fake, SerialLink(fake, clock_hz=1_000_000, **{"timeout": 0.05, **kwargs})


def ops(fake):
    return [op for op, _, _ in fake.executed]


def test_crc8():
    assert crc8(b"123456789") == 0xF4  # the catalogued check value of CRC-8/SMBUS
    assert crc8(b"") == 0
    rng = random.Random(0)
    for _ in range(50):
        message = rng.randbytes(rng.randrange(1, 40))
        assert crc8(message + bytes([crc8(message)])) == 0
        flipped = bytearray(message)
        flipped[rng.randrange(len(message))] ^= 1 << rng.randrange(8)
        assert crc8(flipped) != crc8(message)


def test_encode_request():
    header = bytes([Op.MEM_WRITE, 0x04, 0x03, 0x02, 0x01, 0x02, 0x00])
    data = bytes(range(8))
    frame = encode_request(Op.MEM_WRITE, 0x0102_0304, 2, data)
    assert frame == bytes([0x5A]) + header + bytes([crc8(header)]) + data + bytes([crc8(data)])
    # The examples of docs/uart-protocol.md.
    assert encode_request(Op.REG_READ, 0, 1).hex(" ") == "5a 13 00 00 00 00 01 00 a0"
    assert encode_request(Op.MEM_WRITE, 0x100, 2, bytes(range(1, 9))).hex(" ") == \
        "5a 10 00 01 00 00 02 00 9b 01 02 03 04 05 06 07 08 3e"
    assert decode_reply(bytes.fromhex("a5 00 47 55 50 54 ba")) == \
        (Status.OK, ID_MAGIC.to_bytes(4, "little"))
    assert decode_reply(bytes.fromhex("a5 01 07")) == (Status.BAD_CRC, b"")
    read = encode_request(Op.REG_READ, 0x24, 1)
    assert len(read) == HEADER_BYTES and crc8(read[1:]) == 0
    for kwargs, name in (({"op": 256}, "op"), ({"address": -4}, "address"),
                         ({"address": 1 << 32}, "address"), ({"count": 1 << 16}, "count")):
        with pytest.raises(ValueError, match=name):
            encode_request(**{"op": Op.MEM_READ, "address": 0, "count": 1, **kwargs})


def test_decode_reply():
    body = bytes([Status.OK]) + bytes(range(12))
    assert decode_reply(bytes([0xA5]) + body + bytes([crc8(body)])) == (Status.OK, bytes(range(12)))
    assert decode_reply(bytes([0xA5, Status.BAD_OP, crc8([Status.BAD_OP])])) == (Status.BAD_OP, b"")
    for frame, match in ((bytes([0x5A, 0, 0]), "start"), (bytes([0xA5, 0]), "start"),
                         (bytes([0xA5, 1, 0]), "CRC"),
                         (bytes([0xA5, 0x77, crc8([0x77])]), "status")):
        with pytest.raises(LinkCrcError, match=match):
            decode_reply(frame)


def test_parameters():
    fake = FakeBridge()
    for kwargs, name in (({"clock_hz": 0}, "clock_hz"), ({"baud": -1}, "baud"),
                         ({"timeout": 0}, "timeout"), ({"retries": -1}, "retries")):
        with pytest.raises(ValueError, match=name):
            SerialLink(fake, **{"clock_hz": 1e6, **kwargs})
    with pytest.raises(ValueError, match="baud"):
        SerialLink(object(), clock_hz=1e6)
    link = SerialLink(fake, clock_hz=1e6)
    assert link.baud == fake.baudrate
    for call, name in ((lambda: link.write_register(0x22, 0), "offset"),
                       (lambda: link.write_register(0x1000, 0), "offset"),
                       (lambda: link.write_register(0x40, 1 << 32), "value"),
                       (lambda: link.read_registers(0x40, 0), "count"),
                       (lambda: link.read_registers(0xFF8, 3), "count"),
                       (lambda: link.read_memory(-1, 4), "address"),
                       (lambda: link.write_memory((1 << 32) - 2, b"abc"), "size")):
        with pytest.raises(ValueError, match=name):
            call()
    assert fake.requests == 0


def test_memory_round_trips_and_splitting():
    fake, link = make_link(FakeBridge(memory_bytes=8192))
    model = bytearray(8192)
    rng = random.Random(2)
    for _ in range(60):
        address = rng.randrange(8192)
        size = rng.choice([0, 1, 2, 3, 4, 5, 7, rng.randrange(8192 - address + 1)])
        size = min(size, 8192 - address)
        if rng.random() < 0.5:
            data = rng.randbytes(size)
            link.write_memory(address, data)
            model[address:address + size] = data
        else:
            assert link.read_memory(address, size) == model[address:address + size]
        assert fake.memory == model
    fake.executed.clear()
    link.write_memory(4, bytes(4 * (2 * MAX_WORDS + 1)))
    assert fake.executed == [(Op.MEM_WRITE, 4, MAX_WORDS),
                             (Op.MEM_WRITE, 4 + 4 * MAX_WORDS, MAX_WORDS),
                             (Op.MEM_WRITE, 4 + 8 * MAX_WORDS, 1)]
    fake.executed.clear()
    assert link.read_memory(8192 - 4 * MAX_WORDS - 1, 4 * MAX_WORDS + 1) == \
        model[8192 - 4 * MAX_WORDS - 1:]
    assert fake.executed == [(Op.MEM_READ, 8192 - 4 * MAX_WORDS - 4, MAX_WORDS),
                             (Op.MEM_READ, 8188, 1)]


@pytest.mark.parametrize("address, size, reads", [
    (4, 8, []),                    # aligned: no read-modify-write
    (5, 2, [4]),                   # inside one word: read it once
    (6, 2, [4]),                   # ends on a word boundary: only the head
    (8, 3, [8]),                   # starts on a boundary: only the tail
    (2, 8, [0, 8]),                # head and tail words
    (3, 1, [0]),
])
def test_unaligned_writes_read_modify_write(address, size, reads):
    fake, link = make_link()
    background = bytes(random.Random(3).randbytes(32))
    fake.memory[:32] = background
    data = bytes(range(0xA0, 0xA0 + size))
    link.write_memory(address, data)
    expected = bytearray(background)
    expected[address:address + size] = data
    assert fake.memory[:32] == expected
    assert [a for op, a, _ in fake.executed if op == Op.MEM_READ] == reads
    written = [(a, n) for op, a, n in fake.executed if op == Op.MEM_WRITE]
    assert written == [(address & ~3, (-(-(address + size) // 4) * 4 - (address & ~3)) // 4)]


def test_registers():
    fake, link = make_link()
    assert link.read_registers(0, 1) == [ID_MAGIC]
    base = register("PROGRAM_BASE").offset
    link.write_register(base, 0xDEAD_BEEF)
    assert fake.registers[base] == 0xDEAD_BEEF
    assert link.read_registers(base, 3) == [0xDEAD_BEEF, 0, 65536]
    fake.registers.update({offset: offset * 7 + 1 for offset in range(0, REGISTER_SPACE, 4)})
    fake.executed.clear()
    status = register("STATUS").offset  # not busy: reads as 0
    assert link.read_registers(0x10, 2 * MAX_WORDS + 3) == \
        [0 if offset == status else offset * 7 + 1
         for offset in range(0x10, 0x10 + 4 * (2 * MAX_WORDS + 3), 4)]
    assert [n for _, _, n in fake.executed] == [MAX_WORDS, MAX_WORDS, 3]


def test_wait_interrupt_polls_status():
    fake, link = make_link(FakeBridge(busy_polls=3))
    link.write_register(register("CONTROL").offset, CONTROL_START)
    fake.executed.clear()
    assert link.wait_interrupt(10 ** 9) is True
    assert ops(fake) == [Op.REG_READ] * 4
    fake.busy_polls = 10 ** 9
    link.write_register(register("CONTROL").offset, CONTROL_START)
    started = time.monotonic()
    assert link.wait_interrupt(20_000) is False  # 20 ms at clock_hz=1 MHz
    assert 0.02 <= time.monotonic() - started < 1.0


@pytest.mark.parametrize("fault", ["corrupt_request", "truncate_request", "corrupt_reply",
                                   "drop_reply"])
def test_reads_and_memory_writes_retry(fault):
    fake, link = make_link()
    data = random.Random(4).randbytes(40)
    fake.faults = [fault, fault]
    link.write_memory(16, data)
    assert fake.memory[16:56] == data
    fake.faults = [fault]
    assert link.read_memory(16, 40) == data
    fake.faults = [fault]
    assert link.read_registers(0, 1) == [ID_MAGIC]
    assert fake.requests == 3 + 2 + 2  # each request failed as often as faults said


@pytest.mark.parametrize("fault, error, retried", [
    ("corrupt_request", LinkCrcError, True),       # the bridge said BAD_CRC: not executed
    ("truncate_request", LinkTimeoutError, False),
    ("corrupt_reply", LinkCrcError, False),
    ("drop_reply", LinkTimeoutError, False),
])
def test_register_writes_retry_only_when_not_executed(fault, error, retried):
    fake, link = make_link()
    offset = register("CONTROL").offset
    fake.faults = [fault]
    if retried:
        link.write_register(offset, CONTROL_START)
    else:
        with pytest.raises(error):
            link.write_register(offset, CONTROL_START)
    starts = [a for op, a, _ in fake.executed if op == Op.REG_WRITE]
    assert starts == ([] if fault == "truncate_request" else [offset])
    assert fake.requests == 1 + retried
    assert link.read_registers(0, 1) == [ID_MAGIC]  # the link is usable again at once


@pytest.mark.parametrize("fault, error", [("corrupt_request", LinkCrcError),
                                          ("drop_reply", LinkTimeoutError)])
def test_retries_run_out(fault, error):
    fake, link = make_link(retries=2)
    fake.faults = [fault] * 3
    with pytest.raises(error) as raised:
        link.read_memory(0, 8)
    assert isinstance(raised.value, TransportError)
    assert "3 attempt(s)" in "".join(raised.value.__notes__)
    assert fake.requests == 3
    assert link.read_memory(0, 8) == bytes(8)


def test_refusals_are_not_retried_and_leave_the_link_usable():
    fake, link = make_link(FakeBridge(memory_bytes=1024))
    with pytest.raises(BridgeStatusError) as raised:
        link.write_memory(1020, bytes(8))
    assert raised.value.status == Status.BAD_ADDRESS
    assert fake.requests == 1
    with pytest.raises(BridgeStatusError) as raised:
        link.read_registers(0x1C, 1)  # unmapped
    assert raised.value.status == Status.BUS_ERROR
    link.write_memory(0, b"\x01\x02\x03\x04")
    assert fake.memory[:4] == b"\x01\x02\x03\x04"
    assert fake.requests == 3  # each went through at the first attempt


def test_the_fake_drains_after_an_error():
    """A request sent inside the bridge's quiet period after an error is ignored: this is why
    SerialLink waits before a retry."""
    fake = FakeBridge(baudrate=1000)  # a 1 s frame timeout
    fake.write(encode_request(0x99, 0, 1))
    fake.write(encode_request(Op.MEM_READ, 0, 1))
    assert fake.read(100) == bytes([0xA5, Status.BAD_OP, crc8([Status.BAD_OP])])
    assert fake.read(100) == b""
