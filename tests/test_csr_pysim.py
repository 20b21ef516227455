"""amaranth.sim tests of the register map and its AXI4-Lite slave."""
import random
from pathlib import Path

import pytest
from amaranth.back import rtlil
from amaranth.lib import wiring
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.hdl.axi import AXI_RESP_OKAY, AXI_RESP_SLVERR
from tpugen.hdl.csr import ControlRegisters
from tpugen.isa import NUM_WINDOWS, ErrorCode
from tpugen.registers import (COUNTERS, ID_MAGIC, REGISTERS, Register, absent_registers,
                              constant_registers, counter_names, kept_value, narrow_registers,
                              register, registers_markdown)
from tpugen.sim.pysim_axil import WRITE_ORDERS, AxiLiteMaster

from test_dma_pysim import window

OKAY, SLVERR = AXI_RESP_OKAY, AXI_RESP_SLVERR
RW = [reg for reg in REGISTERS if reg.access == "rw"]
RO = [reg for reg in REGISTERS if reg.access == "ro"]
UNMAPPED = [0x01C, 0x038, 0x04C, 0x08C, 0x0FC, 0x150, 0xFFC]
MAX_CYCLES = 20_000
CONTROL, STATUS, IRQ_STATUS = (register(name) for name in ("CONTROL", "STATUS", "IRQ_STATUS"))


def offset(name):
    return register(name).offset


def simulate(body, config=CoreConfig(), trace=None, counters=None):
    """Run ``body(ctx, dut, axi)`` (failing after ``MAX_CYCLES``); with ``trace``, append
    (start, soft_reset) every cycle. With `CoreConfig.counters_in_ram` a stand-in for the
    counter memory answers each read after 1 to 30 cycles with the value in ``counters`` (by
    name) at that time; else ``counters`` drives the counter inputs."""
    dut = ControlRegisters(config)
    axi = AxiLiteMaster(dut.bus)
    counters = {} if counters is None else counters
    names = counter_names(config)

    async def counter_memory(ctx):
        rng = random.Random(5)
        async for _, _, read, index in ctx.tick().sample(dut.counter_read, dut.counter_index):
            ctx.set(dut.counter_done, 0)
            if read and rng.random() < 0.1:
                ctx.set(dut.counter_value, counters.get(names[index], 0))
                ctx.set(dut.counter_done, 1)

    async def counter_inputs(ctx):
        async for _ in ctx.tick():
            for name in names:
                ctx.set(getattr(dut, name), counters.get(name, 0))

    async def testbench(ctx):
        await body(ctx, dut, axi)

    async def monitor(ctx):
        async for _, _, start, soft_reset in ctx.tick().sample(dut.start, dut.soft_reset):
            trace.append((start, soft_reset))

    async def watchdog(ctx):
        for _ in range(MAX_CYCLES):
            await ctx.tick()
        raise AssertionError(f"testbench still running after {MAX_CYCLES} cycles: a deadlock?")

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.add_testbench(watchdog, background=True)
    sim.add_testbench(counter_memory if config.counters_in_ram else counter_inputs,
                      background=True)
    if trace is not None:
        sim.add_testbench(monitor, background=True)
    sim.run()


async def pulse(ctx, signal):
    ctx.set(signal, 1)
    await ctx.tick()
    ctx.set(signal, 0)


async def read_ok(ctx, axi, name):
    value, resp = await axi.read(ctx, offset(name))
    assert resp == OKAY, name
    return value


def test_register_map():
    assert register("STATUS").offset == 0x024
    with pytest.raises(KeyError, match="known ID, VERSION"):
        register("STATUSS")
    for name in COUNTERS:
        assert offset(f"{name.upper()}_HI") == offset(f"{name.upper()}_LO") + 4
    assert {f"WINDOW{i}_{part}" for i in range(NUM_WINDOWS) for part in ("BASE", "SIZE", "FLAGS")} \
        <= {reg.name for reg in RW}
    assert all(reg.offset < 0x1000 and reg.offset % 4 == 0 for reg in REGISTERS)
    for kwargs, parameter in (({"offset": 0x1000}, "offset"), ({"offset": 2}, "offset"),
                              ({"access": "wo"}, "access"), ({"reset": 1}, "reset"),
                              ({"fields": (register("STATUS").fields[0],) * 2}, "fields")):
        args = {"name": "X", "offset": 0, "access": "ro", "doc": "", **kwargs}
        with pytest.raises(ValueError, match=parameter):
            Register(**args)


