"""The register map as data: the one definition that the HDL (`hdl.csr.ControlRegisters`), the
runtime, the C header and ``docs/registers.md`` (``registers_markdown()``) are derived from."""
from dataclasses import dataclass

from amaranth.lib import data

from .arch import Engine
from .isa import DIMS, NUM_WINDOWS

__all__ = ["ACCESSES", "ADDR_WIDTH", "BASIC_COUNTERS", "COUNTER_PROFILES", "COUNTERS",
           "CSR_VERSION", "ID_MAGIC", "REGISTERS", "TRAFFIC_COUNTERS", "BitField", "Register",
           "absent_registers", "constant_registers", "counter_names", "kept_value",
           "narrow_registers", "register", "register_span", "registers_markdown", "window_writes"]

ADDR_WIDTH = 12
ID_MAGIC = 0x54505547
"""Value of the ID register: "TPUG" in ASCII."""
CSR_VERSION = (1, 3)
"""Register map version (major, minor): major changes break software."""
ACCESSES = {
    "ro": "read-only; writes are ignored",
    "rw": "read/write",
    "w1c": "write 1 to clear a bit",
    "w1s": "write 1 to trigger an action; reads as 0",
}

COUNTERS = {
    "cycles": "Core clock cycles.",
    "macs": "Multiply-accumulates performed.",
    "bytes_read": "Bytes read from memory.",
    "bytes_written": "Bytes written to memory.",
    **{f"{engine}_{kind}_cycles": f"Cycles the {engine} engine was {what}."
       for engine in (engine.name.lower() for engine in Engine)
       for kind, what in (("busy", "busy"), ("stall", "stalled (busy but not progressing)"))},
}
"""Performance counters (``CoreConfig.counter_width`` bits): ``ControlRegisters`` input members
and ``<NAME>_LO/_HI`` pairs."""

TRAFFIC_COUNTERS = ("cycles", "macs", "bytes_read", "bytes_written")
"""The counters of ``CoreConfig.counters="traffic"``: time, work and bus traffic, without the
engines' busy cycles (`Stats` has None for them)."""

BASIC_COUNTERS = (*TRAFFIC_COUNTERS,
                  *(f"{engine.name.lower()}_busy_cycles" for engine in Engine))
"""The counters of ``CoreConfig.counters="basic"``: those the runtime's `Stats` reports (the
stall counters are left out; their registers read 0)."""

COUNTER_PROFILES = {"full": tuple(COUNTERS), "basic": BASIC_COUNTERS,
                    "traffic": TRAFFIC_COUNTERS}
"""The counters of each ``CoreConfig.counters`` profile."""


def counter_names(config):
    """The counters a core of ``config`` has, in ``COUNTERS`` order."""
    return tuple(name for name in COUNTERS if name in COUNTER_PROFILES[config.counters])


@dataclass(frozen=True)
class BitField:
    """Bits ``[lsb + width - 1 : lsb]`` of a register."""
    name: str
    lsb: int
    width: int
    doc: str


@dataclass(frozen=True)
class Register:
    """A 32-bit register at byte ``offset``. ``reset`` applies to ``rw`` registers only."""
    name: str
    offset: int
    access: str
    doc: str
    fields: tuple = ()
    reset: int = 0
    locked: bool = False
    """Part of the configuration a program runs with: while STATUS.busy, a write answers
    SLVERR and changes nothing."""

    def __post_init__(self):
        if not (isinstance(self.offset, int) and 0 <= self.offset < 2 ** ADDR_WIDTH
                and self.offset % 4 == 0):
            raise ValueError(f"Register {self.name}: offset={self.offset!r} is invalid: "
                             f"allowed a multiple of 4 below {2 ** ADDR_WIDTH:#x}")
        if self.access not in ACCESSES:
            raise ValueError(f"Register {self.name}: access={self.access!r} is invalid: "
                             f"allowed {', '.join(ACCESSES)}")
        used = 0
        for field in self.fields:
            mask = ((1 << field.width) - 1) << field.lsb
            if field.width < 1 or field.lsb < 0 or field.lsb + field.width > 32 or used & mask:
                raise ValueError(f"Register {self.name}: fields={self.fields!r} is invalid: "
                                 f"field {field.name} overlaps or leaves bits 31..0")
            used |= mask
        if self.access != "rw" and self.reset != 0 or self.reset & ~self.mask:
            raise ValueError(f"Register {self.name}: reset={self.reset!r} is invalid: "
                             f"allowed only on rw registers, within the fields")
        if self.locked and self.access != "rw":
            raise ValueError(f"Register {self.name}: locked={self.locked!r} is invalid: "
                             f"allowed only on rw registers")

    @property
    def mask(self):
        """The implemented bits; a register without fields is one 32-bit value."""
        if not self.fields:
            return 0xFFFF_FFFF
        return sum(((1 << f.width) - 1) << f.lsb for f in self.fields)

    @property
    def layout(self):
        """A 32-bit ``data.FlexibleLayout`` of the fields (``layout.from_bits(word).busy``)."""
        return self._fields_layout(32)

    @property
    def stored_layout(self):
        """The fields in as few bits as reach the highest (``layout`` without the bits above):
        the flip-flops of a register that keeps them."""
        return self._fields_layout(self.mask.bit_length())

    def _fields_layout(self, size):
        return data.FlexibleLayout(size, {f.name: data.Field(f.width, f.lsb) for f in self.fields})

    def value(self, **fields):
        """The word with ``fields`` set and the others 0: ``register("CONTROL").value(start=1)``."""
        return self.layout.const(fields).as_value().value

    def fields_of(self, word):
        """The fields of ``word``: ``register("STATUS").fields_of(word).done``."""
        return self.layout.from_bits(word & self.mask)


