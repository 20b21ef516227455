"""Limits and policies of the whole core on Verilator: dependency-token counters at the
hardware's limit, instruction fetches and tensor tiles past the top of the address space, a core
with one access window and cores with one-deep queues (sim/tb_limits.py), and instruction bits
that an opcode does not define (`SimDevice`). The policies are stated in `tpugen.isa`."""
import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Shape
from amaranth.lib import data

from tpugen import CoreConfig
from tpugen.arch import PENDING_DEPTH, TOKEN_BITS, TOKEN_LIMIT
from tpugen.sim import SimDevice
from tpugen.firmware.attention import quantize_softmax
from tpugen.firmware.epilogue import Epilogue
from tpugen.firmware.conv2d import conv2d_lowering
from tpugen.firmware.program import Program
from tpugen.isa import INSTRUCTION_BITS, INSTRUCTION_BYTES, Header, Opcode, decode
from tpugen.sim.attention_model import attention_int8_model, softmax_int8_model
from tpugen.sim.golden import apply_epilogue, conv2d_int32, matmul_int32

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
SHALLOW = dataclasses.replace(SMALL, queue_depth=1)
"""One-instruction queues and no overflow memory (tests/test_fuzz_verilator.py's model)."""
QUEUE_DEPTHS = pytest.mark.parametrize("config", [SMALL, SHALLOW], ids=["depth2", "depth1"])
FAST = CoreConfig(rows=8, cols=8)
DIRECTIONS = ["load->execute", "execute->store", "execute->load", "store->execute"]
WATCHDOG = 300


def test_token_limit_is_the_counter_less_the_pending_pushes():
    # hdl/controller.py: a push waits while its counter could overflow with the pushes still
    # pending (docs/formal.md, "Semaphores wrapped at 256").
    assert TOKEN_LIMIT == 2 ** TOKEN_BITS - 1 - PENDING_DEPTH


@QUEUE_DEPTHS
def test_token_counters_saturate_without_wrapping(run_tb, config):
    """On each of the four token counters, pushes that nothing pops. A push is dispatched only
    while its counter is below ``TOKEN_LIMIT``; the counter counts completed pushes, so pushes
    already dispatched (at most ``PENDING_DEPTH``) may still land on top of it:

    * ``TOKEN_LIMIT`` pushes always end done;
    * ``TOKEN_LIMIT + 1`` end done, or in WATCHDOG blaming the last push (timing decides);
    * ``2**TOKEN_BITS`` (256, which wrapped the 8-bit counter to 0 before the limit existed)
      end in WATCHDOG blaming the first push that waits, after ``TOKEN_LIMIT`` to
      ``2**TOKEN_BITS - 2`` pushes landed: the counter never wraps.
    """
    wrap = 2 ** TOKEN_BITS
    cases = [[direction, pushes] for direction in DIRECTIONS
             for pushes in (TOKEN_LIMIT, TOKEN_LIMIT + 1, wrap)]
    stats = run_tb(config, "tpugen.sim.tb_limits",
                   {"seed": 15, "watchdog": WATCHDOG, "cases": cases},
                   design="tpu_core", testcase="tokens")
    got = {(r["direction"], r["pushes"]): (r["done"], r["error"], r["index"])
           for r in stats["runs"]}
    print({key: value for key, value in got.items() if key[1] != TOKEN_LIMIT})
    assert len(got) == len(cases)
    for direction in DIRECTIONS:
        assert got[direction, TOKEN_LIMIT][:2] == (True, "NONE"), direction
        one_more = got[direction, TOKEN_LIMIT + 1]
        assert one_more[:2] == (True, "NONE") or one_more == (False, "WATCHDOG", TOKEN_LIMIT), (
            direction, one_more)
        done, error, index = got[direction, wrap]
        assert (done, error) == (False, "WATCHDOG") and TOKEN_LIMIT <= index <= wrap - 2, (
            direction, got[direction, wrap])
    assert stats["good_after"], "a matmul after the saturated counters was wrong"


