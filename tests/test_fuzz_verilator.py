"""Fuzzing the whole core on Verilator with hypothesis-drawn programs, valid and not.

Every case (see `tpugen.sim.fuzz`) must end within its cycle bound with one of the outcomes the
model allows, raise the interrupt and clear it on the acknowledge, make no AXI access outside
the windows or against the protocol, and, for valid programs, leave numpy's result in memory.
Each case runs with its own memory timing (stalls and latency); each kind of case is drawn in
its share, and the run must reach every outcome (done, each error code the fuzz can provoke) a
minimum number of times.
TPUGEN_FUZZ_PROGRAMS sets the number of cases (default 200; e.g. 2000 for a deep run).
"""
import collections
import dataclasses
import json
import os
import random

import pytest

from tpugen import CoreConfig
from tpugen.firmware.program import Dim, Program, tensor
from tpugen.isa import ErrorCode
from tpugen.registers import register
from tpugen.sim.fuzz import draw_cases_apart, limit_cases
from tpugen.sim.fuzz_model import DONE, MEMORY_SIZE, predict

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
PROGRAMS = int(os.environ.get("TPUGEN_FUZZ_PROGRAMS", "200"))
SLACK = 2
"""The model's cycle bound assumes memory that never stalls and answers at once; each case
pauses each AXI channel of the memory up to 30% of the time, and delays its answers."""
STALLS = (0.0, 0.15, 0.3)
LATENCIES = ((0, 0), (0, 0), (1, 6), (8, 24), (0, 40))
"""(least, most) cycles from a burst to its answer, drawn per burst."""


def _with_timing(drawn, seed=7):
    """Each case with its own memory timing (stall probability and latency, `sim/tb_fuzz.py`)
    from a fixed seed, and its cycle bound: SLACK times the model's, plus the latency of every
    fetch and of a burst per DMA instruction."""
    rng = random.Random(seed)
    for case in drawn:
        stall, latency = rng.choice(STALLS), rng.choice(LATENCIES)
        case["timing"] = {"stall": stall, "latency": latency}
        case["bound"] = SLACK * (case["cycles"] + 2 * latency[1] * (case["fetched"] + 1))
    return drawn


NOT_FUZZED = {"BUS_ERROR", "ADDRESS_OVERFLOW"}
"""Error codes the fuzz cannot reach: its memory always answers OKAY (tests/test_faults_verilator.py
has the bus faults), and ADDRESS_OVERFLOW is retired (DMA addresses wrap modulo
2**address_width; the model never predicts it, so a core that raised it would fail its case)."""


