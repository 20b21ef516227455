"""Instruction encoding for programs: thin, checked wrappers over `tpugen.isa`."""
from dataclasses import dataclass

from ..isa import DIMS, INSTRUCTION_BYTES, PARAMS_PER_INSTRUCTION, Opcode, SoftmaxMode, encode

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

    def matmul(self, weight_row, act_row, acc_row, count, *, accumulate=False,
               act_probabilities=False, act_stride_log2=0, deps=Deps()):
        return self._add(Opcode.MATMUL, header={**deps.fields(), "accumulate": int(accumulate)},
                         weight_row=weight_row, act_row=act_row, acc_row=acc_row, count=count,
                         act_probabilities=int(act_probabilities),
                         act_stride_log2=act_stride_log2)

    def store(self, descriptor, epilogue=None, deps=Deps()):
        """``epilogue``: `isa.Epilogue` fields (bias, requant, relu, pool, pool_pitch)."""
        return self._add(Opcode.STORE, header=deps.fields(), tensor=descriptor,
                         epilogue=epilogue or {})

    def params(self, entries, first_lane=0, broadcast=False):
        """Epilogue parameters: ``entries`` of (bias, multiplier, shift) for lanes from
        ``first_lane`` on, ``PARAMS_PER_INSTRUCTION`` per instruction."""
        entries = list(entries)
        for start in range(0, len(entries), PARAMS_PER_INSTRUCTION):
            chunk = entries[start:start + PARAMS_PER_INSTRUCTION]
            self._add(Opcode.PARAMS, first_lane=first_lane + start, broadcast=int(broadcast),
                      entries=[{"bias": b, "multiplier": mul, "shift": sh} for b, mul, sh in chunk])
        return self

    def softmax(self, mode, *, count, o_row, o_tiles, state_row, first=False, tiles=1, keys=0,
                score_row=0, p_row=0, causal=False, causal_offset=0, scale_multiplier=0,
                scale_shift=0, deps=Deps()):
        """A SOFTMAX step (`isa.SoftmaxInstruction`): ``mode`` BLOCK or NORMALIZE."""
        return self._add(Opcode.SOFTMAX, header=deps.fields(), mode=SoftmaxMode(mode),
                         first=int(first), causal=int(causal), count=count, tiles=tiles,
                         o_tiles=o_tiles, keys=keys, causal_offset=causal_offset,
                         score_row=score_row, p_row=p_row, o_row=o_row, state_row=state_row,
                         scale_multiplier=scale_multiplier, scale_shift=scale_shift)

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