def test_registers_markdown_is_current():
    doc = Path(__file__).parent.parent / "docs" / "registers.md"
    assert doc.read_text() == registers_markdown(), "run: python -c 'from tpugen.registers import " \
        "registers_markdown; print(registers_markdown(), end=\"\")' > docs/registers.md"


def test_parameters_and_directions():
    with pytest.raises(ValueError, match="config"):
        ControlRegisters({"rows": 8})
    dut = ControlRegisters(CoreConfig())
    rtlil.convert(dut)
    bus = dut.signature.members["bus"].signature.members
    for name in ("awaddr", "wdata", "wstrb", "bready", "araddr", "rready"):
        assert bus[name].flow == wiring.In, name
    for name in ("awready", "wready", "bresp", "bvalid", "arready", "rdata", "rvalid"):
        assert bus[name].flow == wiring.Out, name
    assert dut.signature.members["watchdog_limit"].flow == wiring.Out
    assert dut.signature.members["cycles"].flow == wiring.In


@pytest.mark.parametrize("preset, counter_width", [("tiny", 32), ("default", 32),
                                                    ("large", 64), ("micro", 32)])
def test_reset_values_and_access(preset, counter_width):
    config = CoreConfig(**{**vars(CoreConfig.preset(preset)), "counter_width": counter_width})
    constants = constant_registers(config)
    present = counter_names(config)
    counter_values = {name: (i + 1) * 0x0101_0101_0101 % (1 << counter_width)
                      if name in present else 0 for i, name in enumerate(COUNTERS)}

    async def body(ctx, dut, axi):
        expected = {}
        for reg in REGISTERS:
            if reg.name in constants:
                expected[reg.name] = constants[reg.name]
            elif reg.name.endswith("_LO"):
                expected[reg.name] = counter_values[reg.name[:-3].lower()] & 0xFFFF_FFFF
            elif reg.name.endswith("_HI"):
                expected[reg.name] = counter_values[reg.name[:-3].lower()] >> 32
            else:
                expected[reg.name] = reg.reset
        for reg in REGISTERS:
            assert await read_ok(ctx, axi, reg.name) == expected[reg.name], reg.name
        assert ctx.get(dut.watchdog_limit) == 65536
        for reg in RO + RW:
            assert await axi.write(ctx, reg.offset, 0xFFFF_FFFF) == OKAY, reg.name
        for reg in REGISTERS:
            value = await read_ok(ctx, axi, reg.name)
            if reg.access == "rw":
                assert value == (0 if reg.name in lacked(config.windows) else reg.mask), reg.name
            elif reg.access == "ro" and not reg.name.endswith("_HI"):
                assert value == expected[reg.name], reg.name
        for reg in RW:
            assert await axi.write(ctx, reg.offset, 0) == OKAY
            assert await read_ok(ctx, axi, reg.name) == 0, reg.name

    simulate(body, config, counters={name: counter_values[name] for name in present})
    assert constants["ID"] == ID_MAGIC
    assert constants["CONFIG0"] & 0xFF == config.rows
    assert constants["CONFIG1"] >> 8 & 0xFF == config.lanes


def lacked(count):
    """The window registers a core of ``count`` windows lacks (they read 0, ignore writes)."""
    return {f"WINDOW{i}_{part}" for i in range(count, NUM_WINDOWS)
            for part in ("BASE", "SIZE", "FLAGS")}


