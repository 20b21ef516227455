"""Instruction encoding for programs: thin, checked wrappers over `tpugen.isa`."""
from dataclasses import dataclass

from ..isa import DIMS, INSTRUCTION_BYTES, Opcode, encode

__all__ = ["Deps", "Dim", "Program", "tensor"]


@dataclass(frozen=True)
class Deps:
    """Dependency tokens: pop before starting, push when done (VTA-style, between neighbours)."""
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    def fields(self):
        return {"pop_prev": int(self.pop_prev), "pop_next": int(self.pop_next),
                "push_prev": int(self.push_prev), "push_next": int(self.push_next)}


@dataclass(frozen=True)
class Dim:
    extent: int
    start: int = 0
    bound: int = 0
    stride: int = 0

    def fields(self):
        return {"extent": self.extent, "start": self.start, "bound": self.bound,
                "stride": self.stride}


def tensor(base, elem_bytes, sram_row, dims):
    """A tensor descriptor's fields; ``dims`` innermost (lanes) first, missing ones are 1 wide."""
    if elem_bytes not in (1, 2, 4, 8):
        raise ValueError(f"elem_bytes={elem_bytes!r} is invalid: allowed 1, 2, 4 or 8")
    if not 1 <= len(dims) <= DIMS:
        raise ValueError(f"dims has {len(dims)} entries: allowed 1..{DIMS}")
    dims = list(dims) + [Dim(extent=1, bound=1)] * (DIMS - len(dims))
    return {"base": base, "elem_log2": elem_bytes.bit_length() - 1, "sram_row": sram_row,
            "dims": [d.fields() for d in dims]}


class Program:
    """A list of encoded instructions, built in order."""

    def __init__(self):
        self.instructions = []

    def load(self, descriptor, deps=Deps()):
        return self._add(Opcode.LOAD, header=deps.fields(), tensor=descriptor)

    def load_im2col(self, descriptor, deps=Deps()):
        """LOAD a tile of the lowered matrix; ``descriptor``: Im2colDescriptor fields."""
        return self._add(Opcode.LOAD, header={**deps.fields(), "im2col": 1}, im2col=descriptor)

    def matmul(self, weight_row, act_row, acc_row, count, *, accumulate=False, deps=Deps()):
        return self._add(Opcode.MATMUL, header={**deps.fields(), "accumulate": int(accumulate)},
                         weight_row=weight_row, act_row=act_row, acc_row=acc_row, count=count)

    def store(self, descriptor, deps=Deps()):
        return self._add(Opcode.STORE, header=deps.fields(), tensor=descriptor)

    def end(self):
        return self._add(Opcode.END)

    def _add(self, opcode, **fields):
        self.instructions.append(encode(opcode, **fields))
        return self

    def __len__(self):
        return len(self.instructions)

    def to_bytes(self):
        return b"".join(self.instructions)

    @property
    def size(self):
        return len(self.instructions) * INSTRUCTION_BYTES
