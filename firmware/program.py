"""Instruction encoding for programs: thin, checked wrappers over `tpugen.isa`."""
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from ..arch import Engine
from ..isa import (DIMS, INSTRUCTION_BYTES, PARAMS_PER_INSTRUCTION, Opcode, SoftmaxMode,
                   TensorDescriptor, encode, encode_im2col, encode_tile)

__all__ = ["LEAD", "Deps", "Dim", "Op", "Program", "dependency_tokens", "schedule",
           "split_tile", "tensor"]


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


def tensor(base, elem_bytes, sram_row, dims, lane=0):
    """A tile, TMA-style (`isa.encode_tile` turns it into `TensorDescriptor` fields); ``dims``
    innermost (lanes) first, missing ones are 1 wide; element i0 is lane ``lane + i0`` of its
    SRAM row."""
    if elem_bytes not in (1, 2, 4, 8):
        raise ValueError(f"elem_bytes={elem_bytes!r} is invalid: allowed 1, 2, 4 or 8")
    if not 1 <= len(dims) <= DIMS:
        raise ValueError(f"dims has {len(dims)} entries: allowed 1..{DIMS}")
    lanes = 1 << TensorDescriptor["lane"].width
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < lanes:
        raise ValueError(f"lane={lane!r} is invalid: allowed an integer in 0..{lanes - 1}")
    dims = list(dims) + [Dim(extent=1, bound=1)] * (DIMS - len(dims))
    return {"base": base, "elem_log2": elem_bytes.bit_length() - 1, "sram_row": sram_row,
            "lane": lane, "dims": [d.fields() for d in dims]}


def split_tile(descriptor, walked, pool_pitch=None):
    """``descriptor`` (`tensor` fields) as tiles of ``walked`` dims or fewer, in the order a
    walker takes its elements: itself, or one per index of the dims past ``walked`` whose
    extent is above 1 (the outermost slowest), with that dim's extent 1 and the index added to
    its start; its SRAM row moves by the rows an index of the dim spans (``extent1 *
    extent2`` per index of dim 3, ``extent1`` of dim 2, or ``2 * pool_pitch`` per index of
    dim 2 of a pooled STORE)."""
    dims = descriptor["dims"]
    outer = [d for d in range(walked, DIMS) if dims[d]["extent"] != 1]
    if not outer:
        return [descriptor]
    if pool_pitch is None:
        spans = {2: dims[1]["extent"], 3: dims[1]["extent"] * dims[2]["extent"]}
    else:
        spans = {2: 2 * pool_pitch}
    tiles = []
    for index in product(*(range(dims[d]["extent"]) for d in reversed(outer))):
        at = dict(zip(reversed(outer), index))
        tiles.append({**descriptor,
                      "sram_row": descriptor["sram_row"] + sum(spans[d] * i
                                                               for d, i in at.items()),
                      "dims": [{**dim, "extent": 1, "start": dim["start"] + at[d]} if d in at
                               else dim for d, dim in enumerate(dims)]})
    return tiles


