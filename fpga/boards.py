"""The FPGA boards tpugen builds for: the one description that build, flash and tests read."""
from dataclasses import dataclass, replace

from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from ..config import CoreConfig

__all__ = ["BOARDS", "Board", "DeviceResource", "board_named"]

LED_ROLES = ("heartbeat", "irq", "uart_rx", "uart_tx")
"""What the bits of BoardSystem's ``leds`` port show, in order."""


@dataclass(frozen=True)
class DeviceResource:
    """One kind of FPGA resource: the nextpnr BEL type that implements it and the device's total."""
    kind: str
    """"luts", "ffs", "dsps", "block_rams" or "sprams"."""
    cell: str
    total: int


@dataclass(frozen=True)
class Board:
    """An FPGA board: Amaranth platform, device, clocking, on-chip memory, UART and programmer."""
    name: str
    platform: type
    family: str
    """"ecp5" or "ice40": selects the PLL primitive and the nextpnr flavour."""
    resources: tuple
    """DeviceResource per kind; an iCE40 logic cell holds one LUT and one flip-flop."""
    default_mhz: float
    """Target clock of the core (the PLL output) unless `tpugen build --freq` says otherwise."""
    memory_kind: str
    """What BoardSystem builds its memory from: "bram" or "spram"."""
    memory_kib: int
    register_slice: bool
    """Whether BoardSystem puts an AXI register slice between the core and the memory."""
    baud: int
    programmer_board: str
    """openFPGALoader's ``-b`` name for the board."""
    bitstream_suffix: str
    leds: tuple
    """(resource name, number) of the LED showing each of LED_ROLES."""
    default_array: tuple
    """(rows, cols) built when none are given: the project's target array for the device."""
    extra_resources: str = ""
    """Name of a platform attribute holding resources to add (an attached PMOD)."""
    scratchpad_kib: int = 1
    accumulator_kib: int = 1
    axi_data_width: int = 32
    reserved_dsps: int = 0
    """DSP blocks the core uses outside the array (the store epilogue), kept free of PEs."""
    pes_per_dsp: int = 1
    """PEs one DSP block holds: 2 on iCE40 (an SB_MAC16's two 8x8 halves, hdl/array.py)."""
    profile: str = "default"
    """The preset (`config.PRESETS`) whose feature profile `default_config` takes: every field
    but the array, the memories, the bus width and the LUT multipliers, which the board sets."""

    @property
    def device(self):
        return self.platform.device

    def make_platform(self):
        """A fresh platform instance (Amaranth prepares each instance only once)."""
        platform = self.platform()
        if self.extra_resources:
            platform.add_resources(getattr(platform, self.extra_resources))
        return platform

    @property
    def input_mhz(self):
        """Frequency of the board's oscillator, the PLL's input."""
        return self.platform().default_clk_frequency / 1e6

    def total(self, kind):
        return next((r.total for r in self.resources if r.kind == kind), 0)

    @property
    def address_width(self):
        """The address bits of the board's memory, the whole address space of a core on it
        (`CoreConfig.address_width`): `BoardSystem` maps nothing else."""
        return (self.memory_kib * 1024 - 1).bit_length()

    def default_config(self, rows=None, cols=None):
        """The CoreConfig for a ``rows`` x ``cols`` array (default: `default_array`) on this board:
        memories sized to fit beside the board memory, addresses as wide as it, and as many PEs
        on DSP blocks as the device has DSPs to spare."""
        rows = self.default_array[0] if rows is None else rows
        cols = self.default_array[1] if cols is None else cols
        config = replace(CoreConfig.preset(self.profile), rows=rows, cols=cols,
                         scratchpad_kib=self.scratchpad_kib, accumulator_kib=self.accumulator_kib,
                         axi_data_width=self.axi_data_width, address_width=self.address_width)
        return self.with_dsp_pes(config)

    def with_dsp_pes(self, config):
        """``config`` with as many PEs on DSP blocks as `dsp_pes` allows, the rest on LUTs."""
        config = replace(config, lut_multipliers=0)
        return replace(config, lut_multipliers=max(0, config.macs - self.dsp_pes(config)))

    def dsp_pes(self, config):
        """How many of ``config``'s PEs fit in the DSP blocks the rest of its core leaves free."""
        return max(0, self.total("dsps") - self.reserved_dsps) * self.pes_per_dsp