def _minimums(count):
    """The least number of ``count`` cases that must end done, and with each error code: a fuzz
    that no longer reaches an outcome tests nothing there."""
    ends = {code.name: max(1, count // 200) for code in ErrorCode
            if code != ErrorCode.NONE and code.name not in NOT_FUZZED}
    return {"NONE": count // 4, **ends}


def _problems(case, outcome):
    """What is wrong with ``outcome`` (from sim/tb_fuzz.py) for ``case``: a list of strings."""
    bound = case["bound"]
    if outcome["hang"]:
        return [f"no interrupt within {bound} cycles (STATUS {outcome['status']:#x}, AXI checker "
                f"{outcome['checker'][:3]})"]
    problems = []
    got = [outcome["error"], None if outcome["error"] == "NONE" else outcome["index"]]
    if got not in case["expect"]:
        problems.append(f"ended with {got}, expected one of {case['expect']}")
    done = got == list(DONE)
    if (outcome["done"], outcome["error_bit"], outcome["busy"]) != (done, not done, 0):
        problems.append(f"STATUS done={outcome['done']} error={outcome['error_bit']} "
                        f"busy={outcome['busy']} after the interrupt")
    if outcome["irq_status"] != register("IRQ_STATUS").value(done=done, error=not done):
        problems.append(f"IRQ_STATUS {outcome['irq_status']:#b}")
    if outcome["irq_before"] or outcome["irq_after_ack"]:
        problems.append(f"irq high before the start ({outcome['irq_before']}) or after the "
                        f"acknowledge ({outcome['irq_after_ack']})")
    if outcome["cycles"] > bound:
        problems.append(f"{outcome['cycles']} cycles, more than the bound {bound}")
    for (address, expected), got_bytes in zip(case["check"], outcome["check"]):
        if got_bytes != expected:
            first = next(i for i in range(0, len(expected), 2)
                         if got_bytes[i:i + 2] != expected[i:i + 2])
            problems.append(f"memory at {address + first // 2:#x}: {got_bytes[first:first + 16]}, "
                            f"expected {expected[first:first + 16]}")
    if outcome.get("status_after_reset", 0):
        problems.append(f"STATUS {outcome['status_after_reset']:#x} after the soft reset")
    if outcome["checker"]:
        problems.append(f"AXI checker: {outcome['checker'][:3]}")
    return problems


def _fuzz(run_tb, tmp_path, config, drawn):
    """The stats of ``drawn`` cases run in one simulation of a ``config`` core, and the
    failures (`_problems`) of those that ran."""
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(drawn))
    stats = run_tb(config, "tpugen.sim.tb_fuzz",
                   {"cases": str(path), "seed": 7, "backpressure": False, "slack": SLACK},
                   design="tpu_core", testcase="fuzz")
    failures = []
    for number, (case, outcome) in enumerate(zip(drawn, stats["outcomes"])):
        if problems := _problems(case, outcome):
            failures.append(f"case {number} ({case['name']}): " + "; ".join(problems))
    return stats, failures


def test_fuzzed_programs_end_as_the_model_says(run_tb, tmp_path):
    """PROGRAMS cases in one simulation, each with its own memory timing (`_with_timing`)."""
    drawn = _with_timing(draw_cases_apart(PROGRAMS, SMALL))
    stats, failures = _fuzz(run_tb, tmp_path, SMALL, drawn)
    outcomes = stats["outcomes"]
    kinds = collections.Counter(case["name"].split()[0] for case in drawn[:len(outcomes)])
    ends = collections.Counter("hang" if o["hang"] else o["error"] for o in outcomes)
    bursts = stats["axi"]["handshakes"]
    timings = collections.Counter(f"stall {case['timing']['stall']} latency "
                                  f"{case['timing']['latency']}" for case in drawn)
    worst = max(o["cycles"] / case["bound"] for case, o in zip(drawn, outcomes) if not o["hang"])
    print(f"\ntimings: {dict(timings)}; the most cycles of a case: {worst:.0%} of its bound")
    print(f"\n{stats['programs']} fuzzed programs ran in {stats['sim_seconds']:.0f} s of "
          f"simulation ({sum(o.get('latency', 0) for o in outcomes)} cycles, {bursts['AR']} "
          f"read and {bursts['AW']} write bursts): {dict(kinds)}; ends: {dict(ends)}")
    assert not failures, (f"{len(failures)} of {len(outcomes)} cases failed:\n"
                          + "\n".join(failures[:20]))
    assert stats["programs"] == len(drawn)
    least = _minimums(len(drawn))
    assert {end: ends[end] for end, count in least.items() if ends[end] < count} == {}, (
        f"outcomes reached fewer times than {least}")


def test_a_reduced_core_ends_as_the_model_says(run_tb, tmp_path):
    """Fuzzed cases on the micro preset with 20-bit addresses (`CoreConfig.address_width`: the
    memory's 1 MiB; tiles and programs wrap at its top, address and stride bits above are
    ignored, windows past it cover nothing): two windows, one-deep queues that keep fields
    only up to the limits the engines tell apart (`saturated_fields`), the store and load
    engines run from their queues' slots, one DMA front for both, 2-dim walkers, no softmax
    unit or im2col walker (an im2col LOAD, a SOFTMAX and probability activations are
    UNKNOWN_OPCODE, drawn as rarely as an unknown opcode), a shift-only epilogue, unbuffered
    row feeders, broadcast activations, adder tree columns and the counters in block RAM. The
    core, the model and the AXI checker take only the first two of the windows a case
    programs, the model queues one instruction per engine and predicts BAD_EXTENT for a dim
    past the two the walkers walk. Valid programs get their windows
    fitted as the runtime does (`fit_windows`) and end done; the others' standard output
    window (the third) is missing, so their STOREs end in STORE_WINDOW."""
    config = dataclasses.replace(CoreConfig.preset("micro"),
                                 address_width=MEMORY_SIZE.bit_length() - 1)
    drawn = _with_timing(draw_cases_apart(60, config))
    stats, failures = _fuzz(run_tb, tmp_path, config, drawn)
    assert not failures, "\n".join(failures[:20])
    assert stats["programs"] == len(drawn)
    ends = collections.Counter(o["error"] for o in stats["outcomes"])
    assert ends["NONE"] >= 15 and ends["STORE_WINDOW"] >= 2, ends  # 31-35 and 2-7 of 60 drawn


def test_fields_past_their_limits_end_as_the_model_says(run_tb, tmp_path):
    """On micro, a LOAD, STORE or MATMUL with one field its queue keeps only up to a limit
    (`saturated_fields`: rows, lanes, extents, bounds, the pool pitch, a MATMUL's rows and
    count) set around that limit and to its largest value (`limit_cases`) ends as the model,
    which reads every bit, predicts: the core treats the values it does not keep as the
    limit, and that is the same error, or none."""
    config = dataclasses.replace(CoreConfig.preset("micro"),
                                 address_width=MEMORY_SIZE.bit_length() - 1)
    drawn = _with_timing(limit_cases(config))
    stats, failures = _fuzz(run_tb, tmp_path, config, drawn)
    assert not failures, "\n".join(failures[:20])
    assert stats["programs"] == len(drawn) > 80
    ends = collections.Counter(o["error"] for o in stats["outcomes"])
    assert min(ends["NONE"], ends["BAD_EXTENT"], ends["SRAM_RANGE"]) >= 10, ends


def test_the_draw_is_the_same_whatever_ran_before():
    """Cases are drawn in a process of their own (`draw_cases_apart`): hypothesis mixes the
    constants of the modules imported so far into its draws, so in this process the draw would
    depend on which tests were collected and ran."""
    first = draw_cases_apart(9, SMALL)
    import tpugen.bench, tpugen.onnx, tpugen.sweep  # noqa: F401  (more modules here)
    assert draw_cases_apart(9, SMALL) == first
    assert {case["name"].split()[0] for case in first} >= {"matmul", "conv2d", "random"}


def test_model_sees_only_the_windows_of_the_core():
    """`predict` on a core with one window ignores the windows after it, as the core does."""
    from tpugen.sim.tb_core import A, C, PROGRAM

    windows = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False)]
    image = bytearray(MEMORY_SIZE)
    program = Program().load(tensor(A, 1, 0, [Dim(extent=4, bound=4, stride=1)])).end()
    image[:program.size] = program.to_bytes()
    assert predict(SMALL, image, windows, PROGRAM, 2, 500).outcomes == {DONE}
    assert predict(dataclasses.replace(SMALL, windows=1), image, windows, PROGRAM, 2,
                   500).outcomes == {(ErrorCode.LOAD_WINDOW.name, 0)}