TOP = (1 << 32) - 0x1000
"""The last 4 KiB of the address space."""
BEFORE = 3
"""Instructions of the program below 2**32; the rest wrap to address 0."""


@QUEUE_DEPTHS
def test_instruction_fetch_wraps_to_zero_and_is_checked_there(run_tb, config):
    """The fetch address is PROGRAM_BASE + 64 * pc modulo 2**32 (docs: `tpugen.isa`): a program
    that runs off the top of the address space continues at address 0 when a readable window
    holds it there, and stops with PROGRAM_WINDOW at that instruction when none does (a window
    ending past 2**32 does not wrap)."""
    cases = {
        "both windows": [(TOP, 0x1000), (0, 0x1000)],
        "top window only": [(TOP, 0x1000)],
        "window past 4 GiB": [((1 << 32) - BEFORE * 64, 0x1000)],
    }
    stats = run_tb(config, "tpugen.sim.tb_limits", {"seed": 16, "before": BEFORE, "cases": cases},
                   design="tpu_core", testcase="fetch_wrap")
    runs = stats["runs"]
    assert runs["instructions"] > BEFORE + 1 and runs["base"] == (1 << 32) - 64 * BEFORE
    wrapped = runs["both windows"]
    assert (wrapped["done"], wrapped["error"], wrapped["exact"]) == (True, "NONE", True)
    for name in ("top window only", "window past 4 GiB"):
        assert runs[name] == {"done": False, "error": "PROGRAM_WINDOW", "index": BEFORE,
                              "exact": False}, name
    assert stats["good_after"]


TILE_WRAP_CASES = {
    "both ends": [(0, 0x1000, True, True), (TOP, 0x1000, True, True)],
    "top window only": [(TOP, 0x1000, True, True)],
    "window past 4 GiB": [(TOP, 0x2000, True, True)],
    "read-only at 0": [(0, 0x1000, True, False), (TOP, 0x1000, True, True)],
}
"""Windows for sim/tb_limits.py's ``tile_wrap``, besides the program's and W's."""


def test_tensor_tiles_wrap_to_zero_and_are_checked_there(run_tb):
    """A tensor descriptor's element addresses are ``address + sum(i_d * stride_d)`` modulo
    2**32 (docs: `tpugen.isa`), each access checked against the windows at the wrapped address,
    a window ending past 2**32 not wrapping: a LOAD from the last bytes of the address space on
    to address 0 (a row split across the wrap) and a STORE whose rows step down past address 0
    to the top are exact with a window at either end. Without the one at 0 (or with one that
    ends past 2**32) the LOAD stops with LOAD_WINDOW; with a read-only one the STORE stops with
    STORE_WINDOW at its first row, at 0x280, and nothing is stored."""
    stats = run_tb(SMALL, "tpugen.sim.tb_limits",
                   {"seed": 19, "m": 6, "act_before": 10, "cases": TILE_WRAP_CASES},
                   design="tpu_core", testcase="tile_wrap")
    runs = stats["runs"]
    assert runs["both ends"] == {"done": True, "error": "NONE", "index": 0, "exact": True,
                                 "untouched": False}, runs["both ends"]
    for name, error, index in (("top window only", "LOAD_WINDOW", 1),
                               ("window past 4 GiB", "LOAD_WINDOW", 1),
                               ("read-only at 0", "STORE_WINDOW", 3)):
        assert runs[name] == {"done": False, "error": error, "index": index, "exact": False,
                              "untouched": True}, (name, runs[name])
    assert stats["good_after"]


