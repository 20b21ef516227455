"""Fuzzing the whole core on Verilator with hypothesis-drawn programs, valid and not.

Every case (see `tpugen.sim.fuzz`) must end within its cycle bound with one of the outcomes the
model allows, raise the interrupt and clear it on the acknowledge, make no AXI access outside
the windows or against the protocol, and, for valid programs, leave numpy's result in memory.
TPUGEN_FUZZ_PROGRAMS sets the number of cases (default 200; e.g. 2000 for a deep run).
"""
import collections
import json
import os

from hypothesis import HealthCheck, Phase, given, settings

from tpugen import CoreConfig
from tpugen.firmware.program import Program
from tpugen.isa import ErrorCode
from tpugen.sim.fuzz import DONE, MEMORY_SIZE, cases, predict

SMALL = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=64)
PROGRAMS = int(os.environ.get("TPUGEN_FUZZ_PROGRAMS", "200"))
SLACK = 2
"""The model's cycle bound assumes memory that never stalls; the run pauses each AXI channel
of the memory 30% of the time."""


def _draw(count):
    drawn = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases(SMALL))
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def _problems(case, outcome):
    """What is wrong with ``outcome`` (from sim/tb_fuzz.py) for ``case``: a list of strings."""
    bound = SLACK * case["cycles"]
    if outcome["hang"]:
        return [f"no interrupt within {bound} cycles (STATUS {outcome['status']:#x}, AXI monitor "
                f"{outcome['monitor'][:3]})"]
    problems = []
    got = [outcome["error"], None if outcome["error"] == "NONE" else outcome["index"]]
    if got not in case["expect"]:
        problems.append(f"ended with {got}, expected one of {case['expect']}")
    done = got == list(DONE)
    if (outcome["done"], outcome["error_bit"], outcome["busy"]) != (done, not done, 0):
        problems.append(f"STATUS done={outcome['done']} error={outcome['error_bit']} "
                        f"busy={outcome['busy']} after the interrupt")
    if outcome["irq_status"] != (0b01 if done else 0b10):
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
    if outcome["monitor"]:
        problems.append(f"AXI monitor: {outcome['monitor'][:3]}")
    return problems


def test_fuzzed_programs_end_as_the_model_says(run_tb, tmp_path):
    """PROGRAMS cases in one simulation, with random backpressure on every memory channel."""
    drawn = _draw(PROGRAMS)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(drawn))
    stats = run_tb(SMALL, "tpugen.sim.tb_fuzz",
                   {"cases": str(path), "seed": 7, "backpressure": True, "slack": SLACK},
                   design="tpu_core", testcase="fuzz")
    outcomes = stats["outcomes"]
    kinds = collections.Counter(case["name"].split()[0] for case in drawn[:len(outcomes)])
    ends = collections.Counter("hang" if o["hang"] else o["error"] for o in outcomes)
    print(f"\n{stats['programs']} fuzzed programs ran in {stats['sim_seconds']:.0f} s of "
          f"simulation ({sum(o.get('latency', 0) for o in outcomes)} cycles, {stats['reads']} "
          f"read and {stats['writes']} write bursts): {dict(kinds)}; ends: {dict(ends)}")
    failures = []
    for number, (case, outcome) in enumerate(zip(drawn, outcomes)):
        if problems := _problems(case, outcome):
            failure = f"case {number} ({case['name']}): " + "; ".join(problems)
            failures.append(failure)
    assert not failures, (f"{len(failures)} of {len(outcomes)} cases failed:\n"
                          + "\n".join(failures[:20]))
    assert stats["programs"] == len(drawn)


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
