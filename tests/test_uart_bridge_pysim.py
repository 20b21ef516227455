"""amaranth.sim tests of the UART bridge: a bit-level UART model on rx/tx, a memory on ``mem``
and the real register block on ``csr``; requests are built with the host's encoder."""
import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import memory, wiring
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.firmware.link import crc8, decode_reply, encode_request
from tpugen.hdl.csr import ControlRegisters
from tpugen.hdl.uart_bridge import UartBridge, UartRx, UartTx, bit_cycles
from tpugen.registers import ID_MAGIC, constant_registers, register
from tpugen.wire import (BUS_TIMEOUT_CYCLES, FRAME_TIMEOUT_BITS, MAX_WORDS, OP_BITS,
                         REGISTER_SPACE, REQUEST_SYNC, Op, Status)

BIT = 4
"""Clock cycles per bit of the bridge under test."""
BAUD = 1_000_000
MEMORY_BYTES = 1024
CONFIG = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
QUIET = (FRAME_TIMEOUT_BITS + 20) * BIT
MAX_CYCLES = 400_000


class Board(Elaboratable):
    """The bridge with a word memory of ``memory_bytes`` on ``mem``, its read data
    ``read_latency`` cycles after the read, and, with ``registers``, ControlRegisters on ``csr``
    (else ``csr`` is left unanswered). ``misuse`` latches a memory access without ``select``."""

    def __init__(self, bit=BIT, registers=True, memory_bytes=MEMORY_BYTES, read_latency=1):
        self.bit = bit
        self.read_latency = read_latency
        self.bridge = UartBridge(bit * BAUD, BAUD, memory_bytes, read_latency=read_latency)
        self.memory = memory.Memory(shape=32, depth=memory_bytes // 4, init=[])
        self.registers = ControlRegisters(CONFIG) if registers else None
        self.misuse = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = self.bridge
        m.submodules.memory = self.memory
        mem = bridge.mem
        write, read = self.memory.write_port(), self.memory.read_port()
        rdata = read.data
        for _ in range(self.read_latency - 1):
            rdata, was = Signal.like(rdata), rdata
            m.d.sync += rdata.eq(was)
        m.d.comb += [write.addr.eq(mem.addr), write.data.eq(mem.wdata),
                     write.en.eq(mem.select & mem.write),
                     read.addr.eq(mem.addr), read.en.eq(mem.select & mem.read),
                     mem.rdata.eq(rdata)]
        with m.If((mem.read | mem.write) & ~mem.select):
            m.d.sync += self.misuse.eq(1)
        if self.registers is not None:
            m.submodules.registers = self.registers
            wiring.connect(m, bridge.csr, self.registers.bus)
        return m


class Host:
    """The other end of the line: sends on the bridge's rx with ``send_bit`` cycles a bit, and
    decodes its tx in the background into ``received``."""

    def __init__(self, board, send_bit):
        self.board = board
        self.send_bit = send_bit
        self.bit = board.bit
        self.received = bytearray()

    async def listen(self, ctx):
        tx = self.board.bridge.tx
        while True:
            await ctx.negedge(tx)
            await ctx.tick().repeat(self.bit // 2)
            assert not ctx.get(tx), "glitch on tx"
            byte = 0
            for i in range(8):
                await ctx.tick().repeat(self.bit)
                byte |= ctx.get(tx) << i
            await ctx.tick().repeat(self.bit)
            assert ctx.get(tx), "tx stop bit low"
            self.received.append(byte)

    async def send(self, ctx, data, bad_stop_at=None):
        rx = self.board.bridge.rx
        for i, byte in enumerate(data):
            bits = [0, *(byte >> k & 1 for k in range(8)), int(i != bad_stop_at)]
            for bit in bits:
                ctx.set(rx, bit)
                await ctx.tick().repeat(self.send_bit)
        ctx.set(rx, 1)

    async def reply(self, ctx, data_bytes=0):
        """The next reply: (Status, data); a read's data follows only an OK status."""
        async def wait_for(size):
            for _ in range(60 * (size + 4)):
                if len(self.received) >= size:
                    return
                await ctx.tick().repeat(self.bit)
            raise AssertionError(f"no reply: got {self.received.hex()}")
        await wait_for(2)
        size = 3 + (data_bytes if self.received[1] == Status.OK else 0)
        await wait_for(size)
        frame = bytes(self.received[:size])
        del self.received[:size]
        return decode_reply(frame)

    async def transact(self, ctx, op, address, count, data=None):
        await self.send(ctx, encode_request(op, address, count, data))
        return await self.reply(ctx, 4 * count if op in (Op.MEM_READ, Op.REG_READ) else 0)

    async def silence(self, ctx, cycles=QUIET):
        """Wait ``cycles`` and check that no reply came meanwhile."""
        await ctx.tick().repeat(cycles)
        assert not self.received, f"unexpected reply {self.received.hex()}"


def simulate(body, board=None, send_bit=None):
    board = Board() if board is None else board
    host = Host(board, board.bit if send_bit is None else send_bit)

    async def testbench(ctx):
        await body(ctx, board, host)
        await host.silence(ctx, 50 * BIT)
        assert not ctx.get(board.misuse), "memory accessed without select"
        assert not ctx.get(board.bridge.mem.select), "select left high"

    async def watchdog(ctx):
        await ctx.delay(MAX_CYCLES * period)
        raise AssertionError(f"testbench still running after {MAX_CYCLES} cycles")

    period = 1 / (board.bit * BAUD)
    sim = Simulator(board)
    sim.add_clock(period)
    sim.add_testbench(testbench)
    sim.add_testbench(host.listen, background=True)
    sim.add_testbench(watchdog, background=True)
    sim.run()


def words(data):
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]


def test_parameters():
    with pytest.raises(ValueError, match="baud"):
        UartBridge(12_000_000, 3_000_001, 1024)  # fewer than 4 clocks a bit
    with pytest.raises(ValueError, match="baud"):
        UartRx(12_000_000, 2_500_000)  # 12 MHz / 5 = 2.4 MBd: 4% off
    with pytest.raises(ValueError, match="baud"):
        UartTx(12_000_000, 0)
    with pytest.raises(ValueError, match="clk_freq"):
        UartTx(-1, 9600)
    for memory_bytes in (0, 1022, 3 << 10, 2 * MAX_WORDS, 2 ** 32 + 4, 1024.0):
        with pytest.raises(ValueError, match="memory_bytes"):
            UartBridge(12_000_000, 115_200, memory_bytes)
    for read_latency in (0, True, 1.0):
        with pytest.raises(ValueError, match="read_latency"):
            UartBridge(12_000_000, 115_200, 1024, read_latency=read_latency)
    assert bit_cycles(12_000_000, 115_200) == 104
    assert bit_cycles(12_000_000, 3_000_000) == 4
    members = UartBridge(4 * BAUD, BAUD, 1024).signature.members
    assert members["csr"].signature.members["awvalid"].flow == wiring.Out
    assert members["csr"].signature.members["rdata"].flow == wiring.In
    assert members["mem"].signature.members["select"].flow == wiring.Out
    # The bridge decodes an op by its bits.
    for op in Op:
        bits = OP_BITS.from_bits(op)
        assert (bits.kind, bits.read, bits.register) == (
            Op.MEM_WRITE >> 2, op in (Op.MEM_READ, Op.REG_READ), op in (Op.REG_WRITE, Op.REG_READ))


@pytest.mark.parametrize("read_latency", [1, 2])
def test_memory_and_registers(read_latency):
    rng = random.Random(5)

    async def body(ctx, board, host):
        model = [0] * (MEMORY_BYTES // 4)
        for address, count in ((0, 1), (4 * 17, 5), (MEMORY_BYTES - 4 * MAX_WORDS, MAX_WORDS),
                               (MEMORY_BYTES - 4, 1), (4 * 33, 3)):
            data = rng.randbytes(4 * count)
            assert await host.transact(ctx, Op.MEM_WRITE, address, count, data) == (Status.OK, b"")
            model[address // 4:address // 4 + count] = words(data)
        assert [ctx.get(board.memory.data[i]) for i in range(MEMORY_BYTES // 4)] == model
        for address, count in ((0, 3), (4 * 30, 9), (MEMORY_BYTES - 8, 2)):
            status, data = await host.transact(ctx, Op.MEM_READ, address, count)
            assert status == Status.OK and words(data) == model[address // 4:address // 4 + count]

        constants = constant_registers(CONFIG)
        status, data = await host.transact(ctx, Op.REG_READ, 0, 6)
        assert status == Status.OK
        assert words(data) == [constants[name] for name in ("ID", "VERSION", "CONFIG0", "CONFIG1",
                                                            "SCRATCHPAD_ROWS", "ACCUMULATOR_ROWS")]
        assert words(data)[0] == ID_MAGIC
        base = register("PROGRAM_BASE").offset
        values = [0x1234_5678, 0x9ABC_DEF0, 0x0F0F_0F0F]
        written = b"".join(v.to_bytes(4, "little") for v in values)
        assert await host.transact(ctx, Op.REG_WRITE, base, 3, written) == (Status.OK, b"")
        assert ctx.get(board.registers.program_base) == values[0]
        assert ctx.get(board.registers.watchdog_limit) == values[2]
        assert await host.transact(ctx, Op.REG_READ, base, 3) == (Status.OK, written)

        # An unmapped register is a bus error; the next request needs no quiet period.
        assert await host.transact(ctx, Op.REG_READ, base, 4) == (Status.BUS_ERROR, b"")
        assert await host.transact(ctx, Op.REG_WRITE, 0x01C, 1, bytes(4)) == (Status.BUS_ERROR, b"")
        # Noise before SYNC is skipped.
        await host.send(ctx, bytes([0x00, 0xFF, 0xA5]))
        status, data = await host.transact(ctx, Op.REG_READ, 0, 1)
        assert (status, words(data)) == (Status.OK, [ID_MAGIC])

    simulate(body, Board(read_latency=read_latency))


@pytest.mark.parametrize("memory_bytes", [MEMORY_BYTES, 8 << 10])
def test_address_range_boundaries(memory_bytes):
    """An access may end exactly at the end of the memory or of the register space; one more
    word, or any address bit at or above the limit, is BAD_ADDRESS. Accesses in range step
    their address across 0x200 and 0x1000, where the range check splits the address."""
    rng = random.Random(11)
    end = memory_bytes
    cases = [  # op, address, count, status
        (Op.MEM_WRITE, end - 4 * MAX_WORDS, MAX_WORDS, Status.OK),
        (Op.MEM_READ, end - 4 * MAX_WORDS, MAX_WORDS, Status.OK),
        (Op.MEM_READ, end - 4 * MAX_WORDS + 4, MAX_WORDS, Status.BAD_ADDRESS),
        (Op.MEM_WRITE, end - 12, 3, Status.OK),
        (Op.MEM_WRITE, end - 12, 4, Status.BAD_ADDRESS),
        (Op.MEM_READ, end - 4, 1, Status.OK),
        (Op.MEM_READ, end, 1, Status.BAD_ADDRESS),
        (Op.MEM_WRITE, end * 2, 1, Status.BAD_ADDRESS),
        (Op.MEM_READ, 0x8000_0000, 1, Status.BAD_ADDRESS),
        (Op.MEM_READ, 0xFFFF_FFFC, 2, Status.BAD_ADDRESS),
        (Op.MEM_WRITE, 0x200 - 8, 4, Status.OK),
        (Op.MEM_READ, 0x200 - 8, 4, Status.OK),
        (Op.MEM_WRITE, 0x1000 - 8, 4, Status.OK if end > 0x1000 else Status.BAD_ADDRESS),
        (Op.MEM_READ, 0x1000 - 8, 4, Status.OK if end > 0x1000 else Status.BAD_ADDRESS),
        (Op.MEM_WRITE, 6, 1, Status.BAD_ADDRESS),
        # Nothing is mapped at the end of the register space: in range, a bus error.
        (Op.REG_READ, REGISTER_SPACE - 4, 1, Status.BUS_ERROR),
        (Op.REG_READ, REGISTER_SPACE - 4 * MAX_WORDS, MAX_WORDS, Status.BUS_ERROR),
        (Op.REG_READ, REGISTER_SPACE - 4 * MAX_WORDS + 4, MAX_WORDS, Status.BAD_ADDRESS),
        (Op.REG_READ, REGISTER_SPACE, 1, Status.BAD_ADDRESS),
        (Op.REG_WRITE, 1 << 16, 1, Status.BAD_ADDRESS),
        (Op.REG_READ, 0x8000_0000, 1, Status.BAD_ADDRESS),
    ]

    async def body(ctx, board, host):
        model = [0] * (memory_bytes // 4)
        for op, address, count, expected in cases:
            data = rng.randbytes(4 * count) if op in (Op.MEM_WRITE, Op.REG_WRITE) else None
            status, read = await host.transact(ctx, op, address, count, data)
            assert status == expected, (op, hex(address), count)
            if status == Status.OK and op == Op.MEM_WRITE:
                model[address // 4:address // 4 + count] = words(data)
            elif status == Status.OK:
                assert words(read) == model[address // 4:address // 4 + count]
            else:
                await host.silence(ctx)
        assert [ctx.get(board.memory.data[i]) for i in range(memory_bytes // 4)] == model

    simulate(body, Board(memory_bytes=memory_bytes))


def corrupt(frame, index):
    spoiled = bytearray(frame)
    spoiled[index] ^= 0x04
    return bytes(spoiled)


def test_bad_frames_are_refused_and_the_bridge_recovers():
    good = bytes(range(0x40, 0x48))
    write = encode_request(Op.MEM_WRITE, 8, 2, good)
    inner = encode_request(Op.MEM_WRITE, 0, 2, b"\xEE" * 8)
    refused = [
        (corrupt(write, 3), Status.BAD_CRC),                       # header: address byte
        (corrupt(write, len(write) - 3), Status.BAD_CRC),          # data
        (encode_request(0x14, 8, 2, inner[:8]), Status.BAD_OP),
        (encode_request(Op.MEM_READ, 8, 0), Status.BAD_LENGTH),
        (encode_request(Op.REG_READ, 0, MAX_WORDS + 1), Status.BAD_LENGTH),
        (encode_request(Op.MEM_READ, 8, 0x104), Status.BAD_LENGTH),  # 4 in the low byte
        (encode_request(Op.MEM_READ, 6, 1), Status.BAD_ADDRESS),
        (encode_request(Op.MEM_WRITE, MEMORY_BYTES - 4, 2, good), Status.BAD_ADDRESS),
        (encode_request(Op.REG_READ, 0xFFC, 2), Status.BAD_ADDRESS),
        # Refused at its header: the valid frame inside its data is never executed.
        (encode_request(0x00, 8, 5, inner + bytes(20 - len(inner))), Status.BAD_OP),
    ]

    async def body(ctx, board, host):
        for frame, status in refused:
            await host.send(ctx, frame)
            assert await host.reply(ctx) == (status, b"")
            await host.silence(ctx)
            assert ctx.get(board.memory.data[0]) == 0
            assert ctx.get(board.memory.data[2]) == 0

        # A framing error inside a frame answers FRAME; outside one it is ignored.
        await host.send(ctx, write, bad_stop_at=4)
        assert await host.reply(ctx) == (Status.FRAME, b"")
        await host.silence(ctx)
        await host.send(ctx, b"\x00", bad_stop_at=0)
        await host.silence(ctx, 100 * BIT)

        # A request inside the quiet period after an error is ignored.
        await host.send(ctx, corrupt(write, 2))
        assert await host.reply(ctx) == (Status.BAD_CRC, b"")
        await host.send(ctx, write)
        await host.silence(ctx)

        # A truncated frame is dropped silently after the frame timeout.
        await host.send(ctx, write[:-3])
        await host.silence(ctx)
        assert ctx.get(board.memory.data[2]) == 0
        assert await host.transact(ctx, Op.MEM_WRITE, 8, 2, good) == (Status.OK, b"")
        assert await host.transact(ctx, Op.MEM_READ, 8, 2) == (Status.OK, good)

    simulate(body)


def test_register_bus_timeout():
    async def body(ctx, board, host):
        await host.send(ctx, encode_request(Op.REG_READ, 0, 1))
        started = 0
        while len(host.received) < 3:
            await ctx.tick()
            started += 1
        assert BUS_TIMEOUT_CYCLES <= started < BUS_TIMEOUT_CYCLES + 60 * BIT
        assert await host.reply(ctx) == (Status.BUS_ERROR, b"")
        assert await host.transact(ctx, Op.REG_WRITE, 0x40, 1, bytes(4)) == (Status.BUS_ERROR, b"")
        assert await host.transact(ctx, Op.MEM_WRITE, 0, 1, b"\x01\x02\x03\x04") == (Status.OK, b"")
        assert not ctx.get(board.bridge.csr.arvalid) and not ctx.get(board.bridge.csr.awvalid)

    simulate(body, Board(registers=False))


@pytest.mark.parametrize("host_bit", [31, 33])
def test_rx_samples_mid_bit(host_bit):
    """A 32-clock bit; the host's bits are 3% short or long, and the frame still arrives."""
    async def body(ctx, board, host):
        data = bytes([0x55, 0xAA, REQUEST_SYNC, 0xFF])
        await host.send(ctx, encode_request(Op.MEM_WRITE, 4, 1, data))
        assert await host.reply(ctx) == (Status.OK, b"")
        assert ctx.get(board.memory.data[1]) == int.from_bytes(data, "little")

    simulate(body, Board(bit=32), send_bit=host_bit)


def test_reply_crc_covers_status_and_data():
    """The bytes on tx, checked here without the host's decoder."""
    async def body(ctx, board, host):
        await host.send(ctx, encode_request(Op.REG_READ, 0, 1))
        await ctx.tick().repeat(10 * BIT * 8)
        frame = bytes(host.received)
        host.received.clear()
        assert frame == bytes([0xA5, Status.OK]) + ID_MAGIC.to_bytes(4, "little") + \
            bytes([crc8(bytes([Status.OK]) + ID_MAGIC.to_bytes(4, "little"))])

    simulate(body)
