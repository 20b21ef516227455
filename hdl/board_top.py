"""The board top: the PLL making the core's clock (`ECP5Pll`, `ICE40Pll`), its reset
(`PllReset`), and a system such as `BoardSystem` on the board's UART and LEDs (`BoardTop`).
``fpga/build.py`` finds the PLL settings and runs the tools."""
from dataclasses import dataclass
from fractions import Fraction

from amaranth import ClockDomain, ClockSignal, Elaboratable, Instance, Module, ResetSignal, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["BoardTop", "ECP5Pll", "ECP5PllSettings", "ICE40Pll", "ICE40PllSettings", "PllReset"]


@dataclass(frozen=True)
class ECP5PllSettings:
    """EHXPLLL dividers: f_out = f_in / clki_div * clkfb_div, VCO = f_out * clkop_div."""
    input_mhz: Fraction
    clki_div: int
    clkfb_div: int
    clkop_div: int

    @property
    def output_mhz(self):
        return self.input_mhz / self.clki_div * self.clkfb_div

    @property
    def vco_mhz(self):
        return self.output_mhz * self.clkop_div


@dataclass(frozen=True)
class ICE40PllSettings:
    """SB_PLL40 dividers in SIMPLE feedback: VCO = f_in / (divr + 1) * (divf + 1),
    f_out = VCO / 2**divq."""
    input_mhz: Fraction
    divr: int
    divf: int
    divq: int

    @property
    def pfd_mhz(self):
        return self.input_mhz / (self.divr + 1)

    @property
    def vco_mhz(self):
        return self.pfd_mhz * (self.divf + 1)

    @property
    def output_mhz(self):
        return self.vco_mhz / 2 ** self.divq

    @property
    def filter_range(self):
        """The loop filter setting for the phase detector's frequency (as icepll computes it)."""
        return 1 + sum(self.pfd_mhz >= edge for edge in (17, 26, 44, 66, 101))


class ECP5Pll(wiring.Component):
    """An ECP5 EHXPLLL with CLKOP fed back."""
    clk_in: In(1)
    clk_out: Out(1)
    locked: Out(1)

    def __init__(self, settings):
        if not isinstance(settings, ECP5PllSettings):
            raise ValueError(f"settings={settings!r} is invalid: an ECP5PllSettings")
        self._settings = settings
        super().__init__()

    def elaborate(self, platform):
        pll = self._settings
        m = Module()
        m.submodules.pll = Instance(
            "EHXPLLL",
            # Loop filter as ecppll and Lattice's tools set it.
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            a_FREQUENCY_PIN_CLKI=f"{float(pll.input_mhz):g}",
            a_FREQUENCY_PIN_CLKOP=f"{float(pll.output_mhz):g}",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=pll.clki_div, p_CLKFB_DIV=pll.clkfb_div, p_CLKOP_DIV=pll.clkop_div,
            # Zero phase in Lattice's convention.
            p_CLKOP_CPHASE=pll.clkop_div - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            i_CLKI=self.clk_in, i_CLKFB=self.clk_out, i_RST=0, i_STDBY=0, i_PHASESEL0=0,
            i_PHASESEL1=0, i_PHASEDIR=0, i_PHASESTEP=0, i_PHASELOADREG=0, i_PLLWAKESYNC=0,
            i_ENCLKOP=0, o_CLKOP=self.clk_out, o_LOCK=self.locked)
        return m


class ICE40Pll(wiring.Component):
    """An iCE40 SB_PLL40_PAD in SIMPLE feedback, driven straight from the clock pin ``pad``
    (an IOValue: the pin requested with ``dir="-"``, no input buffer)."""
    clk_out: Out(1)
    locked: Out(1)

    def __init__(self, settings, pad):
        if not isinstance(settings, ICE40PllSettings):
            raise ValueError(f"settings={settings!r} is invalid: an ICE40PllSettings")
        self._settings = settings
        self._pad = pad
        super().__init__()

    def elaborate(self, platform):
        pll = self._settings
        m = Module()
        m.submodules.pll = Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH="SIMPLE", p_DIVR=pll.divr, p_DIVF=pll.divf, p_DIVQ=pll.divq,
            p_FILTER_RANGE=pll.filter_range,
            io_PACKAGEPIN=self._pad, i_RESETB=1, i_BYPASS=0,
            o_PLLOUTGLOBAL=self.clk_out, o_LOCK=self.locked)
        return m


class PllReset(wiring.Component):
    """Reset for the clock domain ``domain`` driven by a PLL: asserted from power-up while the PLL
    is unlocked and for ``hold_cycles`` after it locks (iCE40 block RAMs read zeros for ~3 us
    after configuration). Its own flip-flops are never reset, so it may drive the domain's reset.
    """
    locked: In(1)
    reset: Out(1, init=1)

    def __init__(self, hold_cycles, *, domain="sync"):
        if isinstance(hold_cycles, bool) or not isinstance(hold_cycles, int) or hold_cycles < 1:
            raise ValueError(f"hold_cycles={hold_cycles!r} is invalid: an integer >= 1")
        self._hold_cycles = hold_cycles
        self._domain = domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.domains.por = ClockDomain(reset_less=True, local=True)
        m.d.comb += ClockSignal("por").eq(ClockSignal(self._domain))
        locked = Signal()
        m.submodules.locked_sync = FFSynchronizer(self.locked, locked, o_domain="por")
        count = Signal(range(self._hold_cycles + 1))
        with m.If(~locked):
            m.d.por += count.eq(0)
        with m.Elif(count != self._hold_cycles):
            m.d.por += count.eq(count + 1)
        m.d.por += self.reset.eq(~locked | (count != self._hold_cycles))
        return m


class BoardTop(Elaboratable):
    """What goes on a board: the PLL making the "sync" clock, its reset, and ``system`` (a
    component with ports uart_rx, uart_tx and leds, e.g. BoardSystem) on the board's UART and
    LEDs."""

    RESET_HOLD_US = 20

    def __init__(self, board, system, pll):
        self.board = board
        self.system = system
        self.pll = pll

    def elaborate(self, platform):
        board, system = self.board, self.system
        m = Module()
        clock_pin = platform.request(platform.default_clk, dir="-")
        if board.family == "ecp5":
            m.submodules.pll = pll = ECP5Pll(self.pll)
            m.submodules.clock_buffer = clock_buffer = io.Buffer("i", clock_pin)
            m.d.comb += pll.clk_in.eq(clock_buffer.i)
        else:
            m.submodules.pll = pll = ICE40Pll(self.pll, clock_pin.io)
        platform.add_clock_constraint(pll.clk_out, float(self.pll.output_mhz) * 1e6)
        m.domains.sync = ClockDomain()
        m.submodules.reset = reset = PllReset(
            int(self.RESET_HOLD_US * self.pll.output_mhz) + 1)
        m.d.comb += [ClockSignal("sync").eq(pll.clk_out), reset.locked.eq(pll.locked),
                     ResetSignal("sync").eq(reset.reset)]

        m.submodules.system = system
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = uart_rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart.tx)
        m.submodules.uart_rx_sync = FFSynchronizer(uart_rx.i, system.uart_rx, init=1)
        m.d.comb += uart_tx.o.eq(system.uart_tx)
        for bit, (name, number) in enumerate(board.leds):
            pin = platform.request(name, number, dir="-")
            m.submodules[f"led_{bit}"] = led = io.Buffer("o", pin)
            m.d.comb += led.o.eq(system.leds[bit])
        return m
