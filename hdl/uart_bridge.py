"""The host link of a board: an 8N1 UART and a bridge from framed requests to the board's memory
and the core's registers. The protocol is described in ``docs/uart-protocol.md``; its constants
and layouts are `tpugen.wire`."""
from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..config import power_of_two
from ..registers import ADDR_WIDTH as CSR_ADDR_WIDTH
from ..wire import (BUS_TIMEOUT_CYCLES, CRC, FRAME_TIMEOUT_BITS, MAX_WORDS, OP_BITS,
                    REGISTER_SPACE, REPLY_SYNC, REQUEST_SYNC, Header, Op, Status)
from .axi import AXI_RESP_OKAY, axi_lite_signature, memory_host_signature
from .pipeline import SRAM_ATTRS, delayed

__all__ = ["UartBridge", "UartRx", "UartTx", "bit_cycles"]


def bit_cycles(clk_freq, baud):
    """Clock cycles per bit: at least 4, with a baud rate error of at most 2%."""
    if not (isinstance(clk_freq, (int, float)) and clk_freq > 0):
        raise ValueError(f"clk_freq={clk_freq!r} is invalid: allowed a positive frequency in Hz")
    if not (isinstance(baud, (int, float)) and baud > 0):
        raise ValueError(f"baud={baud!r} is invalid: allowed a positive rate in bit/s")
    if clk_freq // baud < 4:
        raise ValueError(f"baud={baud!r} is invalid: allowed at most clk_freq / 4 "
                         f"= {clk_freq / 4:g}")
    cycles = round(clk_freq / baud)
    if abs(clk_freq / cycles - baud) > 0.02 * baud:
        raise ValueError(f"baud={baud!r} is invalid: clk_freq / {cycles} = "
                         f"{clk_freq / cycles:g} is more than 2% off")
    return cycles


