"""Fused (flash) attention and row softmax on the array and the softmax unit."""
import math
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import numpy as np

from ..arch import SOFTMAX_DIVIDE_CYCLES, Engine, block_query_cycles, tile_cycles
from ..isa import SoftmaxInstruction, SoftmaxMode
from .program import LEAD, Deps, Dim, Op, Program, schedule, tensor

__all__ = ["AttentionPlan", "attention_macs", "attention_operands", "compile_attention",
           "compile_softmax", "plan_attention", "quantize_attention", "quantize_int8",
           "quantize_log2", "quantize_softmax"]

_MAX_TILES = 8
"""Key tiles per block: one online-softmax step covers up to this many `cols`-wide tiles."""
_SOFTMAX_OVERHEAD = 10
"""Cycles a SOFTMAX step costs beyond its rows (`hdl.softmax`)."""
_FRAC_MAX = 2**SoftmaxInstruction["frac"].width - 1
NORMALIZED = {"requant": 1, "row_scale": 1, "scale_row": 0}
"""The epilogue of a STORE of O (query i on tile row i, its state at row i): O / l with the row
scale NORMALIZE wrote for the query (`isa.Epilogue`), int32."""


def quantize_log2(x, unit=1.0, clip=False):
    """float x to int8 whose step is a power of two in log2 units: ``(xi, scale, frac)`` with
    ``x ~ xi * scale`` and ``scale * unit * log2(e) = 2**-frac``, so that a score ``s`` (an int32
    sum of ``xi`` times integers worth ``unit`` each) is ``s / 2**frac`` in log2 units, as the
    softmax unit takes it (`isa.SoftmaxInstruction` ``frac``). ``frac`` is the largest in 0..31
    whose scale is at least ``peak / 127``: the scale is up to twice that of `quantize_int8`. A
    peak too large for ``frac = 0`` (a step above 1 in log2) is refused, or clipped with
    ``clip``."""
    peak = float(np.abs(x).max())
    c = unit * math.log2(math.e)
    if not c > 0 or not math.isfinite(c):
        raise ValueError(f"unit={unit!r} is invalid: allowed a positive finite number")
    frac = _FRAC_MAX if peak == 0 else min(_FRAC_MAX, math.floor(math.log2(127 / (c * peak))))
    if frac < 0 and not clip:
        raise ValueError(f"a peak of {peak} at {unit} per step is out of the softmax unit's "
                         "range (a step of more than 1 in log2)")
    frac = max(frac, 0)
    scale = 2.0**-frac / c
    return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale, frac


def quantize_int8(x):
    """Symmetric per-tensor int8: (values, scale) with x ~ values * scale."""
    peak = float(np.abs(x).max())
    scale = peak / 127 if peak > 0 else 1.0
    return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale


def quantize_softmax(x):
    """float (rows, n) x to what `compile_softmax` takes: ``(xi, scale, frac)`` of
    `quantize_log2`. When x's peak needs a step above 1 in log2, each row's maximum is subtracted
    first (softmax is the same) and what lies more than 127 steps below it clips (its p is 0)."""
    if float(np.abs(x).max()) * math.log2(math.e) > 127:
        return quantize_log2(x - x.max(axis=1, keepdims=True), clip=True)
    return quantize_log2(x)


def quantize_attention(q, k, v):
    """float q, k, v (..., d) to what the core runs: ((q, k, v) int8, their scales, frac). The
    score scale ``log2(e) / sqrt(d)`` is folded into the scales of q and k, so ``q k^T`` is the
    scores in log2 units with ``frac`` fractional bits: ``s_q * s_k * log2(e) / sqrt(d) =
    2**-frac``. Rounding that to a power of two widens the two int8 steps by the same factor,
    at most sqrt(2) each (v keeps `quantize_int8`)."""
    vi, sv = quantize_int8(v)
    unit = math.log2(math.e) / math.sqrt(q.shape[-1])
    peaks = [float(np.abs(x).max()) / 127 for x in (q, k)]
    if 0 in peaks:  # a zero tensor: all scores 0, any frac
        return (np.zeros(q.shape, np.int8), np.zeros(k.shape, np.int8), vi), (1.0, 1.0, sv), 0
    step = peaks[0] * peaks[1] * unit
    frac = min(_FRAC_MAX, math.floor(-math.log2(step)))
    if frac < 0:
        raise ValueError("q and k are out of the softmax unit's range (a score step of more "
                         "than 1 in log2)")
    widen = math.sqrt(2.0**-frac / step)
    (sq, sk) = (peak * widen for peak in peaks)
    qi, ki = (np.clip(np.round(x / scale), -127, 127).astype(np.int8)
              for x, scale in ((q, sq), (k, sk)))
    return (qi, ki, vi), (sq, sk, sv), frac


