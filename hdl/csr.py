"""Control/status registers: the AXI4-Lite slave of the register map (`tpugen.registers`)."""
from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_config
from ..isa import ErrorCode, window_layout
from ..registers import (ADDR_WIDTH, COUNTERS, REGISTERS, absent_registers, constant_registers,
                         counter_names, narrow_registers, register)
from .axi import AXI_RESP_OKAY, AXI_RESP_SLVERR, axi_lite_signature

__all__ = ["ControlRegisters"]


class ControlRegisters(wiring.Component):
    """The register map of ``REGISTERS`` behind an AXI4-Lite slave ``bus``.

    AW and W are accepted together, the cycle after both are offered and the previous B has
    been taken, and the write happens then, from the bus: no copy of either (AXI4 lets a slave
    wait for both). One read at a time: the cycle after AR the decoded address is registered,
    R the cycle after that.
    ``start`` and ``soft_reset`` are one-cycle pulses. Writes to ``locked`` registers answer
    SLVERR and change nothing from ``start`` on while ``busy`` (and in the cycle after ``busy``
    falls: the lock is a register). ``windows`` are the checked form (`isa.window_layout`,
    within the ``2**config.address_width`` bytes of the address space) of the
    ``config.windows`` windows, registered from their registers; the registers of the others
    (`registers.absent_registers`) read 0 and ignore writes. ``irq`` is a level:
    ``irq_enable & (done or error pending in IRQ_STATUS)``. In the same cycle, an event wins
    over an acknowledge or ``start``, and ``soft_reset`` wins over an event. ERROR_CODE and
    ERROR_INDEX read ``error_code`` and ``error_index`` while STATUS.error is set (the
    controller holds them until the next START), else 0. The counters are
    inputs, or with ``config.counters_in_ram`` read from a `CounterMemory` (``counter_read``
    and ``counter_index`` held until ``counter_done``, ``counter_value`` then): R waits.
    """

    def __init__(self, config):
        check_config(config)
        self.config = config
        super().__init__({
            "bus": In(axi_lite_signature(ADDR_WIDTH, 32)),
            "start": Out(1),
            "soft_reset": Out(1),
            "irq_enable": Out(1),
            "program_base": Out(32),
            "program_length": Out(32),
            "windows": Out(data.ArrayLayout(window_layout(config.address_width),
                                            config.windows)),
            "watchdog_limit": Out(32),
            "irq": Out(1),
            "busy": In(1),
            "done_event": In(1),
            "error_event": In(1),
            "error_code": In(ErrorCode),
            "error_index": In(config.index_width),
            **({"counter_index": Out(range(len(counter_names(config)))),
                "counter_read": Out(1),
                "counter_done": In(1),
                "counter_value": In(config.counter_width)} if config.counters_in_ram else
               {name: In(config.counter_width) for name in counter_names(config)}),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus

        # Configuration registers: storage for every rw register the core has, driving the outputs.
        absent = absent_registers(self.config)
        narrow = narrow_registers(self.config)
        storage = {reg.name: _Storage(reg, narrow.get(reg.name, 32))
                   for reg in REGISTERS if reg.access == "rw" and reg.name not in absent}
        store = {name: kept.value for name, kept in storage.items()}
        m.d.comb += [
            self.irq_enable.eq(store["IRQ_ENABLE"][0]),
            self.program_base.eq(store["PROGRAM_BASE"]),
            self.program_length.eq(store["PROGRAM_LENGTH"]),
            self.watchdog_limit.eq(store["WATCHDOG"]),
        ]
        # The windows' ends and enabled permissions, registered: current from the cycle after
        # their registers are written, which is no later than the cycle of the next write (it
        # waits for this write's B), so before any START that follows can take effect. In the
        # address space of ``width`` bits: not enabled if the base is beyond it, and the end's
        # top bit set if the window reaches past it (`window_end`).
        width = self.config.address_width
        for i in range(self.config.windows):
            base, size = store[f"WINDOW{i}_BASE"], store[f"WINDOW{i}_SIZE"]
            flags = register(f"WINDOW{i}_FLAGS").layout(store[f"WINDOW{i}_FLAGS"])
            total = base + size  # 33 bits: a window does not wrap
            end = Signal(width + 1, name=f"window{i}_end")
            enabled = size.any() & ~base[width:].any()
            read, write = Signal(name=f"window{i}_read"), Signal(name=f"window{i}_write")
            m.d.sync += [end.eq(Cat(total[:width], total[width:].any())),
                         read.eq(flags.read & enabled), write.eq(flags.write & enabled)]
            m.d.comb += [self.windows[i].base.eq(base), self.windows[i].end.eq(end),
                         self.windows[i].read.eq(read), self.windows[i].write.eq(write)]

        # Run state.
        done = Signal()
        error = Signal()
        pending = Signal(register("IRQ_STATUS").stored_layout)
        status = Signal(register("STATUS").layout)
        m.d.comb += [
            status.busy.eq(self.busy), status.done.eq(done), status.error.eq(error),
            self.irq.eq(self.irq_enable & (pending.done | pending.error)),
        ]

        # Write channel: AW and W taken together, a cycle after both are valid (AXI4 lets a
        # slave wait for both; VALID stays high until its handshake), so their payloads are
        # used as they are on the bus: no copy of the address or the data.
        accept = Signal()
        write = Signal()
        m.d.sync += accept.eq(bus.awvalid & bus.wvalid & ~accept & ~bus.bvalid)
        m.d.comb += [bus.awready.eq(accept), bus.wready.eq(accept), write.eq(accept)]
        aw_word, w_data, w_strb = bus.awaddr[2:], bus.wdata, bus.wstrb
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        w_bits = Signal(32)
        m.d.comb += w_bits.eq(w_data & Cat(bit.replicate(8) for bit in w_strb))
        start = Signal()
        soft_reset = Signal()
        ack = Signal()
        # The configuration is frozen from a START until the core is idle again. The lock is a
        # register, so the write enables depend on flip-flops only: set by the START write, held
        # through the pulse's cycle (the core shows busy from the cycle after it) and while busy,
        # and released the cycle after busy falls.
        locked = Signal()
        m.d.sync += locked.eq(start | self.start | self.busy)
        with m.If(write):
            m.d.sync += [bus.bvalid.eq(1), bus.bresp.eq(AXI_RESP_OKAY)]
            with m.Switch(aw_word):
                for reg in REGISTERS:
                    with m.Case(reg.offset // 4):
                        if reg.access == "rw":
                            target = storage.get(reg.name)
                            if reg.locked:
                                with m.If(locked):
                                    m.d.sync += bus.bresp.eq(AXI_RESP_SLVERR)
                            if target is not None:
                                enables = w_strb & ~locked.replicate(4) if reg.locked else w_strb
                                target.write(m, w_data, enables)
                        elif reg.name == "CONTROL":
                            control = reg.layout(w_bits)
                            m.d.comb += [start.eq(control.start),
                                         soft_reset.eq(control.soft_reset)]
                        elif reg.name == "IRQ_STATUS":
                            m.d.comb += ack.eq(1)
                with m.Default():
                    m.d.sync += bus.bresp.eq(AXI_RESP_SLVERR)

        m.d.sync += [self.start.eq(start), self.soft_reset.eq(soft_reset)]
        with m.If(start):
            m.d.sync += [done.eq(0), error.eq(0)]
        with m.If(ack):
            m.d.sync += pending.eq(pending.as_value() & ~w_bits)
        with m.If(self.done_event):
            m.d.sync += [done.eq(1), pending.done.eq(1)]
        with m.If(self.error_event):
            m.d.sync += [error.eq(1), pending.error.eq(1)]
        with m.If(soft_reset):
            m.d.sync += [done.eq(0), error.eq(0), pending.eq(0)]

        # Read channel.
        constants = constant_registers(self.config)
        values = {
            **{name: Const(value, 32) for name, value in constants.items()},
            **store,
            **{name: Const(0, 32) for name in absent},
            "CONTROL": Const(0, 32),
            "STATUS": status.as_value(),
            "IRQ_STATUS": pending.as_value(),
            # The controller holds the code and index of its error until the next START: read
            # while STATUS.error says they are this run's (no copy here).
            "ERROR_CODE": Mux(error, self.error_code, ErrorCode.NONE),
            "ERROR_INDEX": Mux(error, self.error_index, 0),
        }
        captures = {}
        present = counter_names(self.config)
        in_ram = self.config.counters_in_ram
        for name in COUNTERS:
            if name not in present:
                values[f"{name.upper()}_LO"] = values[f"{name.upper()}_HI"] = Const(0, 32)
                continue
            counter = self.counter_value if in_ram else getattr(self, name)
            values[f"{name.upper()}_LO"] = counter[:32]
            if self.config.counter_width == 64:
                high = Signal(32, name=f"{name}_hi")
                captures[f"{name.upper()}_LO"] = (high, counter[32:])
                values[f"{name.upper()}_HI"] = high
            else:
                values[f"{name.upper()}_HI"] = Const(0, 32)
        assert values.keys() == {reg.name for reg in REGISTERS}

        # R in two steps (AXI4-Lite allows any read latency): the cycle after AR, the one-hot
        # select of the registers that can read other than 0 registered (and RRESP: SLVERR at
        # an unmapped address, which reads 0); the next, RDATA as their AND-OR. A registered
        # select keeps the address decode out of every RDATA bit: registering the word instead
        # saves ~25 flip-flops, but then abc folds the decode into the bits: 871 to 1,917 ECP5
        # LUTs by the netlist's order (818 with the select), and a deeper path (the 8x8 board's
        # critical one at stop 42).
        # With `CoreConfig.counters_in_ram` the counters' _LO registers are one source, the
        # counter memory's value, and R waits for it (`CounterMemory`).
        lows = [f"{name.upper()}_LO" for name in present] if in_ram else []
        sources = [reg for reg in REGISTERS if not (isinstance(values[reg.name], Const)
                                                    and values[reg.name].value == 0)
                   and reg.name not in lows[1:]]
        word = bus.araddr[2:]
        selected = Signal(len(sources))
        decoded = Signal()  # an AR taken: RDATA from ``selected`` next
        m.d.comb += bus.arready.eq(~decoded & ~bus.rvalid)
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        with m.If(bus.arvalid & bus.arready):
            hit = {reg.name: word == reg.offset // 4 for reg in REGISTERS}
            if lows:
                hit[lows[0]] = _or(hit[name] for name in lows)
                m.d.sync += [self.counter_read.eq(hit[lows[0]]),
                             self.counter_index.eq(_or(Mux(hit[name], k, 0)
                                                       for k, name in enumerate(lows)))]
            m.d.sync += [decoded.eq(1),
                         selected.eq(Cat(hit[reg.name] for reg in sources)),
                         bus.rresp.eq(Mux(_or(hit.values()), AXI_RESP_OKAY, AXI_RESP_SLVERR))]
        waiting = self.counter_read & ~self.counter_done if lows else Const(0, 1)
        with m.If(decoded & ~waiting):
            m.d.sync += [decoded.eq(0), bus.rvalid.eq(1),
                         bus.rdata.eq(_or(selected[i].replicate(32) & values[reg.name]
                                          for i, reg in enumerate(sources)))]
            if lows:
                m.d.sync += self.counter_read.eq(0)
            for i, reg in enumerate(sources):
                if lows and reg.name == lows[0]:  # the counter memory's: the counter read
                    for k, name in enumerate(lows):
                        if name in captures:
                            high, source = captures[name]
                            with m.If(selected[i] & (self.counter_index == k)):
                                m.d.sync += high.eq(source)
                elif reg.name in captures:
                    high, source = captures[reg.name]
                    with m.If(selected[i]):
                        m.d.sync += high.eq(source)
        return m


class _Storage:
    """The flip-flops of rw register ``reg``, kept in ``bits`` bits (`registers.kept_value`):
    ``value`` is ``bits`` wide, or ``bits + 1`` with the bit for any written bit above them
    (one flip-flop per byte that holds such bits, so a write of some bytes is exact)."""

    def __init__(self, reg, bits):
        self.reg, self.bits = reg, bits
        self.low = Signal(bits, init=reg.reset & ((1 << bits) - 1), name=reg.name.lower())
        self.above = [Signal(name=f"{reg.name.lower()}_above{i}")
                      for i in range(4) if 8 * i + 8 > bits]
        self.value = Cat(self.low, Cat(self.above).any()) if self.above else self.low

    def write(self, m, data, strb):
        """Write the bytes of ``data`` that ``strb`` enables, within the register's mask: a
        flip-flop enable per byte, so no multiplexer per bit."""
        data = data & self.reg.mask
        above = iter(self.above)
        for i in range(4):
            split = min(max(8 * i, self.bits), 8 * i + 8)  # the byte's bits from here are above
            if not self.reg.mask >> 8 * i & 0xFF and split == 8 * i + 8:
                continue  # no field and no flag in this byte
            with m.If(strb[i]):
                if split > 8 * i:
                    m.d.sync += self.low[8 * i:split].eq(data[8 * i:split])
                if split < 8 * i + 8:
                    m.d.sync += next(above).eq(data[split:8 * i + 8].any())


def _or(values):
    """The bitwise OR of ``values``."""
    values = list(values)
    while len(values) > 1:
        values = [a | b for a, b in zip(values[::2], values[1::2])] + values[len(values) & ~1:]
    return values[0]