class UartRx(wiring.Component):
    """8N1 receiver. ``rx`` passes a 2-flop synchronizer; each bit is sampled mid-bit.

    A byte is offered on ``data`` for one cycle (no backpressure; ``data.payload`` is the shift
    register, which holds the byte until the next one's first data bit); a low stop bit pulses
    ``frame_error`` instead, and the receiver then waits for the line to go high.
    """

    def __init__(self, clk_freq, baud):
        self.divisor = bit_cycles(clk_freq, baud)
        super().__init__({
            "rx": In(1, init=1),
            "data": Out(stream.Signature(8, always_ready=True)),
            "frame_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.synchronizer = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor))
        tick = timer == 0
        bit = Signal(range(8))
        shift = Signal(8)
        m.d.comb += self.data.payload.eq(shift)
        m.d.sync += [self.data.valid.eq(0), self.frame_error.eq(0),
                     timer.eq(Mux(tick, self.divisor - 1, timer - 1))]
        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += timer.eq(self.divisor // 2 - 1)
                with m.If(~rx):
                    m.next = "START"
            with m.State("START"):
                with m.If(tick & rx):
                    m.next = "IDLE"
                with m.Elif(tick):
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(tick):
                    m.d.sync += [shift.eq(Cat(shift[1:], rx)), bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(tick):
                    with m.If(rx):
                        m.d.sync += self.data.valid.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += self.frame_error.eq(1)
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """8N1 transmitter: takes a byte from ``data`` whenever idle; ``tx`` idles high."""

    def __init__(self, clk_freq, baud):
        self.divisor = bit_cycles(clk_freq, baud)
        super().__init__({
            "data": In(stream.Signature(8)),
            "tx": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        tick = timer == 0
        remaining = Signal(range(10))
        shift = Signal(9)
        m.d.sync += timer.eq(Mux(tick, self.divisor - 1, timer - 1))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.data.ready.eq(1)
                with m.If(self.data.valid):
                    m.d.sync += [self.tx.eq(0), shift.eq(Cat(self.data.payload, 1)),
                                 remaining.eq(9), timer.eq(self.divisor - 1)]
                    m.next = "SEND"
            with m.State("SEND"):
                with m.If(tick):
                    m.d.sync += [self.tx.eq(shift[0]), shift.eq(shift[1:]),
                                 remaining.eq(remaining - 1)]
                    with m.If(remaining == 0):
                        m.d.sync += self.tx.eq(1)
                        m.next = "IDLE"
        return m


class UartBridge(wiring.Component):
    """Executes framed requests from ``rx`` on the memory port ``mem`` or the AXI4-Lite master
    ``csr``, and answers on ``tx`` (docs/uart-protocol.md).

    A request is executed only after its header CRC and data CRC check: write data waits in a
    ``4 * MAX_WORDS``-byte buffer, read data is collected there before the reply. ``mem.select``
    is high only while a memory request executes. ``memory_bytes`` is a power of two, at least
    the buffer (the range check relies on both, as on REGISTER_SPACE being one).
    ``read_latency``: the memory's cycles from a read to its data (`AxiMemory.host_read_latency`).
    """

    def __init__(self, clk_freq, baud, memory_bytes, read_latency=1):
        self.divisor = bit_cycles(clk_freq, baud)
        if not (isinstance(memory_bytes, int) and 4 * MAX_WORDS <= memory_bytes <= 1 << 32
                and power_of_two(memory_bytes)):
            raise ValueError(f"memory_bytes={memory_bytes!r} is invalid: allowed a power of two "
                             f"in {4 * MAX_WORDS}..2**32")
        self.clk_freq = clk_freq
        self.baud = baud
        self.memory_bytes = memory_bytes
        if isinstance(read_latency, bool) or not isinstance(read_latency, int) or read_latency < 1:
            raise ValueError(f"read_latency={read_latency!r} is invalid: allowed an integer >= 1")
        self.read_latency = read_latency
        super().__init__({
            "rx": In(1, init=1),
            "tx": Out(1, init=1),
            "csr": Out(axi_lite_signature(CSR_ADDR_WIDTH)),
            "mem": Out(memory_host_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.receiver = receiver = UartRx(self.clk_freq, self.baud)
        m.submodules.transmitter = transmitter = UartTx(self.clk_freq, self.baud)
        m.d.comb += [receiver.rx.eq(self.rx), self.tx.eq(transmitter.tx)]
        got, byte = receiver.data.valid, receiver.data.payload
        reply = transmitter.data

        # It writes at `pointer` only as the pointer steps, reading at the next: `SRAM_ATTRS`.
        m.submodules.buffer = buffer = memory.Memory(shape=8, depth=4 * MAX_WORDS, init=[],
                                                     attrs=SRAM_ATTRS)
        buffer_write = buffer.write_port()
        buffer_read = buffer.read_port()
        # Byte pointer into the buffer; the read port is addressed with the next value, so
        # buffer_read.data is always the byte at `pointer`. It restarts at 0 before each use (in
        # HUNT, on leaving a check or answering, in the reply's SYNC and STATUS) and steps by
        # one, at the data's CRC to one past the data.
        pointer = Signal(range(4 * MAX_WORDS + 2))
        restart, step = Signal(), Signal()
        pointer_next = Mux(restart, 0, pointer + step)
        m.d.comb += [buffer_read.addr.eq(pointer_next), buffer_write.addr.eq(pointer)]
        m.d.sync += pointer.eq(pointer_next)

        # The header as kept: the op; the address up to the larger limit's bit, and whether a
        # bit above it is set; the count up to MAX_WORDS's bit, and whether one above it is set
        # (the checks need no more); not the CRC byte (the CRC checks itself as it comes).
        count_bits = exact_log2(MAX_WORDS)
        address_bits = max(REGISTER_SPACE, self.memory_bytes).bit_length()
        header = Signal(data.StructLayout({
            "op": OP_BITS, "address": address_bits, "address_above": 1,
            "count": count_bits + 1, "count_above": 1}))
        status = Signal(range(max(Status) + 1))
        word = Signal(32)

        # The CRC of a frame or a reply (`wire.CRC`): cleared by `crc_clear`, a byte added by
        # `crc_add`.
        m.submodules.crc = crc = CRC.create()
        crc_add, crc_clear, crc_byte = Signal(), Signal(), Signal(8)
        crc_ok = crc.match_detected
        m.d.comb += [crc_byte.eq(byte), crc.start.eq(crc_clear), crc.valid.eq(crc_add),
                     crc.data.eq(crc_byte)]

        # The header's checks, in order. `is_read` and `is_register` hold for a known op.
        op = header.op
        known_op = op.kind == Op.MEM_WRITE >> 2
        is_read, is_register = op.read, op.register
        # COUNT is 1..MAX_WORDS, a power of two.
        count = header.count
        count_ok = ~header.count_above & (count != 0) & (count <= MAX_WORDS)
        data_end = Cat(Const(0, 2), count)
        # ADDRESS + 4 * COUNT <= limit, for a limit of 2**n words: the word address W < 2**n
        # (no bit at or above the limit's set), and W + COUNT <= 2**n, which only the last
        # MAX_WORDS words can fail: when W's bits count_bits..n are all ones, the tail
        # W % MAX_WORDS + COUNT <= MAX_WORDS decides.
        tail = header.address[2:2 + count_bits] + count
        tail_fits = ~tail[count_bits] | (tail[:count_bits] == 0)

        def in_range(limit):
            bits = exact_log2(limit)
            return ((header.address[bits:] == 0) & ~header.address_above
                    & (~header.address[2 + count_bits:bits].all() | tail_fits))

        address_ok = ((header.address[:2] == 0)
                      & Mux(is_register, in_range(REGISTER_SPACE), in_range(self.memory_bytes)))
        # An access in range steps its address up to ADDRESS + 4 * COUNT <= limit: only the
        # bits up to the larger limit's one change (with 4 GiB of memory, all of them).
        word_address = header.address[2:]

        # Silence on the line: ends a stalled frame, and the quiet period after an error.
        timeout = FRAME_TIMEOUT_BITS * self.divisor
        silence = Signal(range(timeout + 1))
        quiet = silence == timeout
        draining = Signal()
        with m.If(got | receiver.frame_error):
            m.d.sync += silence.eq(0)
        with m.Elif(~quiet):
            m.d.sync += silence.eq(silence + 1)
        with m.If(quiet):
            m.d.sync += draining.eq(0)

        csr = self.csr
        bus_timer = Signal(range(BUS_TIMEOUT_CYCLES + 1))
        bus_timeout = bus_timer == BUS_TIMEOUT_CYCLES
        m.d.comb += [csr.awaddr.eq(header.address), csr.araddr.eq(header.address),
                     csr.wdata.eq(word), csr.wstrb.eq(0b1111), csr.bready.eq(1), csr.rready.eq(1),
                     self.mem.addr.eq(header.address[2:]), self.mem.wdata.eq(word)]
        with m.If(csr.awready):
            m.d.sync += csr.awvalid.eq(0)
        with m.If(csr.wready):
            m.d.sync += csr.wvalid.eq(0)
        with m.If(csr.arready):
            m.d.sync += csr.arvalid.eq(0)

        # The memory port's controls are registers (a request is presented the cycle after
        # the state that decides it, and `select` rises a cycle after a memory request
        # starts): they reach every block RAM of the board memory (the 8x8 board system's
        # critical path ran from the request's header through `select` to their addresses).
        mem_select, mem_read, mem_write = Signal(), Signal(), Signal()
        read_arrives = delayed(m, mem_read, self.read_latency)

        def answer(code):
            m.d.sync += [status.eq(code), draining.eq(code not in (Status.OK, Status.BUS_ERROR))]
            m.d.comb += restart.eq(1)
            m.next = "REPLY_SYNC"

        def next_word():
            m.d.sync += word_address.eq(word_address + 1)
            m.next = "WORD"

        with m.FSM() as fsm:
            with m.State("HUNT"):
                m.d.comb += [crc_clear.eq(1), restart.eq(1)]
                with m.If(got & (byte == REQUEST_SYNC) & ~draining):
                    m.next = "HEADER"
            with m.State("HEADER"):
                with m.If(receiver.frame_error):
                    answer(Status.FRAME)
                with m.Elif(got):
                    m.d.comb += [crc_add.eq(1), step.eq(1)]
                    _keep_header_byte(m, header, pointer, byte)
                    with m.If(pointer == Header.size // 8 - 1):
                        m.next = "CHECK_HEADER"
                with m.Elif(quiet):
                    m.next = "HUNT"
            with m.State("CHECK_HEADER"):
                with m.If(~crc_ok):
                    answer(Status.BAD_CRC)
                with m.Elif(~known_op):
                    answer(Status.BAD_OP)
                with m.Elif(~count_ok):
                    answer(Status.BAD_LENGTH)
                with m.Elif(~address_ok):
                    answer(Status.BAD_ADDRESS)
                with m.Else():
                    m.d.comb += restart.eq(1)
                    m.next = "DATA"
                    with m.If(is_read):
                        m.next = "WORD"
            with m.State("DATA"):
                with m.If(receiver.frame_error):
                    answer(Status.FRAME)
                with m.Elif(got):
                    m.d.comb += [crc_add.eq(1), step.eq(1)]
                    with m.If(pointer == data_end):
                        m.next = "CHECK_DATA"
                    with m.Else():
                        m.d.comb += [buffer_write.en.eq(1), buffer_write.data.eq(byte)]
                with m.Elif(quiet):
                    m.next = "HUNT"
            with m.State("CHECK_DATA"):
                with m.If(~crc_ok):
                    answer(Status.BAD_CRC)
                with m.Else():
                    m.d.comb += restart.eq(1)
                    m.next = "WORD"

            with m.State("WORD"):
                m.d.sync += bus_timer.eq(0)
                with m.If(pointer == data_end):
                    answer(Status.OK)
                with m.Elif(~is_read):
                    m.next = "FETCH"
                with m.Elif(is_register):
                    m.d.sync += csr.arvalid.eq(1)
                    m.next = "REG_READ"
                with m.Else():
                    m.d.sync += mem_read.eq(1)
                    m.next = "MEM_READ"
            with m.State("FETCH"):
                m.d.sync += word.eq(Cat(word[8:], buffer_read.data))
                m.d.comb += step.eq(1)
                with m.If(pointer[:2] == 3):
                    with m.If(is_register):
                        m.d.sync += [csr.awvalid.eq(1), csr.wvalid.eq(1)]
                        m.next = "REG_WRITE"
                    with m.Else():
                        m.d.sync += mem_write.eq(1)
                        m.next = "MEM_WRITE"
            with m.State("MEM_WRITE"):
                m.d.sync += mem_write.eq(0)
                next_word()
            with m.State("MEM_READ"):
                # `mem.read` is high in the first cycle; the data arrives `read_latency` later.
                m.d.sync += mem_read.eq(0)
                with m.If(read_arrives):
                    m.d.sync += word.eq(self.mem.rdata)
                    m.next = "STORE"
            with m.State("STORE"):
                m.d.comb += [buffer_write.en.eq(1), buffer_write.data.eq(word[:8]),
                             step.eq(1)]
                m.d.sync += word.eq(Cat(word[8:], buffer_read.data))
                with m.If(pointer[:2] == 3):
                    next_word()
            with m.State("REG_WRITE"):
                m.d.sync += bus_timer.eq(bus_timer + 1)
                with m.If(csr.bvalid):
                    with m.If(csr.bresp == AXI_RESP_OKAY):
                        next_word()
                    with m.Else():
                        answer(Status.BUS_ERROR)
                with m.Elif(bus_timeout):
                    m.d.sync += [csr.awvalid.eq(0), csr.wvalid.eq(0)]
                    answer(Status.BUS_ERROR)
            with m.State("REG_READ"):
                m.d.sync += bus_timer.eq(bus_timer + 1)
                with m.If(csr.rvalid):
                    m.d.sync += word.eq(csr.rdata)
                    with m.If(csr.rresp == AXI_RESP_OKAY):
                        m.next = "STORE"
                    with m.Else():
                        answer(Status.BUS_ERROR)
                with m.Elif(bus_timeout):
                    m.d.sync += csr.arvalid.eq(0)
                    answer(Status.BUS_ERROR)

            with m.State("REPLY_SYNC"):
                m.d.comb += [reply.payload.eq(REPLY_SYNC), reply.valid.eq(1), crc_clear.eq(1),
                             restart.eq(1)]
                with m.If(reply.ready):
                    m.next = "REPLY_STATUS"
            with m.State("REPLY_STATUS"):
                m.d.comb += [reply.payload.eq(status), reply.valid.eq(1), restart.eq(1)]
                with m.If(reply.ready):
                    m.d.comb += [crc_byte.eq(reply.payload), crc_add.eq(1)]
                    m.next = "REPLY_CRC"
                    with m.If((status == Status.OK) & is_read):
                        m.next = "REPLY_DATA"
            with m.State("REPLY_DATA"):
                m.d.comb += [reply.payload.eq(buffer_read.data), reply.valid.eq(1)]
                with m.If(reply.ready):
                    m.d.comb += [crc_byte.eq(reply.payload), crc_add.eq(1), step.eq(1)]
                    with m.If(pointer + 1 == data_end):
                        m.next = "REPLY_CRC"
            with m.State("REPLY_CRC"):
                m.d.comb += [reply.payload.eq(crc.crc), reply.valid.eq(1)]
                with m.If(reply.ready):
                    m.next = "HUNT"

        executing = Cat(fsm.ongoing(state) for state in
                        ("WORD", "FETCH", "MEM_WRITE", "MEM_READ", "STORE")).any()
        m.d.sync += mem_select.eq(executing & ~is_register)
        m.d.comb += [self.mem.select.eq(mem_select), self.mem.read.eq(mem_read),
                     self.mem.write.eq(mem_write)]
        return m


def _keep_header_byte(m, header, index, byte):
    """Statements that keep byte ``index`` of a request's `Header` (wire order) in ``header``,
    the bridge's kept form (`UartBridge`): the bits it has, and of the others whether any is
    set."""
    fields = {"op": (Header["op"].offset, header.op.as_value(), None),
              "address": (Header["address"].offset, header.address, header.address_above),
              "count": (Header["count"].offset, header.count, header.count_above)}
    with m.Switch(index):
        for name, (offset, kept, above) in fields.items():
            width = Shape.cast(Header[name].shape).width
            for first in range(offset, offset + width, 8):
                with m.Case(first // 8):
                    low = first - offset  # the field's bit of this byte's bit 0
                    keeps = max(0, min(8, len(kept) - low))
                    if keeps:
                        m.d.sync += kept[low:low + keeps].eq(byte[:keeps])
                    if above is not None:  # set by this byte's bits past the kept ones
                        more = byte[keeps:].any() if keeps < 8 else 0
                        m.d.sync += above.eq(more if low == 0 else above | more)
