"""Program order of compiled workloads: the next tile's loads are fetched while the execute engine
still has other work. The controller's queues are 2 deep, so a LOAD placed right before the
MATMUL that needs it is fetched only when the MATMULs ahead of it have (nearly) all issued, and
the array then waits for the whole load."""
import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.firmware.attention import compile_attention, plan_attention
from tpugen.firmware.conv2d import compile_conv2d, conv2d_lowering
from tpugen.firmware.epilogue import Epilogue
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