def _registers():
    regs = [
        Register("ID", 0x000, "ro", f"Constant {ID_MAGIC:#010x} (\"TPUG\")."),
        Register("VERSION", 0x004, "ro", "Register map version.", (
            BitField("minor", 0, 16, "Minor version: compatible additions."),
            BitField("major", 16, 16, "Major version: incompatible changes."))),
        Register("CONFIG0", 0x008, "ro", "Array geometry of this core.", (
            BitField("rows", 0, 8, "Array rows (reduction depth of a weight tile)."),
            BitField("cols", 8, 8, "Array columns (output channels of a weight tile)."),
            BitField("data_width", 16, 8, "Operand width in bits."),
            BitField("acc_width", 24, 8, "Accumulator width in bits."))),
        Register("CONFIG1", 0x00C, "ro", "Memory interface of this core.", (
            BitField("axi_data_width", 0, 8, "AXI4 memory master data width in bits."),
            BitField("lanes", 8, 8, "int8 lanes in one scratchpad row."),
            BitField("windows", 16, 4, "Access windows the core has: WINDOW0.. up to this "
                                       "count (the others read 0 and ignore writes)."),
            BitField("missing_dims", 20, 2, "Tensor descriptor dims the DMA walkers lack: "
                                            f"they walk {DIMS} less this; a dim past them must "
                                            "have extent 1 (0 on a core of map 1.1, whose "
                                            "windows field was 8 bits)."),
            BitField("softmax", 24, 1, "The softmax unit is present (SOFTMAX, fused attention)."),
            BitField("im2col", 25, 1, "The load engine's im2col walker is present."),
            BitField("wide_counters", 26, 1, "Counters are 64 bits (else 32: _HI reads 0)."),
            BitField("shift_only_epilogue", 27, 1, "The epilogue has no multiplier: it ignores "
                                                   "PARAMS' multiplier (as if 1)."),
            BitField("basic_counters", 28, 1, "Only the basic counters (cycles, macs, bytes, "
                                              "busy cycles, or with CONFIG2.no_busy_counters "
                                              "not those): the others read 0."),
            BitField("queue_depth", 29, 3, "Instructions queued per engine; 0 on a core of "
                                           "map 1.1, which queues 2."))),
        Register("SCRATCHPAD_ROWS", 0x010, "ro", "Scratchpad rows (of `lanes` bytes)."),
        Register("ACCUMULATOR_ROWS", 0x014, "ro", "Accumulator rows (of `cols` int32)."),
        Register("CONFIG2", 0x018, "ro", "Instruction handling of this core (map 1.3 on; "
                                         "unmapped before).", (
            BitField("no_store_prefetch", 0, 1, "The store engine runs from its queue's one "
                                                "slot: a STORE or PARAMS is fetched once the "
                                                "STORE before it is done."),
            BitField("no_weight_prefetch", 1, 1, "Two weight registers a PE: a weight tile "
                                                 "loads once the tile before it has started "
                                                 "in every PE (a longer minimum MATMUL)."),
            BitField("no_load_prefetch", 2, 1, "The load engine runs from its queue's one "
                                               "slot: a LOAD is fetched once the LOAD before "
                                               "it is done (0 on older cores, which "
                                               "prefetch)."),
            BitField("shared_dma", 3, 1, "One DMA front for the load and store engines: a LOAD's "
                                         "and a STORE's walks do not overlap (0 on older "
                                         "cores, which have one each)."),
            BitField("address_bits_missing", 4, 5, "32 less the core's address bits: its address "
                                                   "space is the 2**(32 - this) bytes from 0, "
                                                   "where addresses wrap (0 on older cores, "
                                                   "which have 32)."),
            BitField("unregistered_accumulate", 9, 1, "The execute engine adds an accumulator "
                                                      "row as it is read: a result is written "
                                                      "a cycle sooner (0 on older cores)."),
            BitField("unbuffered_feeders", 10, 1, "The execute engine reads a scratchpad row "
                                                  "once the array takes the row before it "
                                                  "(0 on older cores, which read ahead)."),
            BitField("broadcast_activations", 11, 1, "Each activation reaches every column of "
                                                     "its row in one cycle: a shorter array "
                                                     "latency and minimum tile (0 on older "
                                                     "cores, which skew them)."),
            BitField("adder_tree_columns", 12, 1, "Each column adds its rows' products in one "
                                                  "cycle, every row taking its activation at "
                                                  "once: a shorter array latency and minimum "
                                                  "tile (0 on older cores, which pass partial "
                                                  "sums down the rows)."),
            BitField("counters_in_ram", 13, 1, "The counters are kept in block RAM: a read "
                                               "of a counter's _LO waits for its next update "
                                               "(0 on older cores, whose counters are "
                                               "flip-flops)."),
            BitField("no_pool", 14, 1, "The epilogue has no 2x2 max pooling: a STORE with "
                                       "pool stops the core with UNKNOWN_OPCODE (0 on older "
                                       "cores, which pool)."),
            BitField("no_weight_chain", 15, 1, "A weight tile loads into the PEs' active "
                                               "weights once the tile before has taken its "
                                               "last vector: rows idle cycles between "
                                               "tiles (0 on older cores, which chain)."),
            BitField("no_execute_prefetch", 16, 1, "The execute engine runs from its queue's "
                                                   "one slot: a MATMUL is fetched once the "
                                                   "one before it is dispatched (0 on older "
                                                   "cores, which prefetch)."),
            BitField("no_busy_counters", 17, 1, "With CONFIG1.basic_counters, no busy-cycle "
                                                "counters either: cycles, macs and bytes only "
                                                "(0 on older cores)."))),
        Register("CONTROL", 0x020, "w1s", "Commands.", (
            BitField("start", 0, 1, "Run the program at PROGRAM_BASE; clears STATUS.done, "
                                    "STATUS.error, ERROR_CODE and ERROR_INDEX."),
            BitField("soft_reset", 1, 1, "Reset the core; clears STATUS, IRQ_STATUS, ERROR_CODE "
                                         "and ERROR_INDEX, keeps the configuration registers. "
                                         "Bursts in flight are finished first (STATUS.busy; "
                                         "a request or W beat offered is sent as it was, "
                                         "the W beats of its presented bursts may follow, "
                                         "the rest go out with WSTRB 0); a start waits."))),
        Register("STATUS", 0x024, "ro", "Core state.", (
            BitField("busy", 0, 1, "A program is running, or a soft reset is finishing."),
            BitField("done", 1, 1, "The last program reached END."),
            BitField("error", 2, 1, "The last program stopped with an error (see ERROR_CODE)."))),
        Register("IRQ_ENABLE", 0x028, "rw", "Interrupt enable.", (
            BitField("enable", 0, 1, "Drive `irq` while an IRQ_STATUS bit is pending."),)),
        Register("IRQ_STATUS", 0x02C, "w1c", "Pending interrupt causes; write 1 to acknowledge.", (
            BitField("done", 0, 1, "A program reached END."),
            BitField("error", 1, 1, "A program stopped with an error."))),
        Register("ERROR_CODE", 0x030, "ro", "Latched when an error stops the core.", (
            BitField("code", 0, 4, "An `ErrorCode` (0: none)."),)),
        Register("ERROR_INDEX", 0x034, "ro",
                 "Index of the faulting instruction, latched with ERROR_CODE (modulo "
                 "2**(address bits - 5) on a core of fewer than 32 address bits)."),
        Register("PROGRAM_BASE", 0x040, "rw", "Byte address of the first instruction.",
                 locked=True),
        Register("PROGRAM_LENGTH", 0x044, "rw", "Program length in instructions (on a core of "
                 "fewer than 32 address bits, from 2**(address bits - 5) on no limit: the "
                 "program runs to END).", locked=True),
        Register("WATCHDOG", 0x048, "rw",
                 "Cycles without progress before the core stops with WATCHDOG.", reset=65536,
                 locked=True),
    ]
    for i in range(NUM_WINDOWS):
        base = 0x080 + 0x10 * i
        regs += [
            Register(f"WINDOW{i}_BASE", base, "rw", f"Access window {i}: first byte address.",
                     locked=True),
            Register(f"WINDOW{i}_SIZE", base + 4, "rw", f"Access window {i}: bytes (0: disabled).",
                     locked=True),
            Register(f"WINDOW{i}_FLAGS", base + 8, "rw", f"Access window {i}: permissions.", (
                BitField("read", 0, 1, "DMA and instruction fetch may read the window."),
                BitField("write", 1, 1, "DMA may write the window.")), locked=True),
        ]
    for i, (name, doc) in enumerate(COUNTERS.items()):
        base = 0x100 + 8 * i
        regs += [
            Register(f"{name.upper()}_LO", base, "ro",
                     f"{doc} Bits 31..0; reading them captures bits 63..32."),
            Register(f"{name.upper()}_HI", base + 4, "ro",
                     f"{doc} Bits 63..32, as captured by the last read of _LO."),
        ]
    return tuple(regs)


