"""The cost model of a GEMM: estimated cycles of a `GemmPlan` on a core."""
from ..arch import MAX_OUTSTANDING, min_tile_length, tile_cycles
from ..isa import INSTRUCTION_BYTES
from .gemm_tiling import a_region_limit, a_regions, row_pieces

__all__ = ["MEMORY_LATENCY", "fetch_cycles", "gemm_cycles", "load_cycles", "shortest_piece"]

MEMORY_LATENCY = 24
"""Cycles from a read request to its data that the tiling's cost model assumes (DRAM behind an
interconnect)."""
_INSTRUCTION_CYCLES = 16
"""Cycles an engine spends on an instruction besides moving data (checks, address setup)."""


def fetch_cycles(config):
    """Cycles the controller takes to fetch an instruction (one at a time)."""
    return MEMORY_LATENCY + INSTRUCTION_BYTES // (config.axi_data_width // 8) + 4


def _row_cycles(beats):
    """One row of ``beats`` beats, read in bursts of up to 16 beats."""
    return max(beats, -(-beats // 16) * MEMORY_LATENCY / MAX_OUTSTANDING)


def load_cycles(rows, beats, steps):
    """Estimated cycles of a LOAD of ``rows`` rows of ``beats`` beats (a burst each) and
    ``steps`` walked steps (one a cycle) each."""
    return MEMORY_LATENCY + _INSTRUCTION_CYCLES + rows * max(steps, _row_cycles(beats))


def shortest_piece(config):
    """Fewest rows in a row piece (`GemmPlan.split_ends`): its MATMULs keep the array busy and
    take as long as fetching the next."""
    return max(min_tile_length(config), fetch_cycles(config))


def gemm_cycles(config, plan):
    """Estimated cycles of a GEMM: the busiest of the array, the load engine and the instruction
    fetch (one instruction at a time), plus what overlaps nothing: filling the pipeline (the
    first A buffer's K chunks and weight panels against the MATMULs that can run meanwhile) and
    the last STORE; or, where the store engine is the bottleneck, the fill, the MATMULs of the
    first output tile (or of its first row piece) and then every STORE back to back. A DMA
    instruction waits for its last data; a burst costs at least its share of the latency over
    the bursts in flight."""
    beat = config.axi_data_width // 8
    rows, cols, k_tiles, n_tiles = plan.rows, plan.cols, plan.k_tiles, plan.n_tiles
    blocks = -(-plan.m // plan.m_tile)
    count = -(-plan.m // blocks)
    chunks = -(-k_tiles // plan.k_chunk)
    outputs = blocks * n_tiles
    panels = outputs * chunks
    matmuls = outputs * k_tiles
    a_buffers = blocks * (1 if plan.a_resident else -(-n_tiles // plan.group) * chunks)
    dma = MEMORY_LATENCY + _INSTRUCTION_CYCLES

    def a_loads(tiles, max_tiles, a_rows=count):
        """LOADs and cycles of ``tiles`` K tiles of ``a_rows`` rows of A in regions of up to
        ``max_tiles``, each row of a region a burst, in row pieces of about a MATMUL's worth
        of beats."""
        beats = [-(-size * rows // beat)
                 for _, size in a_regions(0, tiles, plan.k // rows, max_tiles)]
        return sum(beats), sum(beats) * dma + a_rows * sum(map(_row_cycles, beats))

    # Split ends (`GemmPlan.split_ends`): the first MATMULs wait for the first piece's rows of
    # A, and the last STORE is the smallest piece's, where the array is the busiest engine
    # (measured: store- or load-bound GEMMs gain nothing and lose up to 2.5%).
    pieces = row_pieces(count, shortest_piece(config)) if plan.split_ends else [count]
    _, first_chunk = a_loads(plan.k_chunk, plan.k_chunk)
    _, first_piece = a_loads(plan.k_chunk, plan.k_chunk, pieces[0])
    buffer_loads, buffer = a_loads(plan.a_tiles, a_region_limit(plan, later=True))
    if plan.b_contiguous:  # one run
        panel_beats = -(-plan.k_chunk * rows * cols // beat)
        panel = load_cycles(1, panel_beats, panel_beats)
    else:  # a burst per K row
        panel = load_cycles(plan.k_chunk * rows, -(-cols // beat), -(-cols // beat))
    load = a_buffers * buffer + panels * panel
    row_beats = -(-cols * 4 // beat)
    # The first output tile is stored by the first panel's pieces when that panel is all of K.
    first_stores = len(pieces) if chunks == 1 else 1
    stores = outputs * (dma + count * row_beats) + (len(pieces) + first_stores - 2) * dma
    instructions = (matmuls + panels + a_buffers * buffer_loads + outputs
                    + (len(pieces) - 1) * (2 * plan.k_chunk + 2) + first_stores - 1)
    fetch = instructions * fetch_cycles(config)
    compute = matmuls * tile_cycles(config, count)
    busiest = max(compute, load)
    group = min(plan.group, n_tiles)

    def fill(first_rows):
        """Cycles before the MATMULs run unhindered, the first ones waiting for ``first_rows``
        (the cycles of loading the rows of A they read)."""
        return max(first_rows + c * first_chunk + (c * group + 1) * panel
                   - c * group * plan.k_chunk * count
                   for c in range(chunks if plan.a_resident else 1))

    # The store engine's path: the first stored rows are finished after the group's earlier K
    # chunks and the last chunk's MATMULs of those rows; then every STORE back to back.
    stored_rows = pieces[0] if chunks == 1 else count
    last_chunk = k_tiles - (chunks - 1) * plan.k_chunk
    first_output = ((chunks - 1) * group * plan.k_chunk * tile_cycles(config, count)
                    + last_chunk * tile_cycles(config, stored_rows))
    store_bound = fill(first_piece) + first_output + stores
    if max(busiest, fetch) > compute:  # the ends overlap a DMA engine's (or the fetch's)
        first_piece, pieces = first_chunk, [count]  # backlog: no gain
    # The fetch runs from the start, not after the fill.
    return max(max(busiest + fill(first_piece), fetch) + dma + pieces[0] * row_beats, store_bound)