def test_the_model_predicts_the_wrapped_tiles():
    """`sim.fuzz_model.predict` allows the outcomes of
    test_tensor_tiles_wrap_to_zero_and_are_checked_there (the program built here as
    sim/tb_limits.py's ``tile_wrap`` builds it); where the LOAD errs it also allows the STORE's
    error, as it does whenever two instructions err (it does not model which comes first)."""
    from tpugen.sim.fuzz_model import DONE, MEMORY_SIZE, predict
    from tpugen.sim.tb_limits import tile_wrap_program

    cfg, m, program_at, b = SMALL, 6, 0x8000, 0x30000
    program = tile_wrap_program(cfg, m, (1 << 32) - 10, b)
    image = bytearray(MEMORY_SIZE)
    image[program_at:program_at + program.size] = program.to_bytes()
    expected = {"both ends": DONE, "top window only": ("LOAD_WINDOW", 1),
                "window past 4 GiB": ("LOAD_WINDOW", 1), "read-only at 0": ("STORE_WINDOW", 3)}
    for name, windows in TILE_WRAP_CASES.items():
        windows = [(program_at, 0x1000, True, False), (b, 0x1000, True, False), *windows]
        outcomes = predict(cfg, image, windows, program_at, len(program), 500).outcomes
        assert expected[name] in outcomes and (expected[name] != DONE or len(outcomes) == 1), (
            name, outcomes)


def test_soft_reset_sends_no_w_burst_without_its_aw(run_tb):
    """Matmuls stored in one-beat bursts, each followed by a soft reset, on a memory that takes AW
    and W in the same cycle (`LatencyAxiRam`): as many W bursts as AWs, and every result exact."""
    stats = run_tb(SMALL, "tpugen.sim.tb_limits",
                   {"seed": 1, "shape": [38, 1, 1], "runs": 3, "latency": [0, 40]},
                   design="tpu_core", testcase="soft_reset_after_stores")
    assert stats["bursts"]["W"] == stats["bursts"]["AW"], stats["bursts"]
    assert stats["exact"] == [True] * 3


def test_a_core_with_one_window_has_only_window_0(run_tb):
    """`CoreConfig.windows=1`: the windows the host programs past the first do not exist, so
    DMAs and fetches that only they admit stop with their window errors, touching nothing."""
    stats = run_tb(dataclasses.replace(SMALL, windows=1), "tpugen.sim.tb_limits", {"seed": 18},
                   design="tpu_core", testcase="missing_windows")
    assert stats["runs"] == {
        "load": {"done": False, "error": "LOAD_WINDOW", "index": 0},
        "store": {"done": False, "error": "STORE_WINDOW", "index": 0},
        "fetch": {"done": False, "error": "PROGRAM_WINDOW", "index": 0}}
    assert stats["lacked"] == [0] * 9 and stats["untouched"] and stats["good_after"]


_FLAGS_THAT_DO_NOT_APPLY = {
    Opcode.LOAD: ("pop_prev", "push_prev", "accumulate"),   # no engine before the load engine
    Opcode.MATMUL: ("im2col",),
    Opcode.SOFTMAX: ("accumulate", "im2col"),
    Opcode.STORE: ("pop_next", "push_next", "accumulate", "im2col"),  # none after the store engine
    Opcode.PARAMS: ("pop_next", "push_next", "accumulate", "im2col"),
    Opcode.END: ("pop_prev", "pop_next", "push_prev", "push_next", "accumulate", "im2col"),
}


def _defined_bits(shape, offset=0):
    """The mask of the bits of ``shape`` (a layout, or a plain shape, at bit ``offset``) but
    those of fields named "reserved"."""
    if isinstance(shape, data.StructLayout):
        return sum(_defined_bits(field.shape, offset + field.offset)
                   for name, field in shape if name != "reserved")
    if isinstance(shape, data.ArrayLayout):
        size = Shape.cast(shape.elem_shape).width
        return sum(_defined_bits(shape.elem_shape, offset + i * size) for i in range(shape.length))
    return ((1 << Shape.cast(shape).width) - 1) << offset


