"""The register sequence that runs one program, written once for every host.

A run is a generator of steps (`Write`, `ReadSpan`, `WaitInterrupt`) that a host executes on
its own link: `drive` on a synchronous `Transport` (the runtime, `SimDevice`, a board),
`drive_async` on a cocotb driver (the testbenches). The C driver (``firmware/c/tpu.c``,
``tpu_run``) follows the same order: windows, PROGRAM_BASE and PROGRAM_LENGTH, IRQ_ENABLE,
acknowledge stale causes, START; wait; read STATUS to ERROR_INDEX; acknowledge.
"""
from dataclasses import dataclass, field

from .isa import ErrorCode
from .registers import COUNTERS, register, register_span, window_writes

__all__ = ["ReadSpan", "RunOutcome", "WaitInterrupt", "Write", "drive", "drive_async",
           "finish_program", "prepare_program", "run_program", "start",
           "start_program"]


@dataclass(frozen=True)
class Write:
    """Write ``value`` to register ``name``."""
    name: str
    value: int


@dataclass(frozen=True)
class ReadSpan:
    """Read the consecutive registers ``first`` to ``last``; the reply is {name: value}."""
    first: str
    last: str


@dataclass(frozen=True)
class WaitInterrupt:
    """Wait for the core's irq at most ``timeout_cycles``; the reply is True if it came."""
    timeout_cycles: int


@dataclass(frozen=True)
class RunOutcome:
    """How a program ended: ``finished`` (the irq came), STATUS.done, the error and the
    instruction it stopped at, the pending interrupt causes before the acknowledgement, and
    the performance counters {name: value}."""
    finished: bool
    done: bool
    error: ErrorCode
    error_index: int
    irq_status: int
    counters: dict = field(repr=False)


_COUNTER_HALVES = [f"{name.upper()}_{half}" for name in COUNTERS for half in ("LO", "HI")]


def prepare_program(program_base, program_length, *, interrupt=True):
    """Steps that set up ``program_length`` instructions at ``program_base`` and clear the
    interrupt causes left from before. ``interrupt``: IRQ_ENABLE set (True), cleared (False),
    or left as it is (None)."""
    yield Write("PROGRAM_BASE", program_base)
    yield Write("PROGRAM_LENGTH", program_length)
    if interrupt is not None:
        yield Write("IRQ_ENABLE", register("IRQ_ENABLE").value(enable=interrupt))
    yield Write("IRQ_STATUS", register("IRQ_STATUS").mask)


def start():
    """The step that starts the prepared program."""
    yield Write("CONTROL", register("CONTROL").value(start=1))


def start_program(program_base, program_length, *, interrupt=True):
    """`prepare_program`, then `start`."""
    yield from prepare_program(program_base, program_length, interrupt=interrupt)
    yield from start()


def finish_program(timeout_cycles):
    """Steps that wait for the started program, read how it ended and acknowledge the
    interrupt causes it read; returns a `RunOutcome`."""
    finished = yield WaitInterrupt(timeout_cycles)
    run = yield ReadSpan("STATUS", "ERROR_INDEX")
    halves = yield ReadSpan(_COUNTER_HALVES[0], _COUNTER_HALVES[-1])
    if run["IRQ_STATUS"]:  # the causes read, so that none raised since is lost
        yield Write("IRQ_STATUS", run["IRQ_STATUS"])
    return RunOutcome(
        finished=finished, done=bool(register("STATUS").fields_of(run["STATUS"]).done),
        error=ErrorCode(register("ERROR_CODE").fields_of(run["ERROR_CODE"]).code),
        error_index=run["ERROR_INDEX"], irq_status=run["IRQ_STATUS"],
        counters={name: halves[f"{name.upper()}_LO"] | halves[f"{name.upper()}_HI"] << 32
                  for name in COUNTERS})


def run_program(windows, program_base, program_length, timeout_cycles):
    """The whole run: ``windows`` (see `window_writes`; None leaves them), start, finish."""
    for name, value in window_writes(windows) if windows is not None else ():
        yield Write(name, value)
    yield from start_program(program_base, program_length)
    return (yield from finish_program(timeout_cycles))


def _call(step):
    """(link method, arguments, reply from its result) that execute ``step``."""
    if isinstance(step, Write):
        return "write_register", (register(step.name).offset, step.value), lambda result: None
    if isinstance(step, ReadSpan):
        span = register_span(step.first, step.last)
        return ("read_registers", (span[0].offset, len(span)),
                lambda values: dict(zip((reg.name for reg in span), values)))
    return "wait_interrupt", (step.timeout_cycles,), bool


async def drive_async(link, steps):
    """Execute ``steps`` on ``link``, whose ``write_register``, ``read_registers`` and
    ``wait_interrupt`` are coroutines (a cocotb driver); the steps' return value."""
    reply = None
    while True:
        try:
            method, arguments, to_reply = _call(steps.send(reply))
        except StopIteration as stop:
            return stop.value
        reply = to_reply(await getattr(link, method)(*arguments))


class _Awaitable:
    """A synchronous link whose methods `drive_async` can await (they never suspend)."""

    def __init__(self, link):
        self._link = link

    def __getattr__(self, name):
        async def call(*arguments):
            return getattr(self._link, name)(*arguments)
        return call


def drive(link, steps):
    """`drive_async` on a synchronous ``link`` (a `Transport`: the runtime, a board)."""
    run = drive_async(_Awaitable(link), steps)
    try:
        run.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a synchronous link suspended")  # cannot happen: nothing awaits
