"""The bare-metal C driver (firmware/c) compiled with gcc and run through ctypes against
`RegisterModel`, a Python model of the core's control registers."""
import ctypes
import dataclasses
import enum
import queue
import random
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.firmware.c_header import c_header
from tpugen.hdl.axi import AXI_RESP_OKAY
from tpugen.hdl.csr import ControlRegisters
from tpugen.isa import NUM_WINDOWS, ErrorCode
from tpugen.registers import COUNTERS, REGISTERS, constant_registers, register
from tpugen.sim.pysim_axil import AxiLiteMaster
from tpugen.run_protocol import drive, run_program
from tpugen.sim.register_model import RegisterModel

GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None,
                                reason="gcc not found: these tests compile the C driver")

DRIVER = Path(__file__).parent.parent / "firmware" / "c"
IRQ_DONE = register("IRQ_STATUS").value(done=1)
SOFT_RESET = register("CONTROL").value(soft_reset=1)
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
CONFIG = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64,
                    counter_width=64)  # 64-bit counters: the driver reads LO/HI pairs
MISMATCHED = {
    "geometry": dataclasses.replace(CONFIG, cols=8),
    "scratchpad": dataclasses.replace(CONFIG, scratchpad_kib=2),
}

SHIM = r"""
#include "tpu.h"

static struct tpu device;

struct tpu *shim_open_io(tpu_read_fn read, tpu_write_fn write)
{
    tpu_open_io(&device, read, write, NULL);
    return &device;
}

struct tpu *shim_open(volatile uint32_t *regs)
{
    tpu_open(&device, regs);
    return &device;
}

static struct tpu_wait shim_wait_policy(uint32_t max_polls, void (*irq_wait)(void *))
{
    struct tpu_wait wait;
    wait.max_polls = max_polls;
    wait.irq_wait = irq_wait;
    wait.context = NULL;
    return wait;
}

int shim_wait(const struct tpu *dev, uint32_t max_polls, void (*irq_wait)(void *))
{
    struct tpu_wait wait = shim_wait_policy(max_polls, irq_wait);
    return tpu_wait(dev, &wait);
}

int shim_run(const struct tpu *dev, uint32_t base, uint32_t length, uint32_t max_polls,
             void (*irq_wait)(void *))
{
    struct tpu_wait wait = shim_wait_policy(max_polls, irq_wait);
    return tpu_run(dev, base, length, &wait);
}

void shim_read_error(const struct tpu *dev, uint32_t *code, uint32_t *index)
{
    struct tpu_error error = tpu_read_error(dev);
    *code = error.code;
    *index = error.index;
}
"""

READ_FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32)
WRITE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32)
IRQ_WAIT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
SIGNATURES = {
    "shim_open_io": (ctypes.c_void_p, [READ_FN, WRITE_FN]),
    "shim_open": (ctypes.c_void_p, [ctypes.POINTER(ctypes.c_uint32)]),
    "shim_wait": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32, IRQ_WAIT_FN]),
    "shim_run": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                ctypes.c_uint32, IRQ_WAIT_FN]),
    "shim_read_error": (None, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                               ctypes.POINTER(ctypes.c_uint32)]),
    "tpu_init": (ctypes.c_int, [ctypes.c_void_p]),
    "tpu_soft_reset": (ctypes.c_int, [ctypes.c_void_p]),
    "tpu_set_window": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint32,
                                      ctypes.c_uint32, ctypes.c_uint32]),
    "tpu_set_program": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]),
    "tpu_set_watchdog": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32]),
    "tpu_irq_enable": (None, [ctypes.c_void_p, ctypes.c_int]),
    "tpu_irq_ack": (ctypes.c_uint32, [ctypes.c_void_p]),
    "tpu_start": (ctypes.c_int, [ctypes.c_void_p]),
    "tpu_read_counter": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint,
                                        ctypes.POINTER(ctypes.c_uint64)]),
}