def window_outputs(ctx, dut):
    """The `Window` values on ``dut.windows`` (the core's ``config.windows``), as dicts."""
    return [{name: int(getattr(ctx.get(dut.windows[i]), name))
             for name in ("base", "end", "read", "write")} for i in range(dut.config.windows)]


def windows_of(registers, address_width=32):
    """The windows ``registers`` (name: value) describe, as `window_outputs` shows them on a
    core of ``address_width``."""
    return [window(registers[f"WINDOW{i}_BASE"], registers[f"WINDOW{i}_SIZE"],
                   registers[f"WINDOW{i}_FLAGS"] & 1, registers[f"WINDOW{i}_FLAGS"] >> 1 & 1,
                   address_width)
            for i in range(NUM_WINDOWS)]


@pytest.mark.parametrize("count", [1, 2, NUM_WINDOWS])
def test_outputs_follow_registers(count):
    """The outputs after the writes; the windows as checked: ends past 2**32, a window of size
    0 disabled whatever its flags. A core with ``count`` windows has only the first ``count``:
    the others' registers read 0 after the writes."""
    config = CoreConfig(windows=count)
    values = {"PROGRAM_BASE": 0x8000_0040, "PROGRAM_LENGTH": 1234, "WATCHDOG": 77,
              "IRQ_ENABLE": 1}
    for i in range(NUM_WINDOWS):
        values |= {f"WINDOW{i}_BASE": 0x1000_0000 * (i + 1), f"WINDOW{i}_SIZE": 0x100 + i,
                   f"WINDOW{i}_FLAGS": i}
    values |= {"WINDOW0_SIZE": 0, "WINDOW0_FLAGS": 3, "WINDOW3_BASE": 0xFFFF_F000,
               "WINDOW3_SIZE": 0xFFFF_FFFF}

    async def body(ctx, dut, axi):
        for name, value in values.items():
            assert await axi.write(ctx, offset(name), value) == OKAY
        assert ctx.get(dut.program_base) == 0x8000_0040
        assert ctx.get(dut.program_length) == 1234
        assert ctx.get(dut.watchdog_limit) == 77
        assert ctx.get(dut.irq_enable) == 1
        assert window_outputs(ctx, dut) == [
            {"base": 0x1000_0000, "end": 0x1000_0000, "read": 0, "write": 0},
            {"base": 0x2000_0000, "end": 0x2000_0101, "read": 1, "write": 0},
            {"base": 0x3000_0000, "end": 0x3000_0102, "read": 0, "write": 1},
            {"base": 0xFFFF_F000, "end": 0x1_FFFF_EFFF, "read": 1, "write": 1}][:count]
        assert dut.windows.shape().length == count
        for name, value in values.items():
            assert await read_ok(ctx, axi, name) == (0 if name in lacked(count) else value), name

    simulate(body, config)


def test_wstrb_byte_writes():
    async def body(ctx, dut, axi):
        base = offset("PROGRAM_BASE")
        await axi.write(ctx, base, 0x1122_3344)
        for strb, data, expected in ((0b0010, 0xAABB_CCDD, 0x1122_CC44),
                                     (0b1001, 0x5566_7788, 0x5522_CC88),
                                     (0b0100, 0xFFFF_FFFF, 0x55FF_CC88),
                                     (0b0000, 0x0000_0000, 0x55FF_CC88)):
            assert await axi.write(ctx, base, data, strb=strb) == OKAY
            assert await read_ok(ctx, axi, "PROGRAM_BASE") == expected
        await axi.write(ctx, offset("WINDOW1_FLAGS"), 0x3, strb=0b1110)
        assert await read_ok(ctx, axi, "WINDOW1_FLAGS") == 0
        await axi.write(ctx, offset("WATCHDOG"), 0x0000_0300, strb=0b0010)
        assert ctx.get(dut.watchdog_limit) == 0x0001_0300

    trace = []
    simulate(body, trace=trace)
    assert not any(start or reset for start, reset in trace)


