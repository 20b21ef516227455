"""The execute engine in amaranth.sim: MATMUL instructions against numpy, with accumulation."""
import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import memory, wiring
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.hdl.execute import ExecuteEngine, accumulator_row, probability_row, scratchpad_row
from tpugen.isa import ErrorCode, Opcode, SoftmaxMode, encode
from tpugen.sim.golden import matmul_int32
from tpugen.sim.softmax_model import block
from tpugen.sim.testbench import ReadWriteWatch, instruction_bits, put_instruction


class _Bench(wiring.Component):
    def __init__(self, config, scratchpad, probabilities=()):
        self.config = config
        self.scratchpad = scratchpad
        self.probabilities = probabilities
        self.engine = ExecuteEngine(config)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.engine = engine = self.engine
        m.submodules.sp = sp = memory.Memory(shape=scratchpad_row(cfg), depth=cfg.scratchpad_rows,
                                             init=self.scratchpad)
        m.submodules.acc = acc = memory.Memory(shape=accumulator_row(cfg),
                                               depth=cfg.accumulator_rows, init=[])
        self.acc = acc
        write = acc.write_port()
        wiring.connect(m, engine.weight_read, sp.read_port())
        wiring.connect(m, engine.act_read, sp.read_port())
        wiring.connect(m, engine.acc_write, write)
        wiring.connect(m, engine.acc_read, acc.read_port())  # as in the core: not transparent
        m.submodules.prob = prob = memory.Memory(shape=probability_row(cfg),
                                                 depth=cfg.probability_rows,
                                                 init=self.probabilities)
        wiring.connect(m, engine.prob_write, prob.write_port())
        wiring.connect(m, engine.prob_read, prob.read_port())
        return m


def _instruction(fields):
    """The instruction bytes of ``fields``: a MATMUL (the default) or a SOFTMAX."""
    fields = dict(fields)
    return encode(fields.pop("opcode", Opcode.MATMUL), **fields)


def _run(cfg, scratchpad, instructions, max_cycles=4000, probabilities=()):
    bench = _Bench(cfg, [list(map(int, row)) for row in scratchpad],
                   [list(map(int, row)) for row in probabilities])
    engine = bench.engine
    done = []
    state = {}
    # The read port is not transparent (as in the core): it must never read the row written in
    # the same cycle.
    accumulator = ReadWriteWatch([("acc", engine.acc_read.en, engine.acc_read.addr,
                                   engine.acc_write.en, engine.acc_write.addr)])

    async def testbench(ctx):
        for fields in instructions:
            await put_instruction(ctx, engine.instr, _instruction(fields), engine)
        for cycle in range(max_cycles):
            if not ctx.get(engine.busy):
                break
            await ctx.tick()
        state["error"] = ctx.get(engine.error)
        state["acc"] = np.array([[ctx.get(bench.acc.data[r])[c] for c in range(cfg.cols)]
                                 for r in range(cfg.accumulator_rows)], dtype=np.int64)

    async def count_done(ctx):
        async for _clock, _reset, done_now in ctx.tick().sample(engine.done):
            if done_now:
                done.append(1)

    sim = Simulator(bench)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.add_process(count_done)
    sim.add_process(accumulator.watch)
    sim.run_until(max_cycles * 1e-6)
    assert accumulator.collisions == []
    state["overlaps"] = accumulator.overlaps
    return state, len(done)


@pytest.mark.parametrize("registered,prefetch", [(True, True), (False, True), (False, False)])
def test_matmul_accumulates_like_numpy(registered, prefetch):
    # With `CoreConfig.registered_accumulate` or without: a row added two cycles or one after
    # its result comes; without `execute_prefetch` each instruction read from its queue's slot
    # (held until dispatched).
    cfg = CoreConfig(rows=3, cols=2, scratchpad_kib=1, accumulator_kib=1,
                     registered_accumulate=registered, execute_prefetch=prefetch,
                     queue_depth=2 if prefetch else 1)
    rng = np.random.default_rng(5)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    w1, w2 = sp[0:3, :2], sp[3:6, :2]
    a1, a2 = sp[10:17, :3], sp[20:27, :3]
    acc_start = 4
    instructions = [
        {"weight_row": 0, "act_row": 10, "acc_row": acc_start, "count": 7},
        {"header": {"accumulate": 1}, "weight_row": 3, "act_row": 20, "acc_row": acc_start,
         "count": 7},
        {"weight_row": 3, "act_row": 20, "acc_row": 30, "count": 1},
        {"header": {"accumulate": 1}, "weight_row": 0, "act_row": 10, "acc_row": 30, "count": 1},
    ]
    state, done = _run(cfg, sp, instructions)
    assert state["error"] == ErrorCode.NONE
    assert done == len(instructions)
    assert np.array_equal(state["acc"][acc_start:acc_start + 7],
                          matmul_int32(a1, w1) + matmul_int32(a2, w2))
    assert np.array_equal(state["acc"][30], (matmul_int32(a2[:1], w2) + matmul_int32(a1[:1], w1))[0])


