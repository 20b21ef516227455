"""`RegisterModel`: the control registers of a `tpu_core` as a Python object, for driver tests."""
from ..isa import ErrorCode
from ..registers import (COUNTERS, REGISTERS, absent_registers, constant_registers, kept_value,
                         narrow_registers, register)

__all__ = ["RegisterModel"]

_BY_OFFSET = {reg.offset: reg for reg in REGISTERS}
_COUNTER_HALVES = {f"{name.upper()}_{half}": (name, half)
                   for name in COUNTERS for half in ("LO", "HI")}


class RegisterModel:
    """`ControlRegisters` of ``config`` (access types, reset values, constants, counter capture)
    with a scripted core behind it, one access at a time.

    Time advances one tick before every access (or by `advance`). A start makes the core busy
    after ``start_latency`` ticks (as the pulse crosses the registers), for ``run_ticks`` ticks;
    it then stops with ``outcome``: ``ErrorCode.NONE`` (done), another ``ErrorCode`` (error at
    instruction ``error_index``) or None (it never stops).
    ``constants`` (ID, VERSION, CONFIG...) and ``counters`` (64-bit, by `COUNTERS` name; cycles
    counts busy ticks) may be changed by a test. ``log`` lists every access as
    ``("read" | "write", offset, value)``; ``unmapped`` the offsets that hit no register;
    ``refused`` the locked registers written while the core was starting or busy. The
    registers of the windows the core lacks (`absent_registers`) read 0 and ignore writes; those
    it keeps narrower (`narrow_registers`) read back their `kept_value`.
    """

    def __init__(self, config, *, start_latency=0, run_ticks=3, outcome=ErrorCode.NONE,
                 error_index=0):
        for name, value in (("start_latency", start_latency), ("run_ticks", run_ticks)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 0")
        if outcome is not None and not isinstance(outcome, ErrorCode):
            raise ValueError(f"outcome={outcome!r} is invalid: allowed an ErrorCode or None")
        self.start_latency = start_latency
        self.run_ticks = run_ticks
        self.outcome = outcome
        self.error_index = error_index
        self.constants = constant_registers(config)
        self.stored = {reg.name: reg.reset for reg in REGISTERS if reg.access == "rw"}
        self.absent = absent_registers(config)
        self.narrow = narrow_registers(config)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.captured_high = dict.fromkeys(COUNTERS, 0)
        self.log = []
        self.unmapped = []
        self.refused = []
        self.busy = self.done = self.error = False
        self.pending = 0
        self.error_code = ErrorCode.NONE
        self.latched_index = 0
        self._starting = None
        self._remaining = 0

    @property
    def irq(self):
        """The core's interrupt line."""
        enabled = register("IRQ_ENABLE").fields_of(self.stored["IRQ_ENABLE"]).enable
        return bool(enabled and self.pending)

    def advance(self, ticks):
        """Let ``ticks`` ticks pass without an access."""
        for _ in range(ticks):
            self._tick()

    def read(self, offset):
        self._tick()
        value = self._read(_BY_OFFSET.get(offset & ~3), offset)
        self.log.append(("read", offset, value))
        return value

    def write(self, offset, value):
        self._tick()
        self.log.append(("write", offset, value))
        self._write(_BY_OFFSET.get(offset & ~3), offset, value)

    def _tick(self):
        if self._starting is not None:
            if self._starting:
                self._starting -= 1
                return
            self._starting = None
            self.busy, self._remaining = True, self.run_ticks
        if not self.busy:
            return
        if self._remaining:
            self._remaining -= 1
        elif self.outcome is not None:
            self._stop()
            return
        self.counters["cycles"] += 1

    def _stop(self):
        self.busy = False
        if self.outcome == ErrorCode.NONE:
            self.done = True
            self.pending |= register("IRQ_STATUS").value(done=1)
        else:
            self.error = True
            self.pending |= register("IRQ_STATUS").value(error=1)
            self.error_code, self.latched_index = self.outcome, self.error_index

    def _read(self, reg, offset):
        if reg is None:
            self.unmapped.append(offset)
            return 0
        if reg.name in self.constants:
            return self.constants[reg.name]
        if reg.name in self.narrow:
            return kept_value(self.narrow[reg.name], self.stored[reg.name])
        if reg.name in self.stored:
            return self.stored[reg.name]
        if reg.name in _COUNTER_HALVES:
            name, half = _COUNTER_HALVES[reg.name]
            if half == "HI":
                return self.captured_high[name]
            self.captured_high[name] = self.counters[name] >> 32 & 0xFFFF_FFFF
            return self.counters[name] & 0xFFFF_FFFF
        return {
            "CONTROL": 0,
            "STATUS": register("STATUS").value(busy=self.busy, done=self.done, error=self.error),
            "IRQ_STATUS": self.pending,
            "ERROR_CODE": register("ERROR_CODE").value(code=self.error_code.value),
            "ERROR_INDEX": self.latched_index,
        }[reg.name]

    def _write(self, reg, offset, value):
        if reg is None:
            self.unmapped.append(offset)
        elif reg.locked and (self.busy or self._starting is not None):
            self.refused.append(reg.name)
        elif reg.name in self.stored and reg.name not in self.absent:
            self.stored[reg.name] = value & reg.mask
        elif reg.name == "IRQ_STATUS":
            self.pending &= ~value
        elif reg.name == "CONTROL":
            control = register("CONTROL").fields_of(value)
            if control.soft_reset:
                self._soft_reset()
            elif control.start:
                self._start()

    def _start(self):
        """As the hardware: the error state and the counters clear even if a program runs."""
        self.done = self.error = False
        self.error_code, self.latched_index = ErrorCode.NONE, 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        if not self.busy and self._starting is None:
            self._starting = self.start_latency

    def _soft_reset(self):
        self.busy = self.done = self.error = False
        self._starting = None
        self.pending = 0
        self.error_code, self.latched_index = ErrorCode.NONE, 0
        self.counters = dict.fromkeys(COUNTERS, 0)