def test_model_predicts_the_hand_written_error_cases():
    """The model against the error programs of tests/test_core_verilator.py, whose outcomes are
    written by hand."""
    from tpugen.sim.tb_core import A, C, PROGRAM, _error_programs

    windows = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False),
               (C, 0x1000, False, True)]
    for name, program, code, index in _error_programs(SMALL):
        image = bytearray(MEMORY_SIZE)
        image[PROGRAM:PROGRAM + program.size] = program.to_bytes()
        prediction = predict(SMALL, image, windows, PROGRAM, len(program), 500)
        assert prediction.outcomes == {(code.name, index)}, name
    image = bytearray(MEMORY_SIZE)
    image[:64] = Program().end().to_bytes()
    assert predict(SMALL, image, windows[1:], PROGRAM, 1, 500).outcomes == {
        (ErrorCode.PROGRAM_WINDOW.name, 0)}
    assert predict(SMALL, image, windows, PROGRAM, 0, 500).outcomes == {DONE}
    assert predict(SMALL, image, windows, PROGRAM, 5, 500).outcomes == {DONE}
    assert predict(SMALL, image, windows, PROGRAM + 8, 5, 500).outcomes == {
        (ErrorCode.MISALIGNED.name, 0)}


def test_model_queues_as_many_instructions_as_the_config_says():
    """A MATMUL waiting for the LOAD fetched after the next MATMUL: with two-instruction queues
    both MATMULs wait queued and the LOAD is fetched; with one, the fetcher waits for room behind
    the first MATMUL and never reaches the LOAD (WATCHDOG blames the MATMUL)."""
    from tpugen.firmware.program import Deps, Dim, tensor
    from tpugen.sim.tb_core import A, C, PROGRAM

    windows = [(PROGRAM, A - PROGRAM, True, False), (A, C - A, True, False)]
    tile = tensor(A, 1, 0, [Dim(extent=4, bound=4, stride=1)])
    program = (Program().matmul(0, 0, 0, 4, deps=Deps(pop_prev=True)).matmul(0, 0, 0, 4)
               .load(tile, Deps(push_next=True)).end())
    image = bytearray(MEMORY_SIZE)
    image[PROGRAM:PROGRAM + program.size] = program.to_bytes()
    outcomes = {depth: predict(dataclasses.replace(SMALL, queue_depth=depth), image, windows,
                               PROGRAM, len(program), 500).outcomes for depth in (1, 2)}
    assert outcomes == {1: {(ErrorCode.WATCHDOG.name, 0)}, 2: {DONE}}
