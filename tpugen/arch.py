"""The architecture contract: facts of every core beside the instruction formats (`tpugen.isa`).

The HDL, the compilers, the runtime, the fuzz model and the testbenches take these from here;
``tests/test_arch.py`` fails when one of them is written out again elsewhere.
"""
from amaranth.lib import enum

from .isa import Header, Opcode

__all__ = ["ENGINE_OPCODES", "Engine", "MAX_OUTSTANDING", "MAX_QUEUE_DEPTH", "OPCODE_BITS",
           "OPCODE_ENGINE", "OPCODE_MASK", "PENDING_DEPTH", "PLAN_DEPTH", "QUEUE_DEPTH",
           "SOFTMAX_DIVIDE_CYCLES", "SOFTMAX_OUT_FRAC", "TOKEN_BITS", "TOKEN_FLAGS", "TOKEN_LIMIT",
           "block_query_cycles", "min_tile_length", "opcode_of", "pending_depth", "skewed_cols",
           "skewed_rows", "supported_opcodes", "tile_cycles", "token_flag_bit", "write_bursts"]


class Engine(enum.IntEnum, shape=2):
    """The engines in chain order: each one's "prev" and "next" are its neighbours here."""
    LOAD = 0
    EXECUTE = 1
    STORE = 2


ENGINE_OPCODES = {Engine.LOAD: (Opcode.LOAD,),
                  Engine.EXECUTE: (Opcode.MATMUL, Opcode.SOFTMAX),
                  Engine.STORE: (Opcode.STORE, Opcode.PARAMS)}
"""The opcodes each engine runs (END runs on none: the controller waits for all)."""
OPCODE_ENGINE = {opcode: engine for engine, opcodes in ENGINE_OPCODES.items() for opcode in opcodes}
"""The engine of each opcode that has one."""

def pending_depth(config):
    """Dispatched instructions per engine whose pushes may still be in flight on a core of
    ``config``: ``PENDING_DEPTH``, or 2 on a core of one-instruction queues, whose engines take
    at most one instruction ahead of the one they run (micro: a third dispatch would wait for
    the first's done, which cost none of its matmuls' or conv2d's cycles)."""
    return PENDING_DEPTH if config.queue_depth > 1 else 2


def write_bursts(config):
    """Write bursts the store engine of a core of ``config`` keeps waiting for B:
    ``MAX_OUTSTANDING``, or 2 on a core of one-instruction queues (micro: B comes a cycle or two
    after a burst's last W beat from its board's memory, and the benchmark's model delays only
    reads; measured at stop 51, its matmuls and conv2d within 1% of 8 bursts' cycles, for 78
    iCE40 logic cells less)."""
    return MAX_OUTSTANDING if config.queue_depth > 1 else 2


def supported_opcodes(config):
    """The opcodes a core of ``config`` runs; any other stops it with UNKNOWN_OPCODE when it
    is fetched."""
    return {op for opcodes in ENGINE_OPCODES.values() for op in opcodes
            if op != Opcode.SOFTMAX or config.softmax}


QUEUE_DEPTH = 2
"""Instructions the controller queues per engine by default (`CoreConfig.queue_depth`)."""
MAX_QUEUE_DEPTH = 7
"""The most `CoreConfig.queue_depth` allows (``CONFIG1.queue_depth`` has 3 bits)."""
PENDING_DEPTH = 8
"""Dispatched instructions per engine whose pushes may still be in flight, at most
(`pending_depth`)."""
TOKEN_BITS = 8
"""Width of each dependency token counter."""
TOKEN_LIMIT = 2 ** TOKEN_BITS - 1 - PENDING_DEPTH
"""A push is dispatched only while its counter is below this (247): at most 246, plus the
``PENDING_DEPTH`` pushes pending and the one the controller registers a cycle before it
lands, is 255, so none wraps."""

OPCODE_BITS = Header["opcode"].width
OPCODE_MASK = (1 << OPCODE_BITS) - 1
"""The opcode is the low bits of an instruction's first byte (``raw[0] & OPCODE_MASK``)."""
assert Header["opcode"].offset == 0 and OPCODE_BITS <= 8
TOKEN_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")
"""The header's dependency token flags."""


def token_flag_bit(name):
    """The bit offset of header flag ``name`` in an instruction (``TOKEN_FLAGS``)."""
    return Header[name].offset


def opcode_of(raw):
    """The opcode of instruction bytes ``raw``: an `Opcode`, or None when it is not one."""
    value = raw[0] & OPCODE_MASK
    return Opcode(value) if value in {op.value for op in Opcode} else None


PLAN_DEPTH = 64
"""Load engine: planned steps buffered between the burst planner and the R channel. A burst
carries at most a quarter of them: its AR goes out early, and the rest of the buffer hides the
read latency."""
MAX_OUTSTANDING = 8
"""Bursts a DMA engine keeps in flight."""


def skewed_cols(config):
    """Columns of the array an activation crosses a cycle per column: ``cols``, or 1 when
    ``CoreConfig.broadcast_activations`` gives it to every column of its row in one cycle. A
    PE switches to a tile's weights ``r + c`` cycles after its first vector is taken, ``r <
    skewed_rows``, ``c < skewed_cols``."""
    return 1 if config.broadcast_activations else config.cols


def skewed_rows(config):
    """Rows of the array a partial sum crosses a cycle per row, each taking its activation a
    cycle after the one above: ``rows``, or 1 when ``CoreConfig.adder_tree_columns`` sums each
    column in one cycle and every row takes its activation at once."""
    return 1 if config.adder_tree_columns else config.rows


def min_tile_length(config):
    """Fewest activation vectors per weight tile that keep the array busy with no bubble
    (``hdl/array.py``): the next tile commits once this one's switch has passed every PE
    (``skewed_rows + skewed_cols - 3`` cycles after its first vector, at least one) and its
    ``rows`` weight rows have shifted in, and is taken two cycles after its commit; without
    ``weight_prefetch`` it starts shifting in only once the switch has passed, over ``rows``
    cycles, and is taken two cycles after its last row."""
    passed = skewed_rows(config) + skewed_cols(config) - 3
    if not config.weight_chain:  # none: the array idles between tiles (`tile_cycles`)
        return 1
    if not config.weight_prefetch:
        return max(passed, 1) + config.rows + 1
    return max(passed, config.rows - 1, 1) + 2


def tile_cycles(config, count):
    """Cycles of the array for a weight tile of ``count`` activation vectors among others:
    ``max(count, min_tile_length)``, and without ``CoreConfig.weight_chain`` ``rows`` more, the
    cycles it idles before the tile (its rows load into the PEs a row a cycle from the cycle
    after the tile before took its last vector, and its first vector is taken in the cycle
    after its last row; ``hdl/array.py``)."""
    gap = 0 if config.weight_chain else config.rows
    return max(count, min_tile_length(config)) + gap


SOFTMAX_OUT_FRAC = 8
"""Fraction bits of attention's output (O / l, NORMALIZE's row scales): in units of V / 2**8."""
SOFTMAX_DIVIDE_CYCLES = 12
"""Cycles of NORMALIZE's reciprocal of one query (``hdl/softmax.py``)."""


def block_query_cycles(tiles, o_tiles, first, hit):
    """Cycles per query of a softmax BLOCK (``hdl/softmax.py``): with ``first``, the max and exp
    passes; else the speculative pass A, and on a miss (``hit`` False: m rises or is -inf)
    the exp pass and the O rescale after it."""
    if first:
        return 2 * tiles
    return tiles if hit else 2 * tiles + o_tiles