@pytest.mark.parametrize("buffered", [True, False])
def test_strided_activations_follow_back_to_back(buffered):
    """act_stride_log2 reads every 2**s-th row; MATMULs of different strides follow each other."""
    cfg = CoreConfig(rows=3, cols=2, scratchpad_kib=1, accumulator_kib=1,
                     buffered_feeders=buffered)
    rng = np.random.default_rng(6)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    instructions = [
        {"weight_row": 0, "act_row": 10, "acc_row": 0, "count": 9, "act_stride_log2": 2},
        {"header": {"accumulate": 1}, "weight_row": 3, "act_row": 11, "acc_row": 0, "count": 9,
         "act_stride_log2": 2},
        {"weight_row": 6, "act_row": 50, "acc_row": 9, "count": 5, "act_stride_log2": 3},
        {"weight_row": 0, "act_row": 90, "acc_row": 14, "count": 4},
    ]
    state, done = _run(cfg, sp, instructions)
    assert state["error"] == ErrorCode.NONE and done == len(instructions)
    w = [sp[r:r + 3, :2] for r in (0, 3, 6)]
    assert np.array_equal(state["acc"][:9], matmul_int32(sp[10:46:4, :3], w[0])
                          + matmul_int32(sp[11:47:4, :3], w[1]))
    assert np.array_equal(state["acc"][9:14], matmul_int32(sp[50:90:8, :3], w[2]))
    assert np.array_equal(state["acc"][14:18], matmul_int32(sp[90:94, :3], w[0]))


def test_matmuls_at_the_ends_of_the_memories():
    """A count of every accumulator row, the last weight rows, activations up to the last row,
    and two back-to-back updates of the last accumulator row: the widths of rows and counts."""
    cfg = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1)
    n, last = cfg.accumulator_rows, cfg.scratchpad_rows - 1
    rng = np.random.default_rng(7)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    first_act = last - 2 * (n - 1)
    instructions = [
        {"weight_row": last - 1, "act_row": first_act, "acc_row": 0, "count": n,
         "act_stride_log2": 1},
        {"header": {"accumulate": 1}, "weight_row": 0, "act_row": 0, "acc_row": n - 1, "count": 1},
        {"header": {"accumulate": 1}, "weight_row": 2, "act_row": 1, "acc_row": n - 1, "count": 1},
    ]
    state, done = _run(cfg, sp, instructions)
    assert state["error"] == ErrorCode.NONE and done == len(instructions)
    expected = matmul_int32(sp[first_act::2], sp[last - 1:])
    expected[n - 1] += (matmul_int32(sp[0:1], sp[0:2]) + matmul_int32(sp[1:2], sp[2:4]))[0]
    assert np.array_equal(state["acc"], expected)


def _check_runs(cfg, sp, runs):
    """Run MATMULs ``runs`` (weight row, activation row, accumulator row, count, accumulate)
    back to back: bit-exact against numpy, no row read as it is written, and reads beside
    writes seen."""
    instructions = [{"header": {"accumulate": accumulate}, "weight_row": weight_row,
                     "act_row": act_row, "acc_row": acc_row, "count": count}
                    for weight_row, act_row, acc_row, count, accumulate in runs]
    state, done = _run(cfg, sp, instructions)
    assert state["error"] == ErrorCode.NONE and done == len(instructions)
    expected = np.zeros((cfg.accumulator_rows, cfg.cols), dtype=np.int64)
    for weight_row, act_row, acc_row, count, accumulate in runs:
        product = matmul_int32(sp[act_row:act_row + count, :cfg.rows],
                               sp[weight_row:weight_row + cfg.rows, :cfg.cols])
        rows = slice(acc_row, acc_row + count)
        expected[rows] = expected[rows] * accumulate + product
    assert np.array_equal(state["acc"], expected)
    assert state["overlaps"] > 0  # the watch saw reads beside writes