@dataclass(frozen=True)
class AttentionPlan:
    """How one head of attention is tiled: all derived from the config and the shape."""
    seq: int
    kv: int
    dim: int
    cols: int
    m_tile: int
    """Queries per tile (accumulator rows of one score or output tile)."""
    tiles: int
    """Key tiles (of ``cols`` keys) per online-softmax block."""

    @property
    def d_chunks(self):
        return -(-self.dim // self.cols)

    @property
    def block_keys(self):
        return self.tiles * self.cols

    @property
    def dim_padded(self):
        """d rounded up to whole tiles: the row length of Q and V and the rows of K^T in memory."""
        return self.d_chunks * self.cols

    @property
    def kv_padded(self):
        """S rounded up to whole blocks: the rows of V and the row length of K^T in memory."""
        return -(-self.kv // self.block_keys) * self.block_keys

    def query_blocks(self, causal):
        """[(q0, count, [(first key, key tiles)])]: the query tiles of one head in the order
        `compile_attention` runs them, each with its blocks of key tiles (the first BLOCK of a
        tile is ``first``; with ``causal`` none whose keys are all masked for the tile)."""
        return _tile_blocks(self.cols, self.block_keys, self.seq, self.kv, self.m_tile, causal)


def _query_tiles(seq, m_tile):
    """Rows of the query tiles: as few as tiles of ``m_tile`` need, balanced."""
    tiles = -(-seq // m_tile)
    return [seq // tiles + (i < seq % tiles) for i in range(tiles)]


def _key_blocks(cols, block_keys, seq, kv, q0, count, causal):
    """[(first key, key tiles)] of the blocks the query tile of ``count`` queries from ``q0``
    runs: with ``causal``, none whose keys are masked for all its queries."""
    last_key = kv - 1 if not causal else min(kv - 1, q0 + count - 1 + kv - seq)
    return [(k0, -(-min(block_keys, last_key + 1 - k0) // cols))
            for k0 in range(0, last_key + 1, block_keys)]


def _tile_blocks(cols, block_keys, seq, kv, m_tile, causal):
    """[(q0, count, [(first key, key tiles)])]: the query tiles of one head in order, each with
    the blocks it runs (`_key_blocks`)."""
    counts = _query_tiles(seq, m_tile)
    return [(q0, count, _key_blocks(cols, block_keys, seq, kv, q0, count, causal))
            for q0, count in zip(accumulate(counts, initial=0), counts)]


def attention_macs(heads, seq, kv, dim, causal=False):
    """The useful multiply-accumulates of attention: 2 * dim (q.k and p.v) per query-key pair
    that is not masked (``causal``: key j of query i when j <= i + kv - seq)."""
    pairs = sum(min(kv, i + kv - seq + 1) for i in range(seq)) if causal else seq * kv
    return 2 * dim * pairs * heads


def plan_attention(config, seq, kv, dim, causal=False):
    """The `AttentionPlan` of one head (L = ``seq``, S = ``kv``, d = ``dim``) with the fewest
    execute cycles by the cost model below (``causal``: the blocks it skips are not run)."""
    for name, value in (("L", seq), ("S", kv), ("d", dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= 1")
    if config.rows != config.cols:
        raise ValueError(f"attention needs a square array, not {config.rows}x{config.cols}: "
                         "a probability row (cols keys) is one reduction tile (rows keys)")
    n = config.cols
    d_chunks = -(-dim // n)

    def queries(tiles):
        kv_rows = 2 * tiles * 2 * d_chunks * n  # K^T and V tiles of a block, double-buffered
        return min(seq, 0xFFFF, config.accumulator_rows // (tiles + d_chunks),
                   config.probability_rows // tiles,
                   (config.scratchpad_rows - kv_rows) // (2 * d_chunks))

    def cycles(option):
        """Execute cycles of the head: per query tile, per block, two GEMMs of tiles x d_chunks
        MATMULs (back to back, each `tile_cycles` long) and a softmax BLOCK step;
        then NORMALIZE (see `hdl.softmax`). Loads and stores overlap them. A BLOCK after the
        first misses (its query's m rises) as if the scores were independent: block b holds
        the maximum of blocks 0..b with probability 1 / (b + 1) (m's ceiling makes it less)."""
        tiles, m = option
        total = 0
        for _, count, blocks in _tile_blocks(n, tiles * n, seq, kv, m, causal):
            for b, (_, width) in enumerate(blocks):
                hit, miss = (block_query_cycles(width, d_chunks, first=b == 0, hit=h)
                             for h in (True, False))
                total += (2 * width * d_chunks * tile_cycles(config, count)
                          + count * (b * hit + miss) / (b + 1) + _SOFTMAX_OVERHEAD)
            total += count * SOFTMAX_DIVIDE_CYCLES + _SOFTMAX_OVERHEAD
        return total

    # Wider blocks need fewer BLOCKs and misses; longer query tiles amortize the reloads of K
    # and V, but compute more masked scores with ``causal``. Both share the accumulator and
    # the probability buffer.
    options = [(tiles, queries(tiles)) for tiles in range(1, min(-(-kv // n), _MAX_TILES) + 1)]
    options = [option for option in options if option[1] >= 1]
    if not options:
        raise ValueError(f"head dim d={dim} does not fit this core's buffers")
    tiles, m_tile = min(options, key=cycles)
    m_tile = max(_query_tiles(seq, m_tile))
    return AttentionPlan(seq=seq, kv=kv, dim=dim, cols=n, m_tile=m_tile, tiles=tiles)


def attention_operands(plan, q, k, v):
    """int8 q (heads, L, d), k and v (heads, S, d) as `compile_attention` reads them: Q, K^T
    and V zero-padded to ``plan.dim_padded`` and ``plan.kv_padded``."""
    heads, seq, dim = q.shape
    kv = k.shape[1]
    d_pad, kv_pad = plan.dim_padded, plan.kv_padded
    q_mem = np.zeros((heads, seq, d_pad), np.int8)
    kt_mem = np.zeros((heads, d_pad, kv_pad), np.int8)
    v_mem = np.zeros((heads, kv_pad, d_pad), np.int8)
    q_mem[:, :, :dim] = q
    kt_mem[:, :dim, :kv] = k.transpose(0, 2, 1)
    v_mem[:, :kv, :dim] = v
    return q_mem, kt_mem, v_mem


def compile_attention(config, plan, heads, *, q_addr, kt_addr, v_addr, o_addr, causal, frac):
    """O (int32, heads x L x d) from int8 Q (heads x L x d'), K^T (heads x d' x S') and V
    (heads x S' x d'), all row-major and zero-padded to d' = ``plan.dim_padded`` and S' =
    ``plan.kv_padded``, so one LOAD moves all the K^T (or V) tiles of a block. ``Q K^T / 2**frac``
    are the scores in log2 units (`quantize_attention`).

    Per query tile, per block of key tiles: S = Q K^T on the array into the accumulator, a
    softmax BLOCK step (P to the probability buffer, O rescaled), O += P V; finally O /= l and
    STORE. The scores never leave the core. Key/value tiles are double-buffered per block
    (tokens load <-> execute); the output tile is stored while the next query tile's scores
    are computed (tokens execute <-> store). With ``causal``, key tiles whose keys are all
    masked for the whole query tile are skipped.
    """
    n, seq, kv, dim = config.cols, plan.seq, plan.kv, plan.dim
    if causal and seq > kv:
        raise ValueError(f"causal attention needs L <= S, not L={seq}, S={kv}")
    d_chunks, d_pad, kv_pad = plan.d_chunks, plan.dim_padded, plan.kv_padded
    q_rows = d_chunks * plan.m_tile
    kv_rows = 2 * plan.tiles * d_chunks * n
    q_base = [0, q_rows]
    kv_base = [2 * q_rows, 2 * q_rows + kv_rows]
    o_row, score_row = 0, d_chunks * plan.m_tile
    offset = kv - seq

    work = [(head, *tile) for head in range(heads) for tile in plan.query_blocks(causal)]

    # Execute instructions are numbered in order (``e``). Block g's loads go LEAD instructions
    # into block g - 1 (whose buffers are the other half), a query tile's STOREs right after
    # its NORMALIZE, and each waits by tokens for what it needs (`schedule`).
    ops, e, g, block_start = [], 0, 0, 0

    def execute(emit, reads=(), writes=()):
        nonlocal e
        ops.append(Op(Engine.EXECUTE, e, emit, reads, writes))
        e += 1

    for j, (head, q0, count, blocks) in enumerate(work):
        q_head, kt_head = q_addr + head * seq * d_pad, kt_addr + head * d_pad * kv_pad
        v_head, o_head = v_addr + head * kv_pad * d_pad, o_addr + 4 * head * seq * dim
        q_buffer = ("Q", j % 2)
        for b, (k0, tiles) in enumerate(blocks):
            base = kv_base[g % 2]
            v_base = base + tiles * d_chunks * n
            kv_buffer = ("KV", g % 2)
            loads = []
            if b == 0:  # Q chunk c at q_base + c * count
                loads.append(((q_buffer, j, 0, 1), tensor(q_head, 1, q_base[j % 2], [
                    Dim(extent=n, bound=n, stride=1),
                    Dim(extent=count, start=q0, bound=seq, stride=d_pad),
                    Dim(extent=d_chunks, bound=d_chunks, stride=n)])))
            # K^T tile (key tile t, d chunk c) at base + (c * tiles + t) * n, V tile (t, d
            # chunk u) at v_base + (u * tiles + t) * n.
            loads.append(((kv_buffer, g, 0, 1), tensor(kt_head, 1, base, [
                Dim(extent=n, start=k0, bound=kv_pad, stride=1),
                Dim(extent=n, bound=n, stride=kv_pad),
                Dim(extent=tiles, bound=tiles, stride=n),
                Dim(extent=d_chunks, bound=d_chunks, stride=n * kv_pad)])))
            loads.append(((kv_buffer, g, 1, 1), tensor(v_head, 1, v_base, [
                Dim(extent=n, bound=n, stride=1),
                Dim(extent=n, start=k0, bound=kv_pad, stride=d_pad),
                Dim(extent=tiles, bound=tiles, stride=n * d_pad),
                Dim(extent=d_chunks, bound=d_chunks, stride=n)])))
            for i, (writes, descriptor) in enumerate(loads):
                position = min(block_start + LEAD + i, e - 1) if g else 0
                ops.append(Op(Engine.LOAD, position, partial(Program.load, descriptor=descriptor),
                              writes=(writes,)))
            block_start = e

            for t in range(tiles):
                for c in range(d_chunks):
                    execute(partial(Program.matmul, weight_row=base + (c * tiles + t) * n,
                                    act_row=q_base[j % 2] + c * count,
                                    acc_row=score_row + t * count, count=count,
                                    accumulate=c > 0),
                            reads=((q_buffer, j, 0), (kv_buffer, g, 0)))
            execute(partial(Program.softmax, mode=SoftmaxMode.BLOCK, first=b == 0, count=count,
                            tiles=tiles, o_tiles=d_chunks, keys=min(plan.block_keys, kv - k0),
                            score_row=score_row, p_row=0, o_row=o_row, state_row=0,
                            causal=causal, causal_offset=q0 - k0 + offset,
                            frac=frac))
            for u in range(d_chunks):
                for t in range(tiles):
                    first = b == 0 and u == 0 and t == 0  # overwrites the last tile's O
                    execute(partial(Program.matmul, weight_row=v_base + (u * tiles + t) * n,
                                    act_row=t * count, acc_row=o_row + u * count, count=count,
                                    act_probabilities=True, accumulate=not (b == 0 and t == 0)),
                            reads=((kv_buffer, g, 1),),
                            writes=(("O", j, 0, 2),) if first else ())
            g += 1
        # O / l: NORMALIZE writes each query's row scale (state row i), the STOREs apply it.
        execute(partial(Program.softmax, mode=SoftmaxMode.NORMALIZE, count=count, state_row=0),
                writes=(("O", j, 0, 2),))
        for u in range(d_chunks):
            ops.append(Op(Engine.STORE, e, partial(Program.store, descriptor=tensor(
                o_head, 4, o_row + u * count, [
                    Dim(extent=n, start=u * n, bound=dim, stride=4),
                    Dim(extent=count, start=q0, bound=seq, stride=4 * dim)]),
                epilogue=NORMALIZED), reads=(("O", j, 0),)))
    return schedule(config, ops)


def compile_softmax(config, rows, width, *, x_addr, eye_addr, y_addr, frac):
    """Row softmax of int8 X (rows x width, ``X / 2**frac`` in log2 units, see
    `quantize_log2`): S = X @ I into the accumulator, one softmax BLOCK
    over the whole row, P @ I, O /= l, STORE (int32, 256 = probability 1). ``eye_addr``: a
    ``cols`` x ``cols`` int8 identity in memory."""
    n = config.cols
    if config.rows != n:
        raise ValueError(f"softmax needs a square array, not {config.rows}x{n}")
    tiles = -(-width // n)
    m_tile = min(rows, 0xFFFF, config.accumulator_rows // (2 * tiles),
                 config.probability_rows // tiles, (config.scratchpad_rows - n) // tiles)
    if tiles > 255 or m_tile < 1:
        raise ValueError(f"rows of {width} elements do not fit this core's buffers")
    program = Program(config)
    program.load(tensor(eye_addr, 1, 0, [Dim(extent=n, bound=n, stride=1),
                                         Dim(extent=n, bound=n, stride=n)]))
    for r0 in range(0, rows, m_tile):
        count = min(m_tile, rows - r0)
        more = r0 + m_tile < rows
        for t in range(tiles):
            program.load(tensor(x_addr, 1, n + t * count, [
                Dim(extent=n, start=t * n, bound=width, stride=1),
                Dim(extent=count, start=r0, bound=rows, stride=width)]),
                Deps(pop_next=t == 0 and r0 > 0, push_next=t == tiles - 1))
        for t in range(tiles):
            program.matmul(0, n + t * count, tiles * count + t * count, count,
                           deps=Deps(pop_prev=t == 0, push_prev=t == tiles - 1 and more))
        program.softmax(SoftmaxMode.BLOCK, first=True, count=count, tiles=tiles, o_tiles=tiles,
                        keys=width, score_row=tiles * count, p_row=0, o_row=0, state_row=0,
                        frac=frac)
        for t in range(tiles):
            program.matmul(0, t * count, t * count, count, act_probabilities=True,
                           deps=Deps(pop_next=t == 0 and r0 > 0))
        program.softmax(SoftmaxMode.NORMALIZE, count=count, state_row=0,
                        deps=Deps(push_next=True))
        for t in range(tiles):
            program.store(tensor(y_addr, 4, t * count, [
                Dim(extent=n, start=t * n, bound=width, stride=4),
                Dim(extent=count, start=r0, bound=rows, stride=4 * width)]),
                epilogue=NORMALIZED,
                deps=Deps(pop_prev=t == 0, push_prev=t == tiles - 1 and more))
    program.end()
    return program