@pytest.mark.parametrize("order", WRITE_ORDERS)
@pytest.mark.parametrize("resp_delay", [0, 3])
def test_write_orders_and_backpressure(order, resp_delay):
    async def body(ctx, dut, axi):
        for i, name in enumerate(("PROGRAM_LENGTH", "WINDOW2_SIZE", "WATCHDOG")):
            value = 0x1357_9BDF + i
            assert await axi.write(ctx, offset(name), value, order=order, gap=i * 2,
                                   resp_delay=resp_delay) == OKAY
            assert await axi.read(ctx, offset(name), resp_delay=resp_delay) == (value, OKAY)
        for address in UNMAPPED[:3]:
            assert await axi.write(ctx, address, 0xFFFF_FFFF, order=order, gap=2,
                                   resp_delay=resp_delay) == SLVERR
            assert await axi.read(ctx, address, resp_delay=resp_delay) == (0, SLVERR)

    simulate(body)


def test_second_write_waits_for_first_response():
    async def body(ctx, dut, axi):
        bus = dut.bus
        ctx.set(bus.awaddr, offset("PROGRAM_BASE"))
        ctx.set(bus.wdata, 0xAAAA_0000)
        ctx.set(bus.wstrb, 0xF)
        await axi.handshake(ctx, (bus.awvalid, bus.awready), (bus.wvalid, bus.wready))
        ctx.set(bus.awaddr, offset("PROGRAM_LENGTH"))
        ctx.set(bus.wdata, 0x5555)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        for _ in range(6):  # the second write is offered, and waits while B is not taken
            _, _, awready, wready = await ctx.tick().sample(bus.awready, bus.wready)
            assert not awready and not wready
        assert ctx.get(bus.bvalid)
        assert ctx.get(dut.program_base) == 0xAAAA_0000
        assert ctx.get(dut.program_length) == 0
        ctx.set(bus.bready, 1)
        await ctx.tick().until(bus.bvalid)
        await axi.handshake(ctx, (bus.awvalid, bus.awready), (bus.wvalid, bus.wready))
        await ctx.tick().until(bus.bvalid)
        ctx.set(bus.bready, 0)
        assert ctx.get(dut.program_length) == 0x5555
        await ctx.tick()
        assert not ctx.get(bus.bvalid)

    simulate(body)


def test_read_held_until_rready():
    async def body(ctx, dut, axi):
        bus = dut.bus
        ctx.set(bus.araddr, offset("ID"))
        await axi.handshake(ctx, (bus.arvalid, bus.arready))
        ctx.set(bus.araddr, offset("WATCHDOG"))
        ctx.set(bus.arvalid, 1)
        for _ in range(4):
            _, _, accepted = await ctx.tick().sample(bus.arready)
            assert not accepted and ctx.get(bus.rvalid)
        ctx.set(bus.rready, 1)
        assert await ctx.tick().sample(bus.rdata, bus.rresp).until(bus.rvalid) == (ID_MAGIC, OKAY)
        await axi.handshake(ctx, (bus.arvalid, bus.arready))
        assert await ctx.tick().sample(bus.rdata, bus.rresp).until(bus.rvalid) == (65536, OKAY)

    simulate(body)


def test_unmapped_and_unaligned_addresses():
    async def body(ctx, dut, axi):
        for address in UNMAPPED:
            assert await axi.read(ctx, address) == (0, SLVERR), hex(address)
            assert await axi.write(ctx, address, 0xFFFF_FFFF) == SLVERR, hex(address)
        assert await axi.read(ctx, 0x003) == (ID_MAGIC, OKAY)
        assert await axi.write(ctx, offset("PROGRAM_BASE") + 2, 0x1234) == OKAY
        assert ctx.get(dut.program_base) == 0x1234
        for reg in RW:
            assert await read_ok(ctx, axi, reg.name) == (0x1234 if reg.name == "PROGRAM_BASE"
                                                         else reg.reset), reg.name

    simulate(body)


