"""On-chip board memory (block RAM, or iCE40 UP5K SPRAM) behind an AXI4 slave and a host port."""
from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi import (ADDR_WIDTH, AXI_BURST_INCR, AXI_RESP_DECERR, AXI_RESP_OKAY, AXI_RESP_SLVERR,
                  ID_WIDTH, axi_read_signature, axi_write_signature, flat_ports,
                  memory_host_signature)
from .pipeline import SkidBuffer, delayed

__all__ = ["AxiBurst", "AxiMemory"]


SPRAM_BLOCKS = 4
"""SB_SPRAM256KA blocks (16K x 16 each) on the iCE40 UP5K."""
RAM_STYLES = {"bram": "block", "spram": "huge"}
"""Yosys ``ram_style`` per kind: EBR / DP16KD, or SB_SPRAM256KA (``synth_ice40 -spram``)."""

BURST_REQUEST = data.StructLayout({
    "id": ID_WIDTH, "addr": ADDR_WIDTH, "len": 8, "size": 3, "burst": 2})

_BEAT_INFO = data.StructLayout({"resp": 2, "last": 1, "id": ID_WIDTH})


class AxiBurst(wiring.Component):
    """The beats of AXI4 bursts, one after another: ``request`` takes an AR/AW, ``advance`` steps
    a beat.

    With ``slot`` a request taken while a burst runs waits in a one-entry slot
    (``request.ready`` is low while it is full) and starts in the cycle the running burst's last
    beat advances: bursts follow each other with no idle cycle. Without, a request is taken only
    while no burst runs (``request.ready`` is ``~active``): a cycle between bursts. ``resp`` is
    the current beat's response: SLVERR for every beat of a FIXED or WRAP burst or of a size
    wider than the bus; DECERR for a beat at or beyond ``size_bytes``; OKAY otherwise. ``word``
    is the beat's memory word. Narrow INCR bursts step by their size from the aligned address.

    A request is kept (in the slot and while it runs) as its address bits below ``size_bytes``
    and ``beyond``, set by any address bit above them or by a step carrying out of them and never
    cleared within the burst: a burst never wraps around into memory. ``next_word`` is the
    ``word`` of the next cycle (for a register of it beside the memory).
    """

    def __init__(self, data_width, size_bytes, *, slot=True):
        self.slot = slot
        self._offset_bits = exact_log2(data_width // 8)
        self._size_bits = exact_log2(size_bytes)
        super().__init__({
            "request": In(stream.Signature(BURST_REQUEST)), "advance": In(1),
            "active": Out(1), "id": Out(ID_WIDTH), "word": Out(self._size_bits - self._offset_bits),
            "next_word": Out(self._size_bits - self._offset_bits), "last": Out(1), "resp": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        address = data.StructLayout({"offset": self._offset_bits,
                                     "word": self._size_bits - self._offset_bits})
        kept = data.StructLayout({"id": ID_WIDTH, "addr": address, "beyond": 1, "len": 8,
                                  "size": 3, "unsupported": 1})
        payload, taken = self.request.payload, Signal(kept)  # the request as kept
        m.d.comb += [
            taken.id.eq(payload.id),
            taken.addr.eq(payload.addr[:self._size_bits]),
            taken.beyond.eq(payload.addr[self._size_bits:].any()),
            taken.len.eq(payload.len),
            taken.size.eq(payload.size),
            taken.unsupported.eq((payload.burst != AXI_BURST_INCR)
                                 | (payload.size > self._offset_bits)),
        ]
        burst = Signal(kept)  # the running burst; ``len`` counts the beats left
        low_mask = Signal(self._offset_bits)
        step = Signal(self._offset_bits + 1)
        stepped = Signal(data.StructLayout({"addr": address, "carry": 1}))
        m.d.comb += [
            low_mask.eq((Const(1) << burst.size) - 1),
            step.eq(Const(1) << burst.size),
            stepped.eq(Cat(burst.addr.offset & ~low_mask, burst.addr.word) + step),
            self.id.eq(burst.id),
            self.word.eq(burst.addr.word),
            self.last.eq(burst.len == 0),
            self.resp.eq(Mux(burst.unsupported, AXI_RESP_SLVERR,
                             Mux(burst.beyond, AXI_RESP_DECERR, AXI_RESP_OKAY))),
        ]
        if self.slot:
            waiting = Signal(kept)  # the request in the slot, while ``waiting_valid``
            waiting_valid = Signal()
            free = ~self.active | (self.advance & self.last)
            m.d.comb += self.request.ready.eq(~waiting_valid)
            with m.If(self.request.valid & ~waiting_valid & ~free):
                m.d.sync += [waiting.eq(taken), waiting_valid.eq(1)]
            with m.If(waiting_valid & free):
                m.d.sync += waiting_valid.eq(0)
        else:
            waiting, waiting_valid, free = taken, Const(0), ~self.active
            m.d.comb += self.request.ready.eq(free)
        with m.If(self.advance):
            m.d.sync += [
                burst.addr.eq(stepped.addr),
                burst.beyond.eq(burst.beyond | stepped.carry),
                burst.len.eq(burst.len - 1),
            ]
            with m.If(self.last):
                m.d.sync += self.active.eq(0)
        starting = free & (waiting_valid | self.request.valid)
        with m.If(starting):  # after the last beat: wins
            m.d.sync += [self.active.eq(1), burst.eq(Mux(waiting_valid, waiting, taken))]
        m.d.comb += self.next_word.eq(
            Mux(starting, Mux(waiting_valid, waiting.addr.word, taken.addr.word),
                Mux(self.advance, stepped.addr.word, burst.addr.word)))
        return m


class AxiMemory(wiring.Component):
    """``size_bytes`` of on-chip RAM at address 0, ``data_width`` bits a word: single-port, or
    with ``dual_port`` a read port and a write port (block RAM only).

    Ports: an AXI4 slave ``s_axi_*`` (the core's ``m_axi_*`` flipped, so a top connects them name
    by name) and ``host`` (``memory_host_signature()``, the UART bridge's side flipped).

    With ``dual_port`` one burst per direction at a time, answered in order, the next AR and AW
    accepted while it runs (`AxiBurst`), so bursts go back to back; a single port runs one
    burst at a time, a read or a write, the next a cycle after its last beat (AR and AW taken
    in turn when both wait). A read beat per cycle while RREADY is held (two output registers,
    so backpressure loses nothing), a write beat per cycle (WLAST is not checked: AWLEN
    counts; up to two B responses wait for BREADY). The host owns the ports in every cycle it
    is selected. With ``dual_port`` every block RAM input is a register (they are spread over
    the device): a W beat is written the cycle after its handshake, a host write the cycle
    after it, a host read's data comes two cycles after it (``host_read_latency``, else one),
    and the AXI side reads from the second cycle after the host lets go. No AXI output depends
    combinationally on an AXI input. FIXED and WRAP bursts answer SLVERR (reads zero, writes
    dropped); beats past the end DECERR, likewise; host accesses past the end read zero and
    write nothing; a host ``read`` together with ``write`` is a write. Contents start as zeros
    in simulation and are undefined on SPRAM.
    """

    def __init__(self, data_width, size_bytes, *, kind="bram", dual_port=False):
        if data_width not in (32, 64, 128):
            raise ValueError(f"data_width={data_width!r} is invalid: allowed 32, 64, 128")
        if kind not in RAM_STYLES:
            raise ValueError(f"kind={kind!r} is invalid: allowed {', '.join(RAM_STYLES)}")
        if (not isinstance(size_bytes, int) or size_bytes & (size_bytes - 1)
                or not data_width // 8 <= size_bytes <= 1 << ADDR_WIDTH):
            raise ValueError(f"size_bytes={size_bytes!r} is invalid: a power of two in "
                             f"{data_width // 8}..{1 << ADDR_WIDTH}")
        if kind == "spram":
            blocks = data_width // 16 * -(-size_bytes * 8 // data_width // 16384)
            if blocks > SPRAM_BLOCKS:
                raise ValueError(f"data_width={data_width!r} with size_bytes={size_bytes!r} is "
                                 f"invalid for kind='spram': needs {blocks} SB_SPRAM256KA "
                                 f"(16K x 16), the UP5K has {SPRAM_BLOCKS} (32 or 64 bits, "
                                 f"at most 128 KiB)")
        if dual_port and kind != "bram":
            raise ValueError(f"dual_port=True is invalid for kind={kind!r}: only for 'bram'")
        self.data_width, self.size_bytes, self.kind = data_width, size_bytes, kind
        self.dual_port = dual_port
        self.host_read_latency = 2 if dual_port else 1
        """Cycles from a host ``read`` to its ``rdata``."""
        super().__init__({
            **flat_ports("s_axi", axi_read_signature(data_width).flip()),
            **flat_ports("s_axi", axi_write_signature(data_width).flip()),
            "host": In(memory_host_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        width, lanes = self.data_width, self.data_width // 32
        axi = lambda name: getattr(self, f"s_axi_{name}")

        storage = memory.Memory(shape=width, depth=self.size_bytes * 8 // width, init=[],
                                attrs={"ram_style": RAM_STYLES[self.kind]})
        m.submodules.storage = storage
        write_port = storage.write_port(granularity=8)
        read_port = storage.read_port()

        if self.dual_port:  # a burst each way at a time, the next waiting in a slot
            m.submodules.reads = reads = AxiBurst(width, self.size_bytes)
            m.submodules.writes = writes = AxiBurst(width, self.size_bytes)
            for burst, channel in ((reads, "ar"), (writes, "aw")):
                m.d.comb += [burst.request.valid.eq(axi(f"{channel}valid")),
                             axi(f"{channel}ready").eq(burst.request.ready)]
                for field in BURST_REQUEST.members:
                    m.d.comb += getattr(burst.request.payload, field).eq(
                        axi(f"{channel}{field}"))
            read_active, write_active = reads.active, writes.active
        else:
            # A single port runs one burst at a time, a read or a write, with a cycle between
            # bursts. The channel it takes next (`serve_write`) is chosen a cycle ahead from
            # the VALIDs, which stay high until their handshake (no READY depends on a VALID):
            # the one offered, or with both the other kind than the last burst's (neither waits
            # for ever). One `AxiBurst` and no request slot (two of each cost 52 iCE40
            # flip-flops more at 32 bits and 128 KiB).
            m.submodules.bursts = reads = writes = AxiBurst(width, self.size_bytes, slot=False)
            serve_write, burst_writes = Signal(), Signal()  # the last burst's kind
            request = reads.request
            m.d.comb += [
                request.valid.eq(Mux(serve_write, axi("awvalid"), axi("arvalid"))),
                axi("arready").eq(request.ready & ~serve_write),
                axi("awready").eq(request.ready & serve_write),
                *(getattr(request.payload, field).eq(
                    Mux(serve_write, axi(f"aw{field}"), axi(f"ar{field}")))
                  for field in BURST_REQUEST.members),
            ]
            with m.If(request.valid & request.ready):
                m.d.sync += burst_writes.eq(serve_write)
            m.d.sync += serve_write.eq(Mux(axi("arvalid") & axi("awvalid"), ~burst_writes,
                                           axi("awvalid")))
            read_active = reads.active & ~burst_writes
            write_active = reads.active & burst_writes

        # Read beats: issued one cycle, data the next (`pending`), then a `SkidBuffer` to the R
        # channel (two registers, no read multiplexer as a FIFO's). A beat is issued while it has
        # room for it beside the one on its way, counting the R handshake of the cycle: a beat a
        # cycle goes on.
        beat_layout = data.StructLayout({"info": _BEAT_INFO, "data": width})
        pending, pending_info = Signal(), Signal(_BEAT_INFO)
        m.submodules.r_buffer = r_buffer = SkidBuffer(beat_layout)
        incoming, out = r_buffer.i.payload, r_buffer.o.payload
        taken = r_buffer.o.valid & axi("rready")
        owed = r_buffer.o.valid + ~r_buffer.i.ready + pending  # issued, not sent: at most 2
        read_wants = read_active & (owed - taken < 2)

        # Write responses (the worst beat's response, once the last beat is written) wait in
        # a queue, so that the next burst's beats go on while one waits for BREADY.
        m.submodules.b_queue = b_queue = fifo.SyncFIFO(width=_BEAT_INFO.size, depth=2)
        writing = write_active & b_queue.w_rdy
        host = self.host
        if self.dual_port:
            # The read address is a register loaded a cycle ahead (below), with the host's word
            # while it is selected: an AXI read waits a cycle after the host lets go.
            host_was_selected = Signal()
            m.d.sync += host_was_selected.eq(host.select)
            write_slot = ~host.select & writing
            write_beat = write_slot & axi("wvalid")
            read_issue = ~host_was_selected & read_wants
        else:
            write_slot = ~host.select & writing
            write_beat = write_slot & axi("wvalid")
            read_issue = ~host.select & read_wants
        m.d.comb += axi("wready").eq(write_slot)
        if self.dual_port:
            m.d.comb += [reads.advance.eq(read_issue), writes.advance.eq(write_beat)]
        else:
            m.d.comb += reads.advance.eq(read_issue | write_beat)

        m.d.sync += [
            pending.eq(read_issue),
            pending_info.resp.eq(reads.resp),
            pending_info.last.eq(reads.last),
            pending_info.id.eq(reads.id),
        ]
        m.d.comb += [
            r_buffer.i.valid.eq(pending),
            incoming.info.eq(pending_info),
            incoming.data.eq(Mux(pending_info.resp == AXI_RESP_OKAY, read_port.data, 0)),
            axi("rvalid").eq(r_buffer.o.valid),
            r_buffer.o.ready.eq(axi("rready")),
            axi("rdata").eq(out.data),
            axi("rresp").eq(out.info.resp),
            axi("rlast").eq(out.info.last),
            axi("rid").eq(out.info.id),
        ]

        worst = Signal(2)  # of the running burst's beats so far
        response, answer = _BEAT_INFO(b_queue.w_data), _BEAT_INFO(b_queue.r_data)
        m.d.comb += [
            response.resp.eq(Mux(writes.resp != AXI_RESP_OKAY, writes.resp, worst)),
            response.id.eq(writes.id),
            b_queue.w_en.eq(write_beat & writes.last),
            axi("bvalid").eq(b_queue.r_rdy), axi("bresp").eq(answer.resp), axi("bid").eq(answer.id),
            b_queue.r_en.eq(axi("bready")),
        ]
        with m.If(write_beat):
            m.d.sync += worst.eq(Mux(writes.last, AXI_RESP_OKAY, response.resp))

        # Host: a 32-bit lane of a word; the lane of a read is remembered until its data.
        lane = host.addr[:exact_log2(lanes)]
        host_in_range = host.addr[exact_log2(self.size_bytes // 4):] == 0
        read_lane = delayed(m, lane, self.host_read_latency)
        read_in_range = delayed(m, host_in_range, self.host_read_latency)
        m.d.comb += host.rdata.eq(Mux(read_in_range, read_port.data.word_select(read_lane, 32), 0))
        host_write = host.write & host_in_range
        host_strobes = Cat(Mux(host_write & (lane == i), 0b1111, 0) for i in range(lanes))

        host_word = host.addr[exact_log2(lanes):]
        axi_word, axi_data = writes.word, axi("wdata")
        axi_strobes = Mux(write_beat & (writes.resp == AXI_RESP_OKAY), axi("wstrb"), 0)
        if self.dual_port:
            # The block RAMs are spread over the device, so every input of theirs is a register:
            # the host's access or the AXI side's, chosen a cycle before (the 8x8 board system's
            # critical paths ran from the W handshake to their write enables, 23.2 ns, and from
            # the UART bridge's `select` through that choice to their addresses, 17.8 ns). A W
            # beat is written the cycle after its handshake, a host write the cycle after it is
            # presented; a read of the word a W beat wrote is issued a cycle after its B
            # response is sent at the earliest, when the write is done. A read's address is
            # `AxiBurst.next_word` of the cycle before, or the host's word, whose data comes a
            # cycle later than without the register (`host_read_latency`).
            issued = Signal(data.StructLayout({"word": len(writes.word), "data": width,
                                               "strobes": width // 8}))
            m.d.sync += [
                issued.word.eq(Mux(host.select, host_word, axi_word)),
                issued.data.eq(Mux(host.select, Cat([host.wdata] * lanes), axi_data)),
                issued.strobes.eq(Mux(host.select, host_strobes, axi_strobes)),
            ]
            # With a read port of its own the block RAMs read every cycle: what a read issued
            # is taken when its data comes (`pending`, the host's rdata), and the enable of every
            # block RAM is not on a path from the requests (the 8x8 board system's, 19.2 ns,
            # ran from the UART bridge's read request into it).
            read_word = Signal(range(storage.depth))
            m.d.sync += read_word.eq(Mux(host.select, host_word, reads.next_word))
            m.d.comb += [
                read_port.addr.eq(read_word),
                read_port.en.eq(1),
                write_port.addr.eq(issued.word),
                write_port.data.eq(issued.data),
                write_port.en.eq(issued.strobes),
            ]
        else:
            # Yosys maps to SPRAM (read output unchanged while writing) only if it can prove
            # that no cycle both reads and writes, hence the host's read yields to its write.
            word = Signal(range(storage.depth))
            with m.If(host.select):
                m.d.comb += word.eq(host_word)
            with m.Elif(write_beat):
                m.d.comb += word.eq(axi_word)
            with m.Else():
                m.d.comb += word.eq(reads.word)
            m.d.comb += [
                read_port.addr.eq(word),
                read_port.en.eq(read_issue | (host.select & host.read & ~host.write)),
                write_port.addr.eq(word),
                write_port.data.eq(Mux(host.select, Cat([host.wdata] * lanes), axi_data)),
                write_port.en.eq(Mux(host.select, host_strobes, axi_strobes)),
            ]
        return m