@pytest.mark.parametrize("registered", [True, False])
def test_accumulating_into_the_row_just_written(registered):
    """Each MATMUL accumulates into the row the one before it wrote last, back to back (tiles of
    at least `min_tile_length` vectors): its first vector waits two cycles, so that row is read
    after it is written; one that overwrites that row does not wait. With
    `CoreConfig.registered_accumulate` or without."""
    cfg = CoreConfig(rows=2, cols=3, scratchpad_kib=1, accumulator_kib=1,
                     registered_accumulate=registered)
    rng = np.random.default_rng(8)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    _check_runs(cfg, sp, [(0, 20, 0, 6, 0), (2, 30, 5, 6, 1), (4, 40, 10, 4, 1),
                          (0, 50, 13, 5, 0), (2, 60, 17, 1, 1), (4, 61, 17, 1, 1),
                          (0, 62, 17, 4, 1)])


@pytest.mark.parametrize("registered", [True, False])
@pytest.mark.parametrize("buffered", [True, False])
def test_short_matmuls_accumulating_into_the_rows_just_written(registered, buffered):
    """MATMULs of 1 to 6 vectors, back to back where the array allows it (4 vectors on this
    array, `min_tile_length`), accumulating into the rows the last vectors before them wrote or
    near them (a row is written two cycles after its result comes, one without
    `CoreConfig.registered_accumulate`, so such a MATMUL waits). With the row feeders'
    FIFOs or without (`CoreConfig.buffered_feeders`: the rows wait on the read ports while
    the array stalls them)."""
    cfg = CoreConfig(rows=2, cols=3, scratchpad_kib=1, accumulator_kib=1,
                     registered_accumulate=registered, buffered_feeders=buffered)
    rng = np.random.default_rng(11)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    runs, last = [], 10
    for _ in range(60):
        count = int(rng.choice([1, 2, 4, 5, 6]))
        acc_row = max(0, last + int(rng.integers(-count - 1, 2)))
        runs.append((int(rng.integers(0, 8)) * 2, int(rng.integers(20, 60)), acc_row, count,
                     int(rng.integers(0, 5) > 0)))
        last = acc_row + count - 1
    _check_runs(cfg, sp, runs)


def test_bad_matmul_sets_error_and_stops():
    cfg = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1)
    sp = np.zeros((cfg.scratchpad_rows, cfg.lanes), dtype=np.int64)
    for fields, code in (({"count": 0}, ErrorCode.BAD_EXTENT),
                         ({"count": 1, "acc_row": cfg.accumulator_rows}, ErrorCode.SRAM_RANGE),
                         ({"count": 2, "act_row": cfg.scratchpad_rows - 1}, ErrorCode.SRAM_RANGE),
                         ({"count": 3, "act_row": cfg.scratchpad_rows - 16,
                           "act_stride_log2": 3}, ErrorCode.SRAM_RANGE),
                         ({"count": 2, "act_stride_log2": 15}, ErrorCode.SRAM_RANGE),
                         ({"count": 1, "weight_row": cfg.scratchpad_rows - 1},
                          ErrorCode.SRAM_RANGE)):
        state, done = _run(cfg, sp, [fields], max_cycles=50)
        assert state["error"] == code
        assert done == 0


def test_a_strided_span_is_checked_to_the_last_row():
    """The engine keeps a MATMUL's activation span only up to the scratchpad's rows (a larger
    one passes no row either): a span that ends on the last row runs, one that passes it by
    less than half the rows stops with SRAM_RANGE."""
    cfg = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1)
    assert cfg.scratchpad_rows == 512
    sp = np.zeros((cfg.scratchpad_rows, cfg.lanes), dtype=np.int64)
    for act_row, code in ((127, ErrorCode.NONE), (128, ErrorCode.SRAM_RANGE),
                          (200, ErrorCode.SRAM_RANGE)):
        fields = {"count": 4, "act_stride_log2": 7, "act_row": act_row}  # a span of 384 rows
        state, done = _run(cfg, sp, [fields], max_cycles=100)
        assert (state["error"], done) == (code, int(code == ErrorCode.NONE)), act_row