def test_control_pulses_last_one_cycle():
    writes = [{"start": 1}, {}, {"soft_reset": 1}, {"start": 1, "soft_reset": 1}, {"start": 1}]
    trace = []

    async def body(ctx, dut, axi):
        for value in writes:
            assert await axi.write(ctx, offset("CONTROL"), CONTROL.value(**value),
                                   resp_delay=2) == OKAY
            for _ in range(3):
                await ctx.tick()
        assert await read_ok(ctx, axi, "CONTROL") == 0

    simulate(body, trace=trace)
    for bit, name in enumerate(("start", "soft_reset")):
        highs = [cycle for cycle, sample in enumerate(trace) if sample[bit]]
        assert len(highs) == sum(name in value for value in writes), (name, highs)
        assert all(b - a > 1 for a, b in zip(highs, highs[1:])), (name, highs)
    both = [cycle for cycle, sample in enumerate(trace) if sample[0] and sample[1]]
    assert len(both) == 1


def test_irq_and_status():
    async def body(ctx, dut, axi):
        irq_status = offset("IRQ_STATUS")
        ctx.set(dut.busy, 1)
        assert await read_ok(ctx, axi, "STATUS") == STATUS.value(busy=1)
        ctx.set(dut.busy, 0)
        await pulse(ctx, dut.done_event)
        assert await read_ok(ctx, axi, "STATUS") == STATUS.value(done=1)
        assert await read_ok(ctx, axi, "IRQ_STATUS") == IRQ_STATUS.value(done=1)
        assert not ctx.get(dut.irq)
        await axi.write(ctx, offset("IRQ_ENABLE"), 1)
        assert ctx.get(dut.irq)
        await axi.write(ctx, irq_status, IRQ_STATUS.value(error=1))
        assert ctx.get(dut.irq)
        await axi.write(ctx, irq_status, IRQ_STATUS.value(done=1), strb=0b0010)
        assert ctx.get(dut.irq)
        await axi.write(ctx, irq_status, IRQ_STATUS.value(done=1))
        assert not ctx.get(dut.irq)
        assert await read_ok(ctx, axi, "IRQ_STATUS") == 0
        assert await read_ok(ctx, axi, "STATUS") == STATUS.value(done=1)

        await pulse(ctx, dut.error_event)
        assert ctx.get(dut.irq)
        assert await read_ok(ctx, axi, "IRQ_STATUS") == IRQ_STATUS.value(error=1)
        await axi.write(ctx, offset("IRQ_ENABLE"), 0)
        assert not ctx.get(dut.irq)
        await axi.write(ctx, irq_status, IRQ_STATUS.mask)
        await axi.write(ctx, offset("IRQ_ENABLE"), 1)
        assert not ctx.get(dut.irq)

        # An event in the cycle its acknowledge is written stays pending.
        bus = dut.bus
        ctx.set(bus.awaddr, irq_status)
        ctx.set(bus.wdata, IRQ_STATUS.mask)
        ctx.set(bus.wstrb, 0xF)
        await axi.handshake(ctx, (bus.awvalid, bus.awready), (bus.wvalid, bus.wready))
        await pulse(ctx, dut.done_event)
        ctx.set(bus.bready, 1)
        await ctx.tick().until(bus.bvalid)
        ctx.set(bus.bready, 0)
        assert ctx.get(dut.irq)
        assert await read_ok(ctx, axi, "IRQ_STATUS") == IRQ_STATUS.value(done=1)

    simulate(body)