class Program:
    """A list of encoded instructions, built in order. Tiles (`tensor` fields) are encoded for
    the walkers and the address space of a `CoreConfig` (`isa.encode_tile`), of every dim and
    32 bits without one; a tile that needs more dims than the core walks
    (`CoreConfig.descriptor_dims`) becomes one LOAD or STORE per index of those past them
    (`split_tile`). ``wrap``: tiles whose in-bounds elements leave the address space are
    encoded as the core walks them, wrapping, instead of refused (for tests of that wrap;
    compilers never need it)."""

    def __init__(self, config=None, wrap=False):
        self.descriptor_dims = DIMS if config is None else config.descriptor_dims
        self.address_width = 32 if config is None else config.address_width
        self.wrap = wrap
        self.instructions = []

    def _tile(self, descriptor):
        return encode_tile(descriptor, self.descriptor_dims, self.wrap, self.address_width)

    def load(self, descriptor, deps=Deps()):
        for tile, header in self._split(descriptor, deps):
            self._add(Opcode.LOAD, header=header, tensor=self._tile(tile))
        return self

    def _split(self, descriptor, deps, pool_pitch=None):
        """(tile, header) of each instruction of ``descriptor`` (`split_tile`): the first
        waits for the tokens ``deps`` pops, the last pushes those it pushes."""
        tiles = split_tile(descriptor, self.descriptor_dims, pool_pitch)
        fields = deps.fields()
        pops = {name: value for name, value in fields.items() if name.startswith("pop")}
        pushes = {name: value for name, value in fields.items() if name.startswith("push")}
        return [(tile, {**dict.fromkeys(fields, 0), **(pops if i == 0 else {}),
                        **(pushes if i == len(tiles) - 1 else {})})
                for i, tile in enumerate(tiles)]

    def load_im2col(self, descriptor, deps=Deps()):
        """LOAD a tile of the lowered matrix; ``descriptor``: Im2colDescriptor fields."""
        return self._add(Opcode.LOAD, header={**deps.fields(), "im2col": 1},
                         im2col=encode_im2col(descriptor, self.wrap, self.address_width))

    def matmul(self, weight_row, act_row, acc_row, count, *, accumulate=False,
               act_probabilities=False, act_stride_log2=0, deps=Deps()):
        return self._add(Opcode.MATMUL, header={**deps.fields(), "accumulate": int(accumulate)},
                         weight_row=weight_row, act_row=act_row, acc_row=acc_row, count=count,
                         act_probabilities=int(act_probabilities),
                         act_stride_log2=act_stride_log2)

    def store(self, descriptor, epilogue=None, deps=Deps()):
        """``epilogue``: `isa.Epilogue` fields (bias, requant, relu, pool, pool_pitch)."""
        epilogue = epilogue or {}
        pitch = epilogue.get("pool_pitch") if epilogue.get("pool") else None
        for tile, header in self._split(descriptor, deps, pitch):
            self._add(Opcode.STORE, header=header, tensor=self._tile(tile), epilogue=epilogue)
        return self

    def params(self, entries, first_lane=0, broadcast=False):
        """Epilogue parameters: ``entries`` of (bias, multiplier, shift) for lanes from
        ``first_lane`` on, ``PARAMS_PER_INSTRUCTION`` per instruction."""
        entries = list(entries)
        for start in range(0, len(entries), PARAMS_PER_INSTRUCTION):
            chunk = entries[start:start + PARAMS_PER_INSTRUCTION]
            self._add(Opcode.PARAMS, first_lane=first_lane + start, broadcast=int(broadcast),
                      entries=[{"bias": b, "multiplier": mul, "shift": sh} for b, mul, sh in chunk])
        return self

    def softmax(self, mode, *, count, state_row, o_row=0, o_tiles=1, first=False, tiles=1,
                keys=0, score_row=0, p_row=0, causal=False, causal_offset=0, frac=0,
                deps=Deps()):
        """A SOFTMAX step (`isa.SoftmaxInstruction`): ``mode`` BLOCK or NORMALIZE (which uses
        only ``count`` and ``state_row``)."""
        return self._add(Opcode.SOFTMAX, header=deps.fields(), mode=SoftmaxMode(mode),
                         first=int(first), causal=int(causal), count=count, tiles=tiles,
                         o_tiles=o_tiles, keys=keys, causal_offset=causal_offset,
                         score_row=score_row, p_row=p_row, o_row=o_row, state_row=state_row,
                         frac=frac)

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


LEAD = 2
"""Execute instructions a load or STORE is placed after the point it waits for, so that while it waits for
its token the controller can still fetch the MATMULs behind it."""


@dataclass
class Op:
    """An instruction before its tokens are known: ``emit(program, deps)``; what it reads, as
    (buffer, version, part), and writes, as (buffer, version, part, writes of that part), of
    buffers another engine also uses; its place: before the execute instruction numbered
    ``position`` (an execute instruction's number is its own)."""
    engine: Engine  # neighbours exchange tokens
    position: int
    emit: Callable
    reads: tuple = ()
    writes: tuple = ()


def dependency_tokens(ops):
    """Deps for ``ops`` in program order. An instruction waits for a neighbouring engine's
    instruction: the last to write the part it reads (all its writes must come before), or the
    last to read the buffer it starts to overwrite. It pops a token when that one is newer than
    any its predecessors on the engine waited for, and that one pushes it (each engine finishes
    in order, so one token covers all before it)."""
    versions, parts, last_reader = {}, {}, {}
    waits = []
    for i, op in enumerate(ops):
        wait = {}

        def after(j):
            wait[ops[j].engine] = max(wait.get(ops[j].engine, -1), j)

        for buffer, version, part in op.reads:
            left, writer = parts.get((buffer, version, part), (1, None))
            assert versions.get(buffer) == version and left == 0, \
                f"{buffer} part {part} of version {version} is not loaded"
            after(writer)
            last_reader[buffer] = i
        for buffer, version, part, writes in op.writes:
            if versions.get(buffer) != version:
                if buffer in last_reader:
                    after(last_reader.pop(buffer))
                versions[buffer] = version
            left, _ = parts.get((buffer, version, part), (writes, None))
            parts[buffer, version, part] = (left - 1, i)
        waits.append(wait)
    flags = [dict.fromkeys(("pop_prev", "pop_next", "push_prev", "push_next"), False)
             for _ in ops]
    newest = {}
    for i, (op, wait) in enumerate(zip(ops, waits)):
        for engine, producer in wait.items():
            if producer > newest.get((op.engine, engine), -1):
                newest[op.engine, engine] = producer
                earlier = engine < op.engine
                flags[i]["pop_prev" if earlier else "pop_next"] = True
                flags[producer]["push_next" if earlier else "push_prev"] = True
    return [Deps(**f) for f in flags]


def schedule(config, ops):
    """The program of ``ops`` (`Op`) for a core of ``config``, in order of position (at equal
    positions, DMA before execute), with the tokens `dependency_tokens` derives."""
    ops = sorted(ops, key=lambda op: (op.position, op.engine == Engine.EXECUTE))
    program = Program(config)
    for op, deps in zip(ops, dependency_tokens(ops)):
        op.emit(program, deps=deps)
    return program.end()