@pytest.mark.parametrize("buffered", [True, False])
def test_probability_activations_are_unsigned(buffered):
    """act_probabilities reads the probability buffer as uint8: 200 is 200, not -56; the
    activation feeder's two ports follow each other."""
    cfg = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1,
                     buffered_feeders=buffered)
    rng = np.random.default_rng(7)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    prob = rng.integers(0, 256, (cfg.probability_rows, cfg.lanes))
    instructions = [
        {"weight_row": 0, "act_row": 5, "acc_row": 0, "count": 9, "act_probabilities": 1},
        {"header": {"accumulate": 1}, "weight_row": 4, "act_row": 20, "acc_row": 0, "count": 9},
    ]
    state, done = _run(cfg, sp, instructions, probabilities=prob)
    assert state["error"] == ErrorCode.NONE and done == 2
    expected = matmul_int32(prob[5:14], sp[0:4]) + matmul_int32(sp[20:29], sp[4:8])
    assert np.array_equal(state["acc"][:9], expected)


def test_softmax_step_between_matmuls():
    """S = Q K^T, a first softmax BLOCK, then O = P V: the engine hands the accumulator to the
    softmax unit and back, in order."""
    cfg = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1)
    rng = np.random.default_rng(8)
    sp = rng.integers(-128, 128, (cfg.scratchpad_rows, cfg.lanes))
    count = 6
    q, kt, v = sp[10:10 + count], sp[0:4], sp[4:8]
    instructions = [
        {"weight_row": 0, "act_row": 10, "acc_row": 20, "count": count},
        {"opcode": Opcode.SOFTMAX, "mode": SoftmaxMode.BLOCK, "first": 1, "count": count,
         "tiles": 1, "o_tiles": 1, "keys": 3, "score_row": 20, "p_row": 0, "o_row": 0,
         "state_row": 0, "frac": 4},
        {"weight_row": 4, "act_row": 0, "acc_row": 0, "count": count, "act_probabilities": 1},
    ]
    state, done = _run(cfg, sp, instructions)
    assert state["error"] == ErrorCode.NONE and done == 3
    _, _, p, _ = block(None, None, matmul_int32(q, kt), 3, False, 0, 4, True, None)
    assert p[:, 3].max() == 0 and np.all(p.max(axis=1) >= 128)  # the largest p: 128..255
    assert np.array_equal(state["acc"][:count], matmul_int32(p, v))


def test_a_failing_softmax_is_busy_until_its_error_and_takes_nothing_after_it():
    """A SOFTMAX that fails its checks (SRAM_RANGE) with the next instruction waiting on the
    stream: the engine is busy until its error shows, takes nothing more and is then idle with
    the error. Both found by the fuzzer: in the cycle the unit raised its error, a cycle before
    the engine's, the engine was idle without an error (a program ending there ended in done)
    and took the next instruction (and stayed busy with it: the core hung)."""
    cfg = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1)
    engine = ExecuteEngine(cfg)  # no memories: the SOFTMAX fails its checks
    failing = _instruction({"opcode": Opcode.SOFTMAX, "mode": SoftmaxMode.BLOCK, "first": 1,
                            "count": 2, "tiles": 250, "o_tiles": 58, "keys": 16})
    following = instruction_bits(engine.instr.payload.shape(), _instruction({"count": 1}))
    seen = {}

    async def testbench(ctx):
        await put_instruction(ctx, engine.instr, failing)
        ctx.set(engine.instr.payload.as_value(), following)
        ctx.set(engine.instr.valid, 1)
        seen.update(taken=False, idle_without_error=0)
        for _ in range(100):
            _, _, ready, error, busy = await ctx.tick().sample(
                engine.instr.ready, engine.error, engine.busy)
            seen["taken"] |= bool(ready)
            seen["idle_without_error"] += not busy and error == ErrorCode.NONE
            seen["error"], seen["busy"] = error, busy

    sim = Simulator(engine)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert seen == {"taken": False, "idle_without_error": 0, "error": ErrorCode.SRAM_RANGE,
                    "busy": 0}
