"""Program order of compiled workloads: the next tile's loads are fetched while the execute engine
still has other work. The controller's queues are 2 deep, so a LOAD placed right before the
MATMUL that needs it is fetched only when the MATMULs ahead of it have (nearly) all issued, and
the array then waits for the whole load."""
import numpy as np
import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.firmware.attention import compile_attention, plan_attention
from tpugen.firmware.conv2d import POOLED_PIXELS, compile_conv2d, conv2d_lowering
from tpugen.firmware.epilogue import Epilogue
from tpugen.firmware.gemm_cost import shortest_piece
from tpugen.firmware.gemm_plan import plan_gemm
from tpugen.firmware.gemm_tiling import row_pieces
from tpugen.firmware.matmul import compile_matmul, matmul_weights
from tpugen.firmware.program import LEAD
from tpugen.isa import PARAMS_PER_INSTRUCTION, Opcode, decode

LARGE = PRESETS["large"]


def _load_rows(load):
    dims = load.tensor.dims
    return range(load.tensor.sram_row, load.tensor.sram_row + dims[1].extent * dims[2].extent
                 * dims[3].extent)


def _matmul_rows(matmul, rows):
    """Scratchpad rows a MATMUL reads: its weight tile and (unless from the probability buffer)
    its activation vectors."""
    read = set(range(matmul.weight_row, matmul.weight_row + rows))
    if not matmul.act_probabilities:
        read |= {matmul.act_row + (i << matmul.act_stride_log2) for i in range(matmul.count)}
    return read


def _stalling_loads(config, program):
    """LOADs (by index) whose next execute instruction reads what they load, in the steady
    state: after the first STORE (the first tile's loads have nothing to overlap)."""
    instructions = [decode(raw) for raw in program.instructions]
    stalls, started = [], False
    for i, ins in enumerate(instructions):
        opcode = ins.header.opcode
        started |= opcode == Opcode.STORE
        if opcode != Opcode.LOAD or not started:
            continue
        after = next(x for x in instructions[i + 1:]
                     if x.header.opcode in (Opcode.MATMUL, Opcode.SOFTMAX, Opcode.END))
        if after.header.opcode == Opcode.MATMUL and \
                set(_load_rows(ins)) & _matmul_rows(after, config.rows):
            stalls.append(i)
    return stalls


