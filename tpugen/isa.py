"""Instruction and descriptor formats: the one definition used by the HDL decoder and the firmware.

Every instruction is ``INSTRUCTION_BITS`` wide (64 bytes, little endian in memory). The header
says which engine runs it and which dependency tokens it waits on and signals, as in VTA: each
engine pops a token from its neighbour's queue before it starts and pushes one when it is done.
The engines form a chain load -> execute -> store, so "prev" and "next" are the neighbours.
"""
from amaranth.hdl import signed
from amaranth.lib import data, enum

__all__ = [
    "INSTRUCTION_BITS", "INSTRUCTION_BYTES", "DIMS", "ErrorCode", "Opcode", "Header", "Dim",
    "TensorDescriptor", "LoadInstruction", "MatmulInstruction", "StoreInstruction",
    "decode", "encode", "NUM_WINDOWS", "Window",
]

INSTRUCTION_BITS = 512
INSTRUCTION_BYTES = INSTRUCTION_BITS // 8
DIMS = 4
"""Dimensions of a tensor descriptor; dim 0 maps to the lanes of one SRAM row."""


class Opcode(enum.Enum, shape=4):
    """Zero is not an opcode, so a program running into zeroed memory stops with an error."""
    LOAD = 1     # external memory -> scratchpad (load engine)
    MATMUL = 2   # scratchpad -> array -> accumulator (execute engine)
    STORE = 3    # accumulator -> external memory (store engine)
    END = 4      # wait for every engine, then done + irq


class ErrorCode(enum.Enum, shape=4):
    NONE = 0
    UNKNOWN_OPCODE = 1
    LOAD_WINDOW = 2       # a read outside every readable access window
    STORE_WINDOW = 3      # a write outside every writable access window
    BAD_EXTENT = 4        # zero extent, or a tile larger than the SRAM row or region
    MISALIGNED = 5        # base or stride not a multiple of the element size
    SRAM_RANGE = 6        # scratchpad or accumulator row out of range
    WATCHDOG = 7          # no progress for WATCHDOG cycles (e.g. a token that never comes)
    PROGRAM_WINDOW = 8    # an instruction fetch outside every readable window
    BUS_ERROR = 9         # SLVERR / DECERR on the memory bus
    BAD_ELEMENT = 10      # unsupported element size for this engine
    ADDRESS_OVERFLOW = 11 # an element address outside the 32-bit address space


Header = data.StructLayout({
    "opcode": Opcode,
    "pop_prev": 1,    # wait for a token from the previous engine
    "pop_next": 1,    # wait for a token from the next engine
    "push_prev": 1,   # when done, give a token to the previous engine
    "push_next": 1,   # when done, give a token to the next engine
    "accumulate": 1,  # MATMUL: add to the accumulator rows instead of overwriting them
    "reserved": 23,
})

Dim = data.StructLayout({
    "extent": 16,        # tile elements in this dimension (>= 1)
    "start": signed(16), # tensor coordinate of the tile's first element (negative = padding)
    "bound": 16,         # tensor size: coordinates outside [0, bound) read as zero / are not stored
    "stride": 32,        # bytes between consecutive coordinates
})

TensorDescriptor = data.StructLayout({
    "base": 32,          # byte address of tensor coordinate (0, 0, 0, 0)
    "elem_log2": 2,      # element size is 1 << elem_log2 bytes
    "sram_row": 16,      # first scratchpad (LOAD) or accumulator (STORE) row
    "reserved": 14,
    "dims": data.ArrayLayout(Dim, DIMS),
})
"""A TMA-style tile: element (i0, i1, i2, i3) sits at ``base + sum((start_d + i_d) * stride_d)``
and goes to lane ``i0`` of SRAM row ``sram_row + i1 + extent1 * (i2 + extent2 * i3)``."""

LoadInstruction = data.StructLayout({"header": Header, "tensor": TensorDescriptor})
StoreInstruction = data.StructLayout({"header": Header, "tensor": TensorDescriptor})

MatmulInstruction = data.StructLayout({
    "header": Header,
    "weight_row": 16,    # scratchpad row of W[0, :]; the tile is `rows` rows, lanes 0..cols-1
    "act_row": 16,       # scratchpad row of the first activation vector (lanes 0..rows-1)
    "acc_row": 16,       # accumulator row of the first result vector
    "count": 16,         # activation vectors (>= 1)
})

_LAYOUTS = {Opcode.LOAD: LoadInstruction, Opcode.MATMUL: MatmulInstruction,
            Opcode.STORE: StoreInstruction, Opcode.END: data.StructLayout({"header": Header})}

for _layout in _LAYOUTS.values():
    assert _layout.size <= INSTRUCTION_BITS, _layout


def encode(opcode, **fields):
    """Instruction bytes for ``opcode`` with ``fields`` (nested dicts, as the layouts name them)."""
    opcode = Opcode(opcode)
    fields.setdefault("header", {})
    fields["header"] = {**fields["header"], "opcode": opcode}
    bits = _LAYOUTS[opcode].const(fields).as_bits()
    return bits.to_bytes(INSTRUCTION_BYTES, "little")


def decode(raw):
    """A view of instruction bytes through the layout of its opcode (for tools and tests)."""
    bits = int.from_bytes(raw[:INSTRUCTION_BYTES], "little")
    opcode = Opcode(bits & 0xF)
    return _LAYOUTS[opcode].from_bits(bits & ((1 << _LAYOUTS[opcode].size) - 1))

NUM_WINDOWS = 4
"""Access windows the host programs; every DMA must fall inside one of them."""

Window = data.StructLayout({
    "base": 32,   # byte address; windows are checked at the granularity of the bus beat
    "size": 32,   # bytes; 0 disables the window
    "read": 1,
    "write": 1,
})
