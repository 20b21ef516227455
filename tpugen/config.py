"""`CoreConfig`: the single source of truth for the HDL, the runtime, the tests and the C header."""
import json
from dataclasses import asdict, dataclass, fields

from .arch import MAX_QUEUE_DEPTH, QUEUE_DEPTH
from .isa import ADDRESS_WIDTHS, DIMS, NUM_WINDOWS
from .registers import COUNTER_PROFILES

__all__ = ["CoreConfig", "PRESETS", "check_config", "power_of_two"]


def power_of_two(value):
    """Whether the integer ``value`` is a power of two (1, 2, 4, ...)."""
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class CoreConfig:
    """Parameters of one generated core. Every field is checked; a bad value raises ValueError naming it."""

    rows: int = 8
    """Array rows: the reduction (K) depth of one weight tile, 1..64."""
    cols: int = 8
    """Array columns: output channels (N) of one weight tile, 1..64."""
    data_width: int = 8
    """Operand width in bits (signed); only 8 is supported."""
    acc_width: int = 32
    """Accumulator width in bits (signed, wrapping); only 32 is supported."""
    dataflow: str = "ws"
    """Dataflow: "ws" (weight stationary)."""
    scratchpad_kib: int = 64
    """Scratchpad SRAM for activations and weights, in KiB (power of two, 1..1024)."""
    accumulator_kib: int = 16
    """Accumulator SRAM (int32), in KiB (power of two, 1..1024)."""
    axi_data_width: int = 64
    """AXI4 memory master data width in bits: 32, 64 or 128."""
    lut_multipliers: int = 0
    """PEs whose multiplier is built from LUTs; the rest use `*`, which yosys maps to DSP
    blocks (an FPGA with fewer DSPs than PEs needs the difference here), 0..rows*cols."""
    softmax: bool = True
    """The softmax unit (online softmax, fused attention) and its probability buffer. Without
    it a SOFTMAX instruction stops the core with UNKNOWN_OPCODE and the runtime refuses
    ``softmax`` / ``attention``."""
    im2col: bool = True
    """The load engine's im2col walker (implicit-GEMM convolution of any shape). Without it an
    im2col LOAD stops the core with UNKNOWN_OPCODE; conv2d then needs the pixels lowering."""
    counter_width: int = 32
    """Width of the performance counters, 32 or 64 bits (the ``_HI`` registers read 0 at 32)."""
    # The feature profile of the store epilogue and the registers (the micro preset's savings).
    epilogue_multiplier: bool = True
    """The epilogue's per-lane requantize multiplier. Without it the core ignores the multiplier
    of PARAMS (as if 1): the runtime folds a power-of-two multiplier into the shift and applies
    any other requantization on the host (`Stats.host_epilogue`)."""
    epilogue_pool: bool = True
    """The epilogue's 2x2 max pooling (`isa.Epilogue.pool`). Without it a STORE with ``pool``
    stops the core with UNKNOWN_OPCODE, and the runtime pools a conv2d's results on the host
    (`Stats.host_epilogue`; the same values, as the epilogue is monotonic): no pool maximum,
    no pooled walks, and the epilogue adds the bias as the accumulator and parameters come,
    a stage less (micro: False)."""
    counters: str = "full"
    """The performance counters: "full" (every one of ``registers.COUNTERS``), "basic" (only
    ``registers.BASIC_COUNTERS``, what `Stats` reports; the others read 0) or "traffic"
    (``registers.TRAFFIC_COUNTERS``: cycles, MACs and bytes, not the engines' busy cycles, which
    `Stats` has as None; micro, 66 UP5K logic cells less)."""
    windows: int = NUM_WINDOWS
    """Access windows in hardware, 1..``isa.NUM_WINDOWS``: windows 0..windows-1 (the register
    map keeps all ``NUM_WINDOWS``; the others' registers read 0 and ignore writes). The runtime
    merges a run's windows to fit (`firmware.device.fit_windows`)."""
    queue_depth: int = QUEUE_DEPTH
    """Instructions the controller queues per engine, 1..7 (LUT RAM on ECP5, flip-flops on
    iCE40). At 1 there is no overflow memory either: an instruction fetched while its engine's
    queue is full is dropped and fetched again once the queue has room."""
    store_prefetch: bool = True
    """A STORE or PARAMS is queued while the store engine runs the STORE before, which the
    engine keeps a copy of. False (needs ``queue_depth`` 1): the store engine runs from its
    queue's one slot, which holds until the STORE is done, so the next one is fetched once the
    engine is idle: an instruction's flip-flops less. The execute engine keeps its copy, and
    the load engine its own unless ``load_prefetch`` is False (a LOAD or MATMUL waiting for its
    fetch stalls the array; a STORE seldom does)."""
    load_prefetch: bool = True
    """A LOAD is queued while the load engine runs the LOAD before, which the engine keeps a
    copy of. False (needs ``queue_depth`` 1; micro): the load engine runs from its queue's one
    slot, which it gives back once a tensor LOAD's walk runs (its DMA front keeps what it walks
    by, `hdl.dma_front.FrontClient.holds`) or an im2col LOAD is done: the next LOAD is fetched
    and checked meanwhile (micro: 266 UP5K logic cells less, a matmul's cycles +2% to +4%)."""
    execute_prefetch: bool = True
    """A MATMUL or SOFTMAX is queued while the execute engine checks and dispatches the one
    before, which the engine keeps a copy of. False (needs ``queue_depth`` 1; micro): the
    engine reads it from its queue's one slot, which holds until it is dispatched (a MATMUL to
    the row feeders, while the MATMUL before it streams): the next is fetched then, an
    instruction's flip-flops less."""
    shared_dma: bool = False
    """One DMA front (tile walker, element stage and burst planner) for the load and store
    engines, instead of one each (`hdl.dma_front.SharedDmaFront`): an engine that wants it
    waits while the other walks a tile; their checks before a walk and their bus beats after it
    still overlap. Micro: 822 UP5K logic cells less, a matmul's cycles +2% to +30%."""
    weight_prefetch: bool = True
    """A weight tile loads into the array while the tile before it waits to start: each PE
    keeps three weights (its load chain's, the upcoming and the active one). False: two, the
    load chain's becoming the active one; a tile loads once the one before it has reached every
    PE, so a MATMUL needs more activation vectors to keep the array busy
    (`arch.min_tile_length`): ``rows * cols`` flip-flops less."""
    registered_accumulate: bool = True
    """The execute engine registers an accumulator row it reads, and the result beside it,
    before adding them (a cycle more from a result to its write: the block RAM's output
    through the adder into the write was the routed ECP5 8x8's critical path). False (micro):
    it reads the row a cycle before the result leaves the array and adds them as it does: no
    register of the row or the result (three of ``cols`` partial sums or int32 less), for a
    longer path (the UP5K at 18 MHz has the margin)."""
    buffered_feeders: bool = True
    """The execute engine's row feeders read scratchpad rows ahead into 3-deep FIFOs, so the
    array's ``ready`` reaches no block RAM. False (micro): a row waits on the read port's
    output until the array takes it, and the next read waits for that: two FIFOs of ``lanes``
    bytes less (387 UP5K cells), for a path from the array's ``ready`` into the scratchpad's
    read enables."""
    weight_chain: bool = True
    """A weight tile shifts into the PEs through a load chain while the tile before it computes.
    False (needs ``weight_prefetch`` False, ``broadcast_activations`` and
    ``adder_tree_columns``; micro): no chain; the tile's rows load straight into the PEs'
    active weights (an iCE40's SB_MAC16 B registers), a row a cycle, once the tile before it
    has taken its last vector: ``rows`` idle cycles of the array between tiles
    (`arch.tile_cycles`), ``rows * cols`` bytes of flip-flops less."""
    broadcast_activations: bool = False
    """Each activation reaches every PE of its row in the same cycle, instead of crossing the
    columns a cycle each (`arch.skewed_cols`): no activation registers between the columns and
    no de-skew of the results, ``cols - 1`` cycles less latency and a shorter
    `arch.min_tile_length`, for a net of ``cols`` loads per row (micro: True; a wide array's
    fanout would set its clock)."""
    adder_tree_columns: bool = False
    """Each column adds its rows' registered products in an adder tree and registers the sum,
    instead of passing a partial sum down a register per row: every row takes its activation
    in the same cycle (`arch.skewed_rows`), so there is no skew of the rows either, ``rows - 1``
    cycles less latency and a shorter `arch.min_tile_length`. A column keeps its ``rows - 1``
    adders and one register of ``rows`` (micro: True; a tall array's tree would set its
    clock)."""
    counters_in_ram: bool = False
    """The performance counters live in a block RAM of 16-bit words, updated a word a cycle
    in turn (`hdl.counters.CounterMemory`), instead of flip-flops: a read of a counter waits
    for its next update, at most two rounds of ``counters * counter_width / 16`` cycles (micro:
    True, 28 cycles; an iCE40 has no LUT RAM and few logic cells)."""
    descriptor_dims: int = DIMS
    """Tensor descriptor dimensions the DMA walkers handle, 2..``isa.DIMS``. The instruction
    format keeps ``isa.DIMS``; on a core with fewer a dim from ``descriptor_dims`` on must have
    extent 1 and start 0 (else BAD_EXTENT; bound 0 there pads the whole tile, as on any core):
    the runtime folds such dims into the base and refuses a tile that needs more."""
    address_width: int = 32
    """Bits of the byte addresses the core computes, 16..32: its address space is the
    ``2**address_width`` bytes from 0, where DMA and fetch addresses wrap (the AXI address
    bits above are 0), and a window beyond it covers nothing. A board build takes its memory's
    (`fpga.boards.Board.address_width`): narrower walkers, window checks and queued descriptors
    (micro on the iCEBreaker, 17 bits: see docs/DESIGN.md)."""

    def __post_init__(self):
        def check(name, ok, allowed):
            value = getattr(self, name)
            if isinstance(value, bool) or not ok(value):
                raise ValueError(f"CoreConfig.{name}={value!r} is invalid: allowed {allowed}")

        def integer_in(low, high):
            return lambda v: isinstance(v, int) and low <= v <= high

        check("rows", integer_in(1, 64), "an integer in 1..64")
        check("cols", integer_in(1, 64), "an integer in 1..64")
        check("data_width", lambda v: v == 8, "8")
        check("acc_width", lambda v: v == 32, "32")
        check("dataflow", lambda v: v == "ws", '"ws"')
        for name in ("scratchpad_kib", "accumulator_kib"):
            check(name, lambda v: integer_in(1, 1024)(v) and power_of_two(v),
                  "a power of two in 1..1024")
        check("axi_data_width", lambda v: v in (32, 64, 128), "32, 64 or 128")
        check("lut_multipliers", integer_in(0, self.macs), f"an integer in 0..{self.macs} (rows*cols)")
        for name in ("softmax", "im2col", "epilogue_multiplier", "epilogue_pool",
                     "store_prefetch", "load_prefetch", "execute_prefetch", "shared_dma",
                     "weight_prefetch", "weight_chain", "registered_accumulate",
                     "buffered_feeders", "broadcast_activations", "adder_tree_columns",
                     "counters_in_ram"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"CoreConfig.{name}={value!r} is invalid: allowed True or False")
        if self.softmax and not self.epilogue_multiplier:
            raise ValueError("CoreConfig.epilogue_multiplier=False is invalid with softmax=True: "
                             "attention's O / l is a multiply in the store epilogue (allowed "
                             "True, or softmax=False)")
        check("counter_width", lambda v: v in (32, 64), "32 or 64")
        profiles = tuple(COUNTER_PROFILES)
        check("counters", lambda v: v in profiles,
              ", ".join(f'"{name}"' for name in profiles[:-1]) + f' or "{profiles[-1]}"')
        check("windows", integer_in(1, NUM_WINDOWS), f"an integer in 1..{NUM_WINDOWS}")
        check("queue_depth", integer_in(1, MAX_QUEUE_DEPTH), f"an integer in 1..{MAX_QUEUE_DEPTH}")
        check("descriptor_dims", integer_in(2, DIMS), f"an integer in 2..{DIMS}")
        check("address_width", integer_in(ADDRESS_WIDTHS.start, ADDRESS_WIDTHS.stop - 1),
              f"an integer in {ADDRESS_WIDTHS.start}..{ADDRESS_WIDTHS.stop - 1}")
        for engine in ("store", "load", "execute"):
            if not getattr(self, f"{engine}_prefetch") and self.queue_depth != 1:
                raise ValueError(f"CoreConfig.{engine}_prefetch=False is invalid with queue_depth="
                                 f"{self.queue_depth}: the {engine} engine runs from a "
                                 "one-instruction queue (allowed True, or queue_depth=1)")
        if not self.weight_chain and (self.weight_prefetch or not self.broadcast_activations
                                      or not self.adder_tree_columns):
            raise ValueError("CoreConfig.weight_chain=False is invalid with weight_prefetch="
                             f"{self.weight_prefetch}, broadcast_activations="
                             f"{self.broadcast_activations}, adder_tree_columns="
                             f"{self.adder_tree_columns}: a tile loads into the active weights "
                             "once every PE is done with the tile before (allowed True, or "
                             "weight_prefetch=False, broadcast_activations=True and "
                             "adder_tree_columns=True)")
        if self.scratchpad_rows > 65536:
            raise ValueError(f"CoreConfig.scratchpad_kib={self.scratchpad_kib!r} is invalid: "
                             f"at most 65536 rows of {self.lanes} bytes")
        if self.accumulator_rows > 65536:
            raise ValueError(f"CoreConfig.accumulator_kib={self.accumulator_kib!r} is invalid: "
                             f"at most 65536 rows of {self.cols} int32")
        if self.accumulator_rows < 1:
            raise ValueError(f"CoreConfig.accumulator_kib={self.accumulator_kib!r} is invalid: "
                             f"at least one row of {self.cols} int32")

    @property
    def macs(self):
        """Multiply-accumulate units in the array."""
        return self.rows * self.cols

    @property
    def index_width(self):
        """Bits of the instruction indices (the program counter, ERROR_INDEX, PROGRAM_LENGTH as
        the core counts it): 32, or on a core of fewer address bits ``address_width - 5``,
        twice the instructions its address space holds (the policies in `tpugen.isa`)."""
        return 32 if self.address_width == 32 else self.address_width - 5

    @property
    def lanes(self):
        """int8 lanes in one scratchpad row: an activation vector (rows) or a weight row (cols)."""
        return max(self.rows, self.cols)

    @property
    def scratchpad_rows(self):
        return self.scratchpad_kib * 1024 // self.lanes

    @property
    def accumulator_rows(self):
        """Rows of ``cols`` int32 accumulators."""
        return self.accumulator_kib * 1024 // (4 * self.cols)

    @property
    def probability_rows(self):
        """Rows of the softmax unit's probability buffer (``lanes`` uint8) and state (m, l)."""
        return self.accumulator_rows // 2

    def to_json(self):
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("CoreConfig JSON must be an object")
        cls.check_field_names(data)
        return cls(**data)

    @classmethod
    def check_field_names(cls, data):
        """ValueError naming the keys of dict ``data`` that are not fields."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown CoreConfig field(s): {', '.join(unknown)}")

    @classmethod
    def preset(cls, name):
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}: allowed {', '.join(PRESETS)}") from None


PRESETS = {
    "tiny": CoreConfig(rows=2, cols=2, scratchpad_kib=4, accumulator_kib=4, axi_data_width=32),
    "default": CoreConfig(),
    "large": CoreConfig(rows=16, cols=16, scratchpad_kib=256, accumulator_kib=64, axi_data_width=128),
    # The UP5K's 30 SB_RAM40_4K (256 x 16): the scratchpad and accumulator are each read
    # through two copies; 1 KiB of scratchpad is 4 of them, 4 KiB of accumulator (128-bit rows,
    # 256 of them) 16, as 1 KiB would be; the epilogue's lane parameters 3, the load plan 2,
    # the W beats 3, the counters 1 and the UART bridge's buffer 1: 30. (2 KiB of scratchpad
    # made 34; the board's default core has a 1 KiB accumulator, 95 logic cells less.)
    "micro": CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=4, axi_data_width=32,
                        softmax=False, im2col=False, epilogue_multiplier=False,
                        epilogue_pool=False, counters="traffic", windows=1, queue_depth=1,
                        store_prefetch=False, weight_prefetch=False, weight_chain=False,
                        descriptor_dims=2, shared_dma=True, load_prefetch=False,
                        execute_prefetch=False, registered_accumulate=False,
                        buffered_feeders=False, broadcast_activations=True,
                        adder_tree_columns=True, counters_in_ram=True),
}


def check_config(config, name="config"):
    """ValueError naming ``name`` unless ``config`` is a `CoreConfig`: the one check every
    component and device that takes a configuration makes."""
    if not isinstance(config, CoreConfig):
        raise ValueError(f"{name}={config!r} is invalid: allowed a CoreConfig")