def test_error_latch_start_and_soft_reset():
    async def body(ctx, dut, axi):
        config = {"PROGRAM_BASE": 0x4000, "PROGRAM_LENGTH": 9, "IRQ_ENABLE": 1,
                  "WINDOW3_FLAGS": 3, "WATCHDOG": 500}
        for name, value in config.items():
            await axi.write(ctx, offset(name), value)
        # The controller holds its error's code and index until the next START; the
        # registers show them from the event on, and 0 from a START or soft reset on.
        assert await read_ok(ctx, axi, "ERROR_CODE") == 0
        ctx.set(dut.error_code, ErrorCode.STORE_WINDOW)
        ctx.set(dut.error_index, 0xDEAD_0007)
        assert await read_ok(ctx, axi, "ERROR_CODE") == 0  # no event yet
        await pulse(ctx, dut.error_event)
        assert await read_ok(ctx, axi, "ERROR_CODE") == ErrorCode.STORE_WINDOW.value
        assert await read_ok(ctx, axi, "ERROR_INDEX") == 0xDEAD_0007
        assert await read_ok(ctx, axi, "STATUS") == STATUS.value(error=1)

        await axi.write(ctx, offset("CONTROL"), CONTROL.value(start=1))
        assert await read_ok(ctx, axi, "ERROR_CODE") == 0  # the controller's not cleared yet
        ctx.set(dut.error_code, ErrorCode.NONE)
        ctx.set(dut.error_index, 0)
        assert await read_ok(ctx, axi, "STATUS") == 0
        assert await read_ok(ctx, axi, "ERROR_CODE") == 0
        assert await read_ok(ctx, axi, "ERROR_INDEX") == 0
        assert await read_ok(ctx, axi, "IRQ_STATUS") == IRQ_STATUS.value(error=1)
        assert ctx.get(dut.irq)

        ctx.set(dut.error_code, ErrorCode.WATCHDOG)
        ctx.set(dut.error_index, 3)
        await pulse(ctx, dut.error_event)
        await pulse(ctx, dut.done_event)
        assert await read_ok(ctx, axi, "STATUS") == STATUS.value(done=1, error=1)
        await axi.write(ctx, offset("CONTROL"), CONTROL.value(soft_reset=1))
        for name in ("STATUS", "IRQ_STATUS", "ERROR_CODE", "ERROR_INDEX"):
            assert await read_ok(ctx, axi, name) == 0, name
        assert not ctx.get(dut.irq)
        for name, value in config.items():
            assert await read_ok(ctx, axi, name) == value, name

    simulate(body)


@pytest.mark.parametrize("in_ram", [False, True])
def test_counters_read_as_lo_hi_pairs(in_ram):
    """Each counter's LO then HI; with `CoreConfig.counters_in_ram` the values come from the
    counter memory (a stand-in answering late), one of them for every counter's LO."""
    values = {name: 0x0123_4567_89AB_CDEF ^ (i << 40) ^ i for i, name in enumerate(COUNTERS)}
    counters = dict(values)

    async def body(ctx, dut, axi):
        for name, value in values.items():
            low = await read_ok(ctx, axi, f"{name.upper()}_LO")
            high = await read_ok(ctx, axi, f"{name.upper()}_HI")
            assert high << 32 | low == value, name
        # HI returns the upper half as it was when LO was read: no torn carry.
        counters["cycles"] = 0x1_FFFF_FFFF
        assert await read_ok(ctx, axi, "CYCLES_LO") == 0xFFFF_FFFF
        counters["cycles"] = 0x2_0000_0000
        assert await read_ok(ctx, axi, "CYCLES_HI") == 1
        assert await read_ok(ctx, axi, "MACS_HI") == values["macs"] >> 32

    simulate(body, CoreConfig(counter_width=64, counters_in_ram=in_ram), counters=counters)