@pytest.mark.parametrize("config,x_shape,w_shape,padding", [
    (LARGE, (1, 64, 4, 56), (64, 64, 3, 3), 1),
    (CoreConfig(rows=8, cols=8), (2, 16, 5, 13), (24, 16, 3, 3), 1),
    (CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1), (1, 3, 6, 9),
     (5, 3, 1, 1), 0),
])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv2d_loads_overlap_the_previous_tile(config, x_shape, w_shape, padding, per_channel):
    # With a per-channel epilogue each output tile is stored in groups of cols filters, a
    # PARAMS before each: those runs are spread over the next tile's MATMULs, never longer than
    # a group's when it has enough (the last tile's come after the last MATMUL).
    k = w_shape[0]
    epilogue = Epilogue.from_options(k, bias=list(range(k)), requant=(3, 9)) if per_channel \
        else None
    assert conv2d_lowering(config, x_shape, w_shape, epilogue) == "pixels"
    program = compile_conv2d(config, x_shape, w_shape, padding=padding, x_addr=0,
                             w_addr=1 << 20, y_addr=2 << 20, epilogue=epilogue)
    assert _stalling_loads(config, program) == []
    opcodes = [decode(raw).header.opcode for raw in program.instructions]
    runs = "".join("s" if op in (Opcode.STORE, Opcode.PARAMS) else "." for op in opcodes)
    runs = runs[:max(i for i, op in enumerate(opcodes) if op == Opcode.MATMUL)]
    per_row = [decode(raw).epilogue.per_row for raw in program.instructions
               if decode(raw).header.opcode == Opcode.STORE]
    assert set(per_row) == {per_channel}
    longest = max(len(run) for run in runs.split("."))
    chunks = -(-w_shape[1] * w_shape[2] * w_shape[3] // config.rows)
    groups = -(-k // config.cols)
    group = -(-min(k, config.cols) // PARAMS_PER_INSTRUCTION) + 1
    assert longest <= ((group if chunks - LEAD >= groups else groups * group) if per_channel
                       else 2)


@pytest.mark.parametrize("config,seq,kv,dim,causal", [
    (LARGE, 256, 512, 64, False),
    (CoreConfig(rows=8, cols=8), 45, 70, 24, True),
])
def test_attention_loads_overlap_the_previous_block(config, seq, kv, dim, causal):
    plan = plan_attention(config, seq, kv, dim)
    program = compile_attention(config, plan, 2, q_addr=0, kt_addr=1 << 20, v_addr=2 << 20,
                                o_addr=3 << 20, causal=causal, frac=20)
    assert _stalling_loads(config, program) == []


@pytest.mark.parametrize("config,k,n", [(LARGE, 40, 37), (CoreConfig(rows=8, cols=8), 1, 8),
                                        (CoreConfig(rows=8, cols=8), 19, 1)])
def test_packed_weights_are_column_tiles_of_b(config, k, n):
    b = np.random.default_rng(5).integers(-128, 128, (k, n), dtype=np.int8)
    packed = matmul_weights(config, b)
    assert packed.nbytes == b.nbytes
    for n0 in range(0, n, config.cols):
        tile = b[:, n0:n0 + config.cols]
        assert np.array_equal(packed[k * n0:k * n0 + tile.size], tile.ravel()), n0
    with pytest.raises(ValueError, match="b_layout='cols' is invalid"):
        compile_matmul(config, 3, k, n, a_addr=0, b_addr=4096, c_addr=8192, b_layout="cols")


@pytest.mark.parametrize("count,smallest,sizes", [
    (64, 32, [32, 32]), (100, 36, [36, 64]), (256, 36, [36, 36, 72, 112]), (71, 36, [71]),
    (1, 15, [1])])
def test_row_pieces_grow_from_the_shortest(count, smallest, sizes):
    assert row_pieces(count, smallest) == sizes


@pytest.mark.parametrize("config,shape", [(LARGE, (96, 100, 40)),
                                          (CoreConfig(rows=8, cols=8), (150, 96, 33)),
                                          (LARGE, (64, 64, 64)), (LARGE, (65, 40, 47)),
                                          (CoreConfig(rows=8, cols=8), (77, 17, 20))])
def test_split_ends_start_on_the_first_rows_and_store_the_last_piece_alone(config, shape):
    """Where the first panel is all of K, the first output tile is stored piece by piece too:
    its first STORE waits only for the first piece's MATMULs."""
    m = shape[0]
    plan = plan_gemm(config, *shape, b_contiguous=True, split_ends=True)
    assert plan.split_ends
    first = row_pieces(min(plan.m_tile, m), shortest_piece(config))
    last = row_pieces(m - (m - 1) // plan.m_tile * plan.m_tile, shortest_piece(config))
    assert len(first) > 1 and len(last) > 1
    program = compile_matmul(config, *shape, a_addr=0, b_addr=1 << 20, c_addr=2 << 20,
                             b_layout="tiles")
    instructions = [decode(raw) for raw in program.instructions]
    opcodes = [ins.header.opcode for ins in instructions]
    start = opcodes.index(Opcode.MATMUL)
    assert instructions[start].count == first[0]
    # The first MATMUL pops the load engine's first token: the LOAD of the first piece's rows
    # of A (K tiles of a row in neighbouring scratchpad rows).
    pusher = min(i for i in range(start) if opcodes[i] == Opcode.LOAD
                 and instructions[i].header.push_next)
    loaded = len(_load_rows(instructions[pusher]))
    assert loaded in {first[0] * tiles for tiles in range(1, plan.k_chunk + 1)}, loaded
    stores = [ins for ins in instructions if ins.header.opcode == Opcode.STORE]
    assert stores[-1].tensor.dims[1].extent == last[0]
    one_chunk = plan.k_chunk >= plan.k_tiles
    outputs = -(-m // plan.m_tile) * plan.n_tiles
    assert len(stores) == outputs - 2 + (len(first) if one_chunk else 1) + len(last)
    first_store = opcodes.index(Opcode.STORE)
    signal = max(i for i in range(first_store) if opcodes[i] == Opcode.MATMUL
                 and instructions[i].header.push_next)
    matmuls_before = opcodes[:signal + 1].count(Opcode.MATMUL)
    if one_chunk:
        assert stores[0].tensor.dims[1].extent == first[0]
        assert matmuls_before == plan.k_tiles
    else:
        assert stores[0].tensor.dims[1].extent == min(plan.m_tile, m)
        assert matmuls_before > plan.k_tiles


def test_pooled_conv2d_takes_the_pooled_pixels_lowering():
    """A requantized pooled conv with a scratch region: pass 1's loads overlap as without
    pooling; pass 2 a LOAD, a fence and per segment two strided MATMULs and a pooled STORE
    (after a broadcast PARAMS) per output-row pair. Without a scratch region, or with int32
    outputs, im2col."""
    x_shape, w_shape = (1, 64, 10, 56), (64, 64, 3, 3)
    pooled = Epilogue.from_options(64, bias=list(range(64)), requant=(list(range(64)), 22),
                                   relu=True, pool=True)
    assert conv2d_lowering(LARGE, x_shape, w_shape, pooled, padding=1, scratch=True) \
        == POOLED_PIXELS
    assert conv2d_lowering(LARGE, x_shape, w_shape, pooled, padding=1) == "im2col"
    int32 = Epilogue.from_options(64, bias=list(range(64)), pool=True)
    assert conv2d_lowering(LARGE, x_shape, w_shape, int32, padding=1, scratch=True) == "im2col"
    program = compile_conv2d(LARGE, x_shape, w_shape, padding=1, x_addr=0, w_addr=1 << 20,
                             y_addr=2 << 20, scratch_addr=3 << 20, epilogue=pooled)
    instructions = [decode(raw) for raw in program.instructions]
    # Only the last pairs' LOADs, after pass 1, have no MATMULs to overlap.
    pass_1_end = max(i for i, ins in enumerate(instructions)
                     if ins.header.opcode == Opcode.MATMUL and ins.count == 64)
    stalls = _stalling_loads(LARGE, program)
    assert all(i > pass_1_end for i in stalls) and len(stalls) <= 2, stalls
    stores = [i.epilogue for i in instructions if i.header.opcode == Opcode.STORE]
    assert sum(e.pool for e in stores) == 5 * 4  # row pairs x segments of 8 pooled outputs
    assert {(e.pool_pitch, e.requant, e.relu, e.bias) for e in stores if e.pool} == {(128, 1, 0, 0)}
    assert sum(not e.pool and e.per_row for e in stores) == 10 * 4 * 4  # pass 1: tiles x groups
    matmuls = [i for i in instructions if i.header.opcode == Opcode.MATMUL]
    assert sum(m.act_stride_log2 == 2 and m.count == 128 for m in matmuls) == 5 * 4 * 2
    assert sum(m.count == 1 for m in matmuls) == 5  # the fences
    with pytest.raises(ValueError, match="scratch_addr"):
        compile_conv2d(LARGE, x_shape, w_shape, padding=1, x_addr=0, w_addr=1 << 20,
                       y_addr=2 << 20, epilogue=pooled, lowering=POOLED_PIXELS)