def _results():
    """`enum tpu_result` of tpu.h, as a Python enum."""
    body = re.search(r"enum tpu_result \{(.*?)\};", (DRIVER / "tpu.h").read_text(), re.S).group(1)
    names = re.findall(r"^\s*(TPU_\w+)", body, re.M)
    assert names[0] == "TPU_OK" and "TPU_OK = 0," in body and body.count("=") == 1
    return enum.IntEnum("Result", names, start=0)


Result = _results()
TIMEOUT, CORE, BUSY = Result.TPU_ERR_TIMEOUT, Result.TPU_ERR_CORE, Result.TPU_ERR_BUSY


def compile_driver(config, directory):
    """tpu.c and the shim, built against the header of ``config``, as a loaded library."""
    directory.mkdir()
    (directory / "tpu_params.h").write_text(c_header(config))
    (directory / "shim.c").write_text(SHIM)
    library = directory / "libtpu_test.so"
    build = subprocess.run([GCC, *CFLAGS, "-shared", "-fPIC", "-O1", "-I", str(directory), "-I",
                            str(DRIVER), "-o", str(library), str(DRIVER / "tpu.c"),
                            str(directory / "shim.c")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    lib = ctypes.CDLL(str(library))
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    root = tmp_path_factory.mktemp("c_driver")
    return {name: compile_driver(config, root / name)
            for name, config in {"matching": CONFIG, **MISMATCHED}.items()}


class Driver:
    """The C driver on ``model``: a `RegisterModel` or anything with its ``read(offset)`` and
    ``write(offset, value)``. `call` returns a `Result` for the driver's results."""

    def __init__(self, lib, model):
        self.lib = lib
        self.model = model
        self.failures = []
        self._read = READ_FN(self._guard(lambda _, offset: model.read(offset)))
        self._write = WRITE_FN(self._guard(lambda _, offset, value: model.write(offset, value)))
        self.dev = lib.shim_open_io(self._read, self._write)

    def _guard(self, function):
        """ctypes only prints what a callback raises: keep it for `call` to raise."""
        def guarded(*args):
            try:
                return function(*args)
            except BaseException as error:
                self.failures.append(error)
                return 0
        return guarded

    def call(self, name, *args):
        value = getattr(self.lib, name)(self.dev, *args)
        if self.failures:
            raise self.failures[0]
        return Result(value) if SIGNATURES[name][0] is ctypes.c_int else value

    def run(self, base, length, max_polls=0, irq_wait=None):
        return self.call("shim_run", base, length, max_polls, self._irq_wait(irq_wait))

    def wait(self, max_polls=0, irq_wait=None):
        return self.call("shim_wait", max_polls, self._irq_wait(irq_wait))

    def _irq_wait(self, function):
        """A C callback (or NULL) that waits with ``function``."""
        return IRQ_WAIT_FN(self._guard(function)) if function else IRQ_WAIT_FN()

    def error(self):
        code, index = ctypes.c_uint32(), ctypes.c_uint32()
        self.call("shim_read_error", ctypes.byref(code), ctypes.byref(index))
        return code.value, index.value

    def counter(self, index):
        value = ctypes.c_uint64()
        return self.call("tpu_read_counter", index, ctypes.byref(value)), value.value

    def writes(self):
        return [(offset, value) for kind, offset, value in self.model.log if kind == "write"]


@pytest.fixture
def driver(libraries):
    """The driver built for CONFIG on a model of CONFIG; checks that every access hit a register."""
    drivers = []

    def make(header="matching", **model_options):
        drivers.append(Driver(libraries[header], RegisterModel(CONFIG, **model_options)))
        return drivers[-1]

    yield make
    for each in drivers:
        assert not each.model.unmapped, "accesses outside the register map"
        assert all(offset % 4 == 0 for _, offset, _ in each.model.log), "unaligned accesses"


def status_reads_after_start(model):
    start = register("CONTROL").offset
    last_start = max(i for i, (kind, offset, value) in enumerate(model.log)
                     if kind == "write" and offset == start and value & 1)
    return sum(1 for kind, offset, _ in model.log[last_start:]
               if kind == "read" and offset == register("STATUS").offset)


def test_header_compiles_on_its_own_and_matches_the_register_map(tmp_path):
    """Every offset macro, the indexed window/counter macros included, as REGISTERS says."""
    (tmp_path / "tpu_params.h").write_text(c_header(CONFIG))
    checks = [f"TPU_REG_{reg.name} == 0x{reg.offset:X}u" for reg in REGISTERS]
    for i in range(NUM_WINDOWS):
        for part in ("BASE", "SIZE", "FLAGS"):
            offset = register(f"WINDOW{i}_{part}").offset
            checks.append(f"TPU_REG_WINDOW_{part}({i}) == 0x{offset:X}u")
    for i, name in enumerate(COUNTERS):
        checks.append(f"TPU_COUNTER_{name.upper()} == {i}u")
        for half in ("LO", "HI"):
            checks.append(f"TPU_REG_COUNTER_{half}(TPU_COUNTER_{name.upper()}) == "
                          f"0x{register(f'{name.upper()}_{half}').offset:X}u")
    flags = {f.name: 1 << f.lsb for f in register("WINDOW0_FLAGS").fields}
    checks += [f"TPU_WINDOW_READ == {flags['read']}u", f"TPU_WINDOW_WRITE == {flags['write']}u",
               f"TPU_NUM_COUNTERS == {len(COUNTERS)}u"]
    checks += [f"TPU_{name}_VALUE == 0x{value:X}u"
               for name, value in constant_registers(CONFIG).items()]
    source = tmp_path / "check.c"
    source.write_text('#include "tpu_params.h"\n#include "tpu_params.h"\n' + "".join(
        f"typedef char check_{i}[({check}) ? 1 : -1];\n" for i, check in enumerate(checks)))
    subprocess.run([GCC, *CFLAGS, "-fsyntax-only", "-I", str(tmp_path), str(source)], check=True)
    source.write_text('#include "tpu_params.h"\ntypedef char wrong[(TPU_REG_WINDOW_SIZE(2) == '
                      f'0x{register("WINDOW2_BASE").offset:X}u) ? 1 : -1];\n')
    assert subprocess.run([GCC, *CFLAGS, "-fsyntax-only", "-I", str(tmp_path), str(source)],
                          capture_output=True).returncode != 0


def test_register_model_checks_its_parameters():
    for options, parameter in (({"run_ticks": -1}, "run_ticks"),
                               ({"start_latency": 1.5}, "start_latency"),
                               ({"outcome": 3}, "outcome")):
        with pytest.raises(ValueError, match=parameter):
            RegisterModel(CONFIG, **options)


def test_init_checks_the_core_and_leaves_it_clean(driver):
    dev = driver()
    model = dev.model
    model.stored.update({f"WINDOW{i}_{part}": 0x40 * (i + 1) | 3 for i in range(NUM_WINDOWS)
                         for part in ("BASE", "SIZE", "FLAGS")})
    model.stored["IRQ_ENABLE"] = 1
    model.done, model.pending = True, IRQ_DONE
    assert dev.call("tpu_init") == Result.TPU_OK
    assert not (model.busy or model.done or model.pending)
    assert model.stored["IRQ_ENABLE"] == 0
    for i in range(NUM_WINDOWS):
        assert [model.stored[f"WINDOW{i}_{part}"] for part in ("BASE", "SIZE", "FLAGS")] \
            == [0, 0, 0]
    assert (register("CONTROL").offset, SOFT_RESET) in dev.writes()


@pytest.mark.parametrize("header", sorted(MISMATCHED))
def test_init_rejects_a_header_of_another_config(driver, header):
    dev = driver(header)
    assert dev.call("tpu_init") == Result.TPU_ERR_CONFIG
    assert dev.writes() == []


@pytest.mark.parametrize("name, value, expected", [
    ("ID", 0x54505546, "TPU_ERR_NO_DEVICE"),
    ("ID", 0, "TPU_ERR_NO_DEVICE"),
    ("VERSION", 0x0002_0000, "TPU_ERR_VERSION"),
    ("VERSION", 0x0000_0005, "TPU_ERR_VERSION"),
    ("VERSION", 0x0001_0003, "TPU_OK"),  # a newer minor version only adds
    *[(name, bit, "TPU_ERR_CONFIG") for name, bit in
      (("CONFIG0", 1 << 0), ("CONFIG0", 1 << 30), ("CONFIG1", 1 << 16),
       ("SCRATCHPAD_ROWS", 1 << 20), ("ACCUMULATOR_ROWS", 1))],
])
def test_init_checks_identity_version_and_config(driver, name, value, expected):
    dev = driver()
    if name.startswith(("CONFIG", "SCRATCHPAD", "ACCUMULATOR")):
        value ^= dev.model.constants[name]
    dev.model.constants[name] = value
    assert dev.call("tpu_init") == Result[expected]
    if expected != "TPU_OK":
        assert dev.writes() == []


def test_run_finishes_within_exactly_the_poll_bound(driver):
    rng = random.Random(6)
    for latency, run_ticks in [(0, 0), (0, 1), (2, 0), (1, 2),
                               *((rng.randrange(4), rng.randrange(3, 500)) for _ in range(5))]:
        polls = latency + run_ticks + 1
        for max_polls, expected in ((polls, Result.TPU_OK), (polls - 1, TIMEOUT)):
            dev = driver(start_latency=latency, run_ticks=run_ticks)
            base, length = rng.getrandbits(26) * 64, rng.randrange(1, 1 << 20)
            assert dev.run(base, length, max_polls) == expected, (run_ticks, max_polls)
            assert status_reads_after_start(dev.model) == max_polls
            model = dev.model
            assert model.stored["PROGRAM_BASE"] == base and model.stored["PROGRAM_LENGTH"] == length
            assert model.stored["IRQ_ENABLE"] == 0
            assert model.done == (expected == Result.TPU_OK) and not model.error
            assert model.pending == 0, "acknowledged, or nothing pending yet"


def test_run_stopping_with_an_error_reports_code_and_index(driver):
    rng = random.Random(7)
    for code in [c for c in ErrorCode if c != ErrorCode.NONE]:
        index = rng.getrandbits(32)
        dev = driver(run_ticks=rng.randrange(10), outcome=code, error_index=index)
        assert dev.run(0x40, 3, max_polls=10) == CORE
        assert dev.error() == (code.value, index)
        assert dev.model.pending == 0, "the error interrupt is acknowledged"
    dev = driver()
    assert dev.run(0x40, 3, max_polls=10) == Result.TPU_OK
    assert dev.error() == (0, 0)


def test_a_run_that_never_finishes_times_out_and_a_soft_reset_stops_it(driver):
    dev = driver(outcome=None)
    assert dev.run(0, 5, max_polls=1000) == TIMEOUT
    assert status_reads_after_start(dev.model) == 1000 and dev.model.busy
    assert dev.wait(max_polls=0) == TIMEOUT
    written = len(dev.writes())
    assert dev.call("tpu_start") == BUSY
    assert dev.call("tpu_set_program", 0x100, 1) == BUSY
    assert dev.call("tpu_set_window", 0, 0, 64, 1) == BUSY
    assert dev.call("tpu_set_watchdog", 10) == BUSY
    assert dev.run(0x100, 1, max_polls=10) == BUSY
    assert len(dev.writes()) == written, "nothing is written while a program runs"
    assert dev.call("tpu_soft_reset") == Result.TPU_OK
    assert not dev.model.busy
    dev.model.outcome = ErrorCode.NONE
    assert dev.run(0x100, 1, max_polls=10) == Result.TPU_OK


def test_waiting_for_the_irq(driver):
    """irq_wait stands for an interrupt handler: ticks pass until the irq or a timeout."""
    waited = []

    def irq_wait(timeout):
        def wait(_):
            waited.append(dev.model.stored["IRQ_ENABLE"])
            for _ in range(timeout):
                if dev.model.irq:
                    return
                dev.model.advance(1)
        return wait

    dev = driver(start_latency=2, run_ticks=50)
    assert dev.run(0x80, 2, irq_wait=irq_wait(60)) == Result.TPU_OK
    assert waited == [1] and dev.model.pending == 0 and not dev.model.irq
    dev = driver(run_ticks=50, outcome=ErrorCode.WATCHDOG, error_index=9)
    assert dev.run(0x80, 2, irq_wait=irq_wait(60)) == CORE
    assert dev.error() == (ErrorCode.WATCHDOG.value, 9) and dev.model.pending == 0
    dev = driver(run_ticks=50)
    assert dev.run(0x80, 2, irq_wait=irq_wait(10)) == TIMEOUT
    assert dev.wait(irq_wait=lambda _: None) == TIMEOUT, "a spurious wake-up is not an end"
    assert dev.wait(irq_wait=irq_wait(60)) == Result.TPU_OK
    assert dev.call("tpu_irq_ack") == IRQ_DONE and dev.call("tpu_irq_ack") == 0


def test_counters_read_as_64_bits(driver):
    rng = random.Random(64)
    dev = driver()
    values = {name: rng.getrandbits(64) | 1 << 63 for name in COUNTERS}
    dev.model.counters.update(values)
    for i, name in enumerate(COUNTERS):
        assert dev.counter(i) == (Result.TPU_OK, values[name]), name
    assert dev.counter(len(COUNTERS))[0] == Result.TPU_ERR_ARGUMENT
    # cycles runs while busy: LO then HI gives the value at the LO read across a carry.
    dev = driver(outcome=None)
    dev.call("tpu_start")
    dev.model.counters["cycles"] = 0xFFFF_FFFF
    assert dev.counter(list(COUNTERS).index("cycles")) == (Result.TPU_OK, 0x1_0000_0000)


def test_start_acknowledges_stale_interrupts(driver):
    dev = driver(run_ticks=5)
    dev.call("tpu_irq_enable", 1)
    dev.model.pending = register("IRQ_STATUS").mask
    assert dev.call("tpu_start") == Result.TPU_OK
    assert dev.model.pending == 0 and not dev.model.irq


def test_windows_land_in_their_registers(driver):
    rng = random.Random(4)
    dev = driver()
    expected = dict(dev.model.stored)
    for i in rng.sample(range(NUM_WINDOWS), NUM_WINDOWS):
        base, size, flags = rng.getrandbits(32), rng.getrandbits(32), rng.randrange(4)
        assert dev.call("tpu_set_window", i, base, size, flags) == Result.TPU_OK
        expected.update({f"WINDOW{i}_BASE": base, f"WINDOW{i}_SIZE": size,
                         f"WINDOW{i}_FLAGS": flags})
        assert dev.model.stored == expected
    written = len(dev.writes())
    assert dev.call("tpu_set_window", NUM_WINDOWS, 0, 64, 1) == Result.TPU_ERR_ARGUMENT
    assert dev.call("tpu_set_window", 0, 0, 64, 4) == Result.TPU_ERR_ARGUMENT
    assert len(dev.writes()) == written
    assert dev.call("tpu_set_watchdog", 1234) == Result.TPU_OK
    assert dev.model.stored["WATCHDOG"] == 1234


def test_memory_mapped_access(libraries):
    """tpu_open(): the same calls as plain loads and stores at base + offset."""
    lib = libraries["matching"]
    regs = (ctypes.c_uint32 * 1024)()
    for name, value in constant_registers(CONFIG).items():
        regs[register(name).offset // 4] = value
    regs[register("MACS_LO").offset // 4] = 0x89ABCDEF
    regs[register("MACS_HI").offset // 4] = 0x01234567
    dev = lib.shim_open(regs)
    assert lib.tpu_init(dev) == Result.TPU_OK
    assert regs[register("CONTROL").offset // 4] == SOFT_RESET
    assert lib.tpu_set_window(dev, 3, 0x1000_0000, 0x2000, 3) == Result.TPU_OK
    assert [regs[register(f"WINDOW3_{part}").offset // 4] for part in ("BASE", "SIZE", "FLAGS")] \
        == [0x1000_0000, 0x2000, 3]
    value = ctypes.c_uint64()
    macs = list(COUNTERS).index("macs")
    assert lib.tpu_read_counter(dev, macs, ctypes.byref(value)) == Result.TPU_OK
    assert value.value == 0x01234567_89ABCDEF


class RtlRegisters:
    """`ControlRegisters` of CONFIG in amaranth.sim behind the same `read`/`write` as
    `RegisterModel`, with a scripted core: busy ``run_cycles`` cycles after a start, then
    ``outcome`` (None: never done; ``error_index`` with an error); ``cycles`` counts every clock
    from ``cycles_start``. The accesses come from the C driver's thread (`serve`)."""

    def __init__(self, *, run_cycles=40, outcome=ErrorCode.NONE, error_index=0,
                 cycles_start=0, counters=None):
        self.dut = ControlRegisters(CONFIG)
        self.run_cycles = run_cycles
        self.outcome = outcome
        self.error_index = error_index
        self.cycles_start = cycles_start
        self.counters = counters or {}
        self._requests = queue.Queue()
        self._replies = queue.Queue()
        self._stopped = threading.Event()

    def _request(self, *request):
        if self._stopped.is_set():
            raise RuntimeError("the simulation has stopped")
        self._requests.put(request)
        return self._replies.get()

    def read(self, offset):
        return self._request("read", offset)

    def write(self, offset, value):
        self._request("write", offset, value)

    def wait_irq(self, max_cycles):
        """Let up to ``max_cycles`` cycles pass until the irq; True if it came."""
        return self._request("irq", max_cycles)

    def peek(self, signal):
        return self._request("peek", signal)

    def serve(self, body):
        """Run ``body()`` in a thread while the simulation answers its accesses."""
        dut, axi = self.dut, AxiLiteMaster(self.dut.bus)
        failures = []

        def client():
            try:
                body()
            except BaseException as error:
                failures.append(error)
            finally:
                self._requests.put(None)

        async def bus(ctx):
            while (request := self._requests.get(timeout=60)) is not None:
                kind, *args = request
                if kind == "read":
                    value, resp = await axi.read(ctx, *args)
                    assert resp == AXI_RESP_OKAY, f"read {args[0]:#x}: SLVERR"
                elif kind == "write":
                    value = await axi.write(ctx, *args)
                    assert value == AXI_RESP_OKAY, f"write {args[0]:#x}: SLVERR"
                elif kind == "irq":
                    for _ in range(args[0]):
                        if ctx.get(dut.irq):
                            break
                        await ctx.tick()
                    value = bool(ctx.get(dut.irq))
                else:
                    value = ctx.get(*args)
                self._replies.put(value)

        async def core(ctx):
            elapsed = None  # cycles of the running program
            while True:
                _, _, start, reset = await ctx.tick().sample(dut.start, dut.soft_reset)
                ctx.set(dut.done_event, 0)
                ctx.set(dut.error_event, 0)
                if reset:
                    elapsed = None
                elif elapsed is None:
                    elapsed = 0 if start else None
                elif self.outcome is not None and elapsed >= self.run_cycles:
                    ctx.set(dut.error_code, self.outcome)
                    ctx.set(dut.error_index, self.error_index)
                    done = self.outcome == ErrorCode.NONE
                    ctx.set(dut.done_event if done else dut.error_event, 1)
                    elapsed = None
                else:
                    elapsed += 1
                ctx.set(dut.busy, elapsed is not None)

        async def count(ctx):
            for name, value in self.counters.items():
                ctx.set(getattr(dut, name), value)
            cycles = self.cycles_start
            while True:
                await ctx.tick()
                cycles += 1
                ctx.set(dut.cycles, cycles)

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_testbench(bus)
        sim.add_testbench(core, background=True)
        sim.add_testbench(count, background=True)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        try:
            sim.run()
        finally:
            self._stopped.set()
            self._replies.put(0)
            thread.join(timeout=60)
        if failures:
            raise failures[0]


def test_the_driver_on_the_control_registers_rtl(libraries):
    """The same C driver against hdl.csr.ControlRegisters, cycle by cycle."""
    macs = 0x0123_4567_89AB_CDEF
    rtl = RtlRegisters(run_cycles=40, cycles_start=0xFFFF_FF00, counters={"macs": macs})
    dev = Driver(libraries["matching"], rtl)
    rejecting = Driver(libraries["scratchpad"], rtl)
    cycles = list(COUNTERS).index("cycles")

    def body():
        assert rejecting.call("tpu_init") == Result.TPU_ERR_CONFIG
        assert dev.call("tpu_init") == Result.TPU_OK
        assert dev.call("tpu_set_window", 2, 0x8000_0000, 0x1_0000, 3) == Result.TPU_OK
        window = rtl.peek(rtl.dut.windows[2])
        assert (window.base, window.end, window.read, window.write) \
            == (0x8000_0000, 0x8001_0000, 1, 1)
        assert dev.run(0x40, 9, max_polls=100) == Result.TPU_OK
        assert (rtl.peek(rtl.dut.program_base), rtl.peek(rtl.dut.program_length)) == (0x40, 9)
        assert dev.counter(list(COUNTERS).index("macs")) == (Result.TPU_OK, macs)
        readings = [dev.counter(cycles)[1] for _ in range(60)]
        assert readings == sorted(set(readings)) and readings[0] < 1 << 32 < readings[-1], readings
        rtl.outcome, rtl.error_index = ErrorCode.SRAM_RANGE, 77
        assert dev.run(0x40, 9, max_polls=100) == CORE
        assert dev.error() == (ErrorCode.SRAM_RANGE.value, 77) and not rtl.peek(rtl.dut.irq)
        rtl.outcome = ErrorCode.NONE
        assert dev.run(0x40, 9, irq_wait=lambda _: rtl.wait_irq(200)) == Result.TPU_OK
        assert dev.error() == (0, 0) and not rtl.peek(rtl.dut.irq)
        rtl.outcome = None
        assert dev.run(0x40, 9, max_polls=50) == TIMEOUT
        assert dev.call("tpu_start") == BUSY
        assert dev.call("tpu_soft_reset") == Result.TPU_OK
        assert dev.wait(max_polls=1) == TIMEOUT, "a soft reset clears done and error"

    rtl.serve(body)


class ModelLink:
    """A `RegisterModel` behind the `Transport` register calls that `run_protocol.drive` uses."""

    def __init__(self, model):
        self.model = model

    def write_register(self, offset, value):
        self.model.write(offset, value)

    def read_registers(self, offset, count):
        return [self.model.read(offset + 4 * i) for i in range(count)]

    def wait_interrupt(self, timeout_cycles):
        for _ in range(timeout_cycles):
            if self.model.irq:
                break
            self.model.advance(1)
        return self.model.irq


@pytest.mark.parametrize("outcome", [ErrorCode.NONE, ErrorCode.WATCHDOG])
def test_the_driver_runs_a_program_as_the_python_hosts_do(driver, outcome):
    """tpu_run writes the registers that `run_protocol.run_program` (SimDevice, a board, the
    testbenches) writes, with the same values in the same order."""
    options = {"start_latency": 1, "run_ticks": 20, "outcome": outcome, "error_index": 5}
    c_driver = driver(**options)
    link = ModelLink(c_driver.model)
    expected = Result.TPU_OK if outcome == ErrorCode.NONE else CORE
    assert c_driver.run(0x1C0, 7, irq_wait=lambda _: link.wait_interrupt(100)) == expected
    python = ModelLink(RegisterModel(CONFIG, **options))
    run = drive(python, run_program(None, 0x1C0, 7, timeout_cycles=100))
    assert (run.finished, run.done, run.error, run.error_index) \
        == (True, outcome == ErrorCode.NONE, outcome, 5 if outcome != ErrorCode.NONE else 0)
    python_writes = [(offset, value) for kind, offset, value in python.model.log
                     if kind == "write"]
    assert len(python_writes) == 6 and c_driver.writes() == python_writes
    assert c_driver.model.pending == python.model.pending == 0