@pytest.mark.parametrize("count", [1, NUM_WINDOWS])
def test_configuration_is_locked_from_start_until_idle(count):
    """PROGRAM_*, WATCHDOG and the windows answer SLVERR and keep their values while the core
    is busy; other rw registers stay writable; once idle, OKAY again. The registers of the
    windows a core lacks answer the same, and read 0."""
    config = CoreConfig(windows=count)
    locked = [reg for reg in RW if reg.locked]
    assert {reg.name for reg in locked} == {"PROGRAM_BASE", "PROGRAM_LENGTH", "WATCHDOG"} | {
        f"WINDOW{i}_{part}" for i in range(NUM_WINDOWS) for part in ("BASE", "SIZE", "FLAGS")}
    start = register("CONTROL").layout.const({"start": 1}).as_value().value

    async def body(ctx, dut, axi):
        before = {reg.name: await read_ok(ctx, axi, reg.name) for reg in locked}
        assert await axi.write(ctx, offset("CONTROL"), start) == OKAY
        ctx.set(dut.busy, 1)
        for i, reg in enumerate(locked):
            assert await axi.write(ctx, reg.offset, 0xFFFF_FFF0 ^ i) == SLVERR, reg.name
            assert await read_ok(ctx, axi, reg.name) == before[reg.name], reg.name
        assert await axi.write(ctx, offset("IRQ_ENABLE"), 1) == OKAY
        assert ctx.get(dut.irq_enable) == 1
        ctx.set(dut.busy, 0)
        for reg in locked:
            assert await axi.write(ctx, reg.offset, 0x40) == OKAY, reg.name
            expected = 0 if reg.name in lacked(count) else 0x40 & reg.mask
            assert await read_ok(ctx, axi, reg.name) == expected, reg.name

    simulate(body, config)


@pytest.mark.parametrize("count, address_width", [(2, 32), (NUM_WINDOWS, 32), (2, 17)])
def test_random_traffic_against_model(count, address_width):
    """Random writes (some bytes at a time) and reads of the rw registers; a core with
    ``count`` windows ignores writes to the others' registers. On a core of fewer than 32
    address bits the addresses and the program length read back, and reach the core, as their
    `kept_value`; its windows are the part inside its address space."""
    rng = random.Random(7)
    model = {reg.name: reg.reset for reg in RW}
    config = CoreConfig(windows=count, address_width=address_width)
    kept = narrow_registers(config)
    narrow = (1 << address_width) - 1

    def expected(name):
        return kept_value(kept[name], model[name]) if name in kept else model[name]

    async def body(ctx, dut, axi):
        for _ in range(400):
            reg = rng.choice(RW)
            if rng.random() < 0.5:
                data = rng.getrandbits(32)
                if reg.name.startswith(("WINDOW", "PROGRAM")) and rng.random() < 0.5:
                    data &= narrow  # a window inside (or reaching past) the address space
                strb = rng.getrandbits(4)
                mask = sum(0xFF << 8 * i for i in range(4) if strb >> i & 1)
                resp = await axi.write(ctx, reg.offset, data, strb=strb,
                                       order=rng.choice(WRITE_ORDERS), gap=rng.randrange(3),
                                       resp_delay=rng.randrange(3))
                assert resp == OKAY
                if reg.name not in lacked(count):
                    model[reg.name] = (model[reg.name] & ~mask | data & mask) & reg.mask
                assert (ctx.get(dut.program_base), ctx.get(dut.program_length)) == (
                    expected("PROGRAM_BASE"), expected("PROGRAM_LENGTH"))
                outputs = window_outputs(ctx, dut)
                assert outputs == windows_of(model, address_width)[:count]
                for i, w in enumerate(outputs):
                    if w["read"] or w["write"]:
                        seen.add("reaching past the top" if w["end"] >> address_width
                                 else "enabled")
                    elif model[f"WINDOW{i}_SIZE"] and model[f"WINDOW{i}_FLAGS"]:
                        seen.add("beyond the address space")
            else:
                value = await axi.read(ctx, reg.offset, resp_delay=rng.randrange(3))
                assert value == (expected(reg.name), OKAY), reg.name
                if value[0] != model[reg.name]:
                    seen.add("kept narrower")

    seen = set()
    simulate(body, config)
    assert seen == {"enabled", "reaching past the top",
                    *(["beyond the address space", "kept narrower"] if address_width < 32
                      else [])}


@pytest.mark.parametrize("count", range(1, NUM_WINDOWS + 1))
def test_the_window_count_is_reported(count):
    """CONFIG1.windows tells the host how many windows the core has; `absent_registers` are
    the others'."""
    config = CoreConfig(windows=count)
    assert set(absent_registers(config)) == lacked(count)
    assert register("CONFIG1").fields_of(constant_registers(config)["CONFIG1"]).windows == count