BOARDS = {board.name: board for board in (
    Board(
        name="ulx3s-85f", platform=ULX3S_85F_Platform, family="ecp5",
        resources=(DeviceResource("luts", "TRELLIS_COMB", 83_640),
                   DeviceResource("ffs", "TRELLIS_FF", 83_640),
                   DeviceResource("dsps", "MULT18X18D", 156),
                   DeviceResource("block_rams", "DP16KD", 208)),
        # The 8x8 board system routes at 50 MHz with a margin (56.3 and 57.9 MHz at its default
        # seed and seed 1, stop 39, docs/DESIGN.md); it ran at 25 MHz until then.
        default_mhz=50.0, memory_kind="bram", memory_kib=128,
        # The core and the memory's block RAMs sit far apart on the die: a register slice
        # between them takes the route off the paths from one into the other.
        register_slice=True,
        # The FT231X does up to 3 Mbaud; 1 Mbaud is a whole divisor of 3 MHz and of the clock.
        baud=1_000_000, programmer_board="ulx3s", bitstream_suffix=".bit",
        leds=(("led", 0), ("led", 1), ("led", 2), ("led", 3)),
        # The 8x8 routes at every seed tried, in under 10 minutes. The 16x16 full core fits
        # (59.8% of the LUTs) and routed at nextpnr's default seed at stop 40, but at some
        # seeds and netlists it does not (docs/DESIGN.md): not yet a default.
        default_array=(8, 8),
        scratchpad_kib=16, accumulator_kib=8, axi_data_width=64,
        # Measured with synth_ecp5 (yosys 0.70, axi_data_width=64): the store epilogue takes 4
        # MULT18X18D (two units, a 33x16 product of two MULT18X18D each: O / l of attention
        # too); the softmax unit none.
        reserved_dsps=4),
    Board(
        name="icebreaker", platform=ICEBreakerPlatform, family="ice40",
        resources=(DeviceResource("luts", "ICESTORM_LC", 5_280),
                   DeviceResource("ffs", "ICESTORM_LC", 5_280),
                   DeviceResource("dsps", "ICESTORM_DSP", 8),
                   DeviceResource("block_rams", "ICESTORM_RAM", 30),
                   DeviceResource("sprams", "ICESTORM_SPRAM", 4)),
        # 18 MHz: the micro board system (97% of the logic cells) routes at 19.8 to 21.9 MHz
        # at nextpnr's default and three other seeds (16.4 at a fourth), its long nets detoured
        # around congestion; at 24 MHz its timing failed.
        default_mhz=18.0, memory_kind="spram", memory_kib=128,
        # No register slice: the UP5K's logic cells are what it lacks.
        register_slice=False,
        # The FT2232H does up to 12 Mbaud; 1 Mbaud is a whole divisor of 18 MHz.
        baud=1_000_000, programmer_board="icebreaker", bitstream_suffix=".bin",
        # Heartbeat on the board's green LED, the interrupt on its red one; UART activity on two
        # green LEDs of the snap-off PMOD (its "led" 3 and 4; 2 is red).
        leds=(("led", 1), ("led", 0), ("led", 3), ("led", 4)), default_array=(4, 4),
        extra_resources="break_off_pmod",
        # 30 EBR of 4 kbit: the scratchpad and accumulator, each read through two copies, must be
        # small. The array instantiates its SB_MAC16s, two PEs to each (hdl/array.py), so a 4x4
        # takes all 8. synth_ice40 runs without -dsp: the core's other multipliers (more than 8)
        # are LUTs.
        # The micro profile: no softmax unit, no im2col walker, no pooling, one window,
        # one-instruction queues (the store engine runs from its slot), 2-dim walkers, the
        # counters in block RAM.
        scratchpad_kib=1, accumulator_kib=1, axi_data_width=32, pes_per_dsp=2, profile="micro"),
)}
"""Boards by name."""


def board_named(name):
    """The Board called ``name``; ValueError listing the boards if there is none."""
    try:
        return BOARDS[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}: allowed {', '.join(BOARDS)}") from None