def with_undefined_bits_set(raw):
    """Instruction bytes ``raw`` with every bit that means nothing to its opcode set: its
    layout's "reserved" fields, the bits past its layout, and the header flags that do not
    apply to it (`_FLAGS_THAT_DO_NOT_APPLY`). Returns (bytes, opcode, im2col)."""
    view = decode(raw)
    opcode = Opcode(view.header.opcode)
    defined = _defined_bits(view.shape())  # fields never overlap: their masks add
    for flag in _FLAGS_THAT_DO_NOT_APPLY[opcode]:
        defined &= ~(1 << Header[flag].offset)
    bits = int.from_bytes(raw, "little") | ((1 << INSTRUCTION_BITS) - 1) & ~defined
    return bits.to_bytes(INSTRUCTION_BYTES, "little"), opcode, bool(view.header.im2col)


def test_undefined_instruction_bits_are_ignored(monkeypatch):
    """The policy of `tpugen.isa`: the core ignores every instruction bit its opcode does not
    define. A matmul with a fused epilogue, conv2d in both lowerings, attention and softmax,
    with all those bits set in every instruction, are as bit-exact as with zeros."""
    seen = set()
    plain_to_bytes = Program.to_bytes

    def to_bytes(program):
        out = []
        for raw in program.instructions:
            raw, opcode, im2col = with_undefined_bits_set(raw)
            seen.add((opcode.name, im2col))
            out.append(raw)
        assert len(b"".join(out)) == len(plain_to_bytes(program))
        return b"".join(out)

    monkeypatch.setattr(Program, "to_bytes", to_bytes)
    rng = np.random.default_rng(17)
    a, b = _int8(rng, (9, 11)), _int8(rng, (11, 6))
    requant = (rng.integers(1 << 12, 1 << 16, 6), rng.integers(12, 20, 6))
    bias = rng.integers(-3000, 3000, 6)
    # Pooling needs the im2col lowering; without it, the pixels one (per-row parameters for a
    # per-channel bias: PARAMS and STOREs with per_row).
    convs = [((1, 3, 7, 6), (5, 3, 3, 3), 1, 1, {"bias": rng.integers(-999, 999, 5),
                                                 "pool": True}),
             ((1, 3, 7, 6), (5, 3, 3, 3), 1, 1, {"bias": rng.integers(-999, 999, 5)}),
             ((1, 6, 5, 5), (7, 6, 1, 1), 2, 0, {"bias": 77})]
    assert [conv2d_lowering(FAST, x, w, Epilogue.from_options(w[0], **options))
            for x, w, _, _, options in convs] == ["im2col", "pixels", "pixels"]
    q, k, v = _int8(rng, (1, 7, 5)), _int8(rng, (1, 9, 5)), _int8(rng, (1, 9, 5))
    x = (rng.standard_normal((3, 6)) * 3).astype(np.float32)
    with SimDevice(FAST, memory="rtl", memory_size=1 << 20) as dev:  # test_sim_speed's model
        got = dev.matmul(a, b, bias=bias, requant=requant, relu=True)
        assert np.array_equal(got, apply_epilogue(matmul_int32(a, b), channel_axis=1, bias=bias,
                                                  requant=requant, relu=True))
        for x_shape, w_shape, stride, padding, options in convs:
            xc, wc = _int8(rng, x_shape), _int8(rng, w_shape)
            expected = apply_epilogue(conv2d_int32(xc, wc, stride, padding), channel_axis=1,
                                      spatial_axes=(2, 3), **options)
            assert np.array_equal(dev.conv2d(xc, wc, stride=stride, padding=padding, **options),
                                  expected), x_shape
        assert np.array_equal(dev.attention_int8(q, k, v, 7, causal=True),
                              attention_int8_model(FAST, q, k, v, 7, causal=True))
        xi, _, frac = quantize_softmax(x)
        assert np.array_equal(dev.softmax(x) * 256, softmax_int8_model(xi, frac))
    assert seen == {("LOAD", False), ("LOAD", True), ("MATMUL", False), ("SOFTMAX", False),
                    ("STORE", False), ("PARAMS", False), ("END", False)}


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)