REGISTERS = _registers()
"""The register map, in address order."""

_BY_NAME = {reg.name: reg for reg in REGISTERS}
assert len(_BY_NAME) == len(REGISTERS)
assert len({reg.offset for reg in REGISTERS}) == len(REGISTERS)
assert [reg.offset for reg in REGISTERS] == sorted(reg.offset for reg in REGISTERS)


def register(name):
    """The register called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown register {name!r}: known {', '.join(_BY_NAME)}") from None


def register_span(first, last):
    """The registers from ``first`` to ``last``, which must be consecutive words (to read them
    in one access)."""
    span = REGISTERS[REGISTERS.index(register(first)):REGISTERS.index(register(last)) + 1]
    if [reg.offset - span[0].offset for reg in span] != list(range(0, 4 * len(span), 4)):
        raise ValueError(f"registers {first}..{last} are not consecutive words")
    return span


def window_writes(windows):
    """(register name, value) to program ``windows`` (up to NUM_WINDOWS of (base, size,
    readable, writable)) and disable the rest."""
    if len(windows) > NUM_WINDOWS:
        raise ValueError(f"{len(windows)} windows: at most {NUM_WINDOWS}")
    writes = []
    for i in range(NUM_WINDOWS):
        base, size, readable, writable = windows[i] if i < len(windows) else (0, 0, False, False)
        flags = register(f"WINDOW{i}_FLAGS").value(read=readable, write=writable)
        writes += [(f"WINDOW{i}_BASE", base), (f"WINDOW{i}_SIZE", size),
                   (f"WINDOW{i}_FLAGS", flags)]
    return writes


def absent_registers(config):
    """The window registers a core of ``config`` lacks (windows ``CoreConfig.windows`` on):
    they read 0 and ignore writes, answering as the locked registers they are."""
    return tuple(f"WINDOW{i}_{part}" for i in range(config.windows, NUM_WINDOWS)
                 for part in ("BASE", "SIZE", "FLAGS"))


def narrow_registers(config):
    """{name: bits} of the rw registers a core of ``config`` keeps narrower than 32 bits: the
    addresses (``CoreConfig.address_width``) and the program length (``index_width``). Such a
    register keeps bits ``bits - 1..0`` as written and, as bit ``bits``, whether any bit above
    them is set (`kept_value`): the core treats every value from ``2**bits`` on alike (a window
    or program base beyond the address space, a size reaching past it, no length limit)."""
    bits = {**{f"WINDOW{i}_{part}": config.address_width
               for i in range(config.windows) for part in ("BASE", "SIZE")},
            "PROGRAM_BASE": config.address_width, "PROGRAM_LENGTH": config.index_width}
    return {name: width for name, width in bits.items() if width < 32}


def kept_value(bits, value):
    """What a register of `narrow_registers` kept in ``bits`` bits holds and reads back for a
    written ``value``: its bits ``bits - 1..0``, and bit ``bits`` set if any bit above is."""
    return value & ((1 << bits) - 1) | (value >> bits != 0) << bits


def constant_registers(config):
    """Values of the constant (identification and configuration) registers for ``config``."""
    fields = {
        "VERSION": {"major": CSR_VERSION[0], "minor": CSR_VERSION[1]},
        "CONFIG0": {"rows": config.rows, "cols": config.cols, "data_width": config.data_width,
                    "acc_width": config.acc_width},
        "CONFIG1": {"axi_data_width": config.axi_data_width, "lanes": config.lanes,
                    "windows": config.windows, "softmax": config.softmax, "im2col": config.im2col,
                    "wide_counters": config.counter_width == 64,
                    "shift_only_epilogue": not config.epilogue_multiplier,
                    "basic_counters": config.counters != "full",
                    "queue_depth": config.queue_depth,
                    "missing_dims": DIMS - config.descriptor_dims},
    }
    return {
        "ID": ID_MAGIC,
        **{name: register(name).value(**values) for name, values in fields.items()},
        "SCRATCHPAD_ROWS": config.scratchpad_rows,
        "ACCUMULATOR_ROWS": config.accumulator_rows,
        "CONFIG2": register("CONFIG2").value(no_store_prefetch=not config.store_prefetch,
                                             no_weight_prefetch=not config.weight_prefetch,
                                             no_load_prefetch=not config.load_prefetch,
                                             shared_dma=config.shared_dma,
                                             address_bits_missing=32 - config.address_width,
                                             unregistered_accumulate=not
                                             config.registered_accumulate,
                                             unbuffered_feeders=not config.buffered_feeders,
                                             broadcast_activations=
                                             config.broadcast_activations,
                                             adder_tree_columns=config.adder_tree_columns,
                                             counters_in_ram=config.counters_in_ram,
                                             no_pool=not config.epilogue_pool,
                                             no_weight_chain=not config.weight_chain,
                                             no_execute_prefetch=not config.execute_prefetch,
                                             no_busy_counters=config.counters == "traffic"),
    }


_MARKDOWN_INTRO = """\
# Control and status registers

Generated from `REGISTERS` in `tpugen/registers.py` by `registers_markdown()`; do not edit by hand.

The registers sit behind an AXI4-Lite slave: 32-bit registers, 12-bit byte addresses (bits 1..0
are ignored), WSTRB honoured. Mapped registers answer OKAY; unmapped addresses answer SLVERR and
read as 0. Unlisted bits read as 0 and ignore writes.

The configuration a program runs with (the registers marked "locked" below: program base and
length, watchdog, windows) is frozen from the write of CONTROL.start until STATUS.busy falls: a
write to one of them in that time answers SLVERR and changes nothing, so a running program can
neither be moved nor given more memory than it was started with.
A core has `CONFIG1.windows` access windows (`CoreConfig.windows`, up to the map's four):
the registers of the others read 0 and ignore writes (SLVERR while locked, as the others).
On a core of A < 32 address bits (`CONFIG2.address_bits_missing` not 0) the windows' BASE and
SIZE and PROGRAM_BASE keep bits A-1..0 as written and, as bit A, whether any bit above them is
set (the core treats every such value alike: a base beyond the address space, a size reaching
past it); PROGRAM_LENGTH likewise at A - 5 bits (from there on no limit).
Counters are LO/HI pairs: read LO first, then HI returns the upper half captured by that read
(with 32-bit counters, `CONFIG1.wide_counters` 0, HI reads 0).

Access types:

{accesses}
"""


def registers_markdown():
    """``docs/registers.md``: the register map and its fields."""
    accesses = "\n".join(f"* `{name}`: {doc}." for name, doc in ACCESSES.items())
    lines = [_MARKDOWN_INTRO.format(accesses=accesses),
             "| Offset | Name | Access | Reset | Description |",
             "|--------|------|--------|-------|-------------|"]
    for reg in REGISTERS:
        reset = f"{reg.reset:#x}" if reg.access == "rw" else ""
        access = f"{reg.access}, locked" if reg.locked else reg.access
        lines.append(f"| 0x{reg.offset:03X} | {reg.name} | {access} | {reset} | {reg.doc} |")
    lines += ["", "## Fields", "",
              "| Register | Bits | Field | Description |",
              "|----------|------|-------|-------------|"]
    for reg in REGISTERS:
        for f in reg.fields:
            bits = f"{f.lsb}" if f.width == 1 else f"{f.lsb + f.width - 1}..{f.lsb}"
            lines.append(f"| {reg.name} | {bits} | {f.name} | {f.doc} |")
    return "\n".join(lines) + "\n"
