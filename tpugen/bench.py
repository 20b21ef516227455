"""`tpugen bench`: every target of docs/DESIGN.md (Targets) measured, beside its ideal, its
memory roofline and what limits it; plus generator and simulator speed."""
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np
from tqdm import tqdm

from .arch import SOFTMAX_OUT_FRAC
from .config import PRESETS, CoreConfig
from .demo import useful_macs

__all__ = ["READ_LATENCY", "attention_speculation", "bench_markdown", "bench_workloads",
           "BenchCheckError", "check_workload", "compulsory_bytes", "ideal_attention_utilization",
           "ideal_gemm_utilization", "limiting_factor", "measure_workloads", "plot_bench",
           "roofline_utilization", "run_bench", "runs_on", "target_rows", "workload_label",
           "workload_macs"]

MATMULS = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 16, 256), (16, 256, 256),
           (1024, 64, 8)]
LARGE_MATMULS = [(512, 512, 512)]
CONVS = [  # ResNet-like layers (N, C, H, W, K, R, S, stride, padding), scaled to simulate quickly
    (1, 16, 14, 14, 16, 3, 3, 1, 1),
    (1, 32, 14, 14, 32, 1, 1, 1, 0),
    (1, 16, 14, 14, 32, 3, 3, 2, 1),
]
LARGE_CONVS = [(1, 64, 56, 56, 64, 3, 3, 1, 1)]
LARGE_CONV_EPILOGUES = LARGE_CONVS
"""conv2d shapes also measured with a per-channel epilogue ("conv2d_epilogue": bias, requant,
ReLU; what a quantized CNN layer runs) and with it and 2x2 max pooling ("conv2d_pool")."""
CONV_OPS = ("conv2d", "conv2d_epilogue", "conv2d_pool")
"""The bench's conv2d workloads: plain, with the epilogue, with the epilogue and pooling."""
ATTENTIONS = [(64, 64, 32, False), (128, 128, 64, False), (256, 256, 64, False)]
"""(L, S, d, causal), one head."""
LARGE_ATTENTIONS = [(512, 512, 64, False), (512, 512, 128, False), (2048, 2048, 64, True)]
CONFIGS = {"8x8": CoreConfig(rows=8, cols=8), "16x16": PRESETS["large"],
           "micro": PRESETS["micro"]}
"""The cores the bench runs. Micro (the UP5K's profile) runs the matmuls only: it has no softmax
unit, and without the im2col walker the bench's convolutions do not fit its 1 KiB scratchpad
(`runs_on`)."""
SIM_DEVICE_TARGETS = {"8x8": 100_000, "16x16": 50_000}
"""Cycles per second of `SimDevice` calls (wall time, the host's compile included) per core."""
SPEED_MATMUL = (256, 256, 256)
"""The matmul whose simulation speed (8x8 core, memory inside the model) is the speed target."""
READ_LATENCY = 20
"""Cycles a read takes beyond the memory's own in the benchmark (`SimDevice` with the memory in
the model, ``memory="rtl"``, its R channel through a 20-stage delay line): the realistic
latency of docs/DESIGN.md (Targets) (block RAM alone answers in 1-2)."""
MEMORY_SIZE = 16 << 20
"""Bytes of memory in the benchmark's model: the largest workload needs about 2 MB."""


def ideal_gemm_utilization(config, m, k, n):
    """Useful MACs over array MACs when every array cycle streams an activation vector: only
    partial tiles (K not a multiple of rows, N not of cols) and the fill/drain are lost."""
    cycles = math.ceil(k / config.rows) * math.ceil(n / config.cols) * m + config.rows + config.cols
    return m * k * n / (cycles * config.macs)


def ideal_attention_utilization(config, seq, kv, dim, causal=False):
    """The same for attention's two GEMMs, S = Q K^T and O = P V (softmax steps cost 0): query
    i streams once per key tile (S) and per key chunk (O) it needs; with ``causal`` only those
    with a key j <= i + S - L."""
    from .firmware.attention import attention_macs

    keys = [min(kv, i + kv - seq + 1) if causal else kv for i in range(seq)]
    cycles = (sum(math.ceil(dim / config.rows) * math.ceil(n / config.cols)
                  + math.ceil(n / config.rows) * math.ceil(dim / config.cols) for n in keys)
              + config.rows + config.cols)
    return attention_macs(1, seq, kv, dim, causal) / (cycles * config.macs)


@contextmanager
def _cold_cache():
    """Builds inside go to a fresh cache, so their time is a cold build."""
    saved = os.environ.get("TPUGEN_CACHE")
    with tempfile.TemporaryDirectory(prefix="tpugen-bench-cache-") as cache:
        os.environ["TPUGEN_CACHE"] = cache
        try:
            yield
        finally:
            if saved is None:
                del os.environ["TPUGEN_CACHE"]
            else:
                os.environ["TPUGEN_CACHE"] = saved


def _speed(results):
    from .hdl.generate import generate_verilog
    from .sim.verilator import build_model

    for design in ("tpu_core", "systolic_array"):
        start = time.perf_counter()
        generate_verilog(PRESETS["large"], design)
        results[f"generate_{design}_16x16_seconds"] = round(time.perf_counter() - start, 2)
    with _cold_cache():
        model = build_model(CoreConfig(), "tpu_core")
    results["verilator_build_tpu_core_8x8_seconds"] = round(model.build_seconds, 1)


def compulsory_bytes(op, shape):
    """(read, written) bytes when every operand is read once and every result written once."""
    if op == "matmul":
        m, k, n = shape
        return m * k + k * n, 4 * m * n
    if op in CONV_OPS:
        from .firmware.conv2d import conv2d_output_shape

        nb, c, h, w, k, r, s, stride, padding = shape
        _, _, p, q = conv2d_output_shape((nb, c, h, w), (k, c, r, s), stride, padding, 1,
                                         pool=op == "conv2d_pool")
        # The epilogue's int8 outputs; its parameters (7 bytes a channel) are not counted.
        return nb * c * h * w + k * c * r * s, (4 if op == "conv2d" else 1) * nb * k * p * q
    seq, kv, dim, _ = shape
    return (seq + 2 * kv) * dim, 4 * seq * dim


def roofline_utilization(config, useful_macs, ideal, bytes_read, bytes_written):
    """The best MAC utilization when ``bytes_read`` and ``bytes_written`` must cross the AXI bus
    (read and write channels each move one beat a cycle) and compute runs at ``ideal``."""
    beat = config.axi_data_width // 8
    compute_cycles = useful_macs / (config.macs * ideal)
    return useful_macs / (config.macs * max(compute_cycles, bytes_read / beat,
                                            bytes_written / beat))


def limiting_factor(config, entry):
    """What the measured cycles beyond the useful ones went to, largest first, from the
    hardware counters: memory bus, execute waits (loads / tokens), execute overhead (fill, drain,
    instruction issue, softmax passes; with the waits on a core without busy counters), unused
    lanes (partial tiles); for attention then the
    speculation's hit rate (`attention_speculation`), which sets the softmax passes' cost."""
    cycles = entry["cycles"]
    beat = config.axi_data_width // 8
    streaming = entry["issued_mac_utilization"] * cycles
    busy = entry["execute_busy_cycles"]
    overhead_name = ("softmax passes and per-MATMUL fill" if entry["op"] == "attention"
                     else "fill/drain and instruction issue")
    losses = {
        # A core without busy counters (`CoreConfig.counters="traffic"`) tells the waits from
        # the overhead apart no more.
        **({f"execute waits, {overhead_name}": cycles - streaming} if busy is None else
           {"execute waits for loads or tokens": cycles - busy, overhead_name: busy - streaming}),
        "unused array lanes (partial tiles)": streaming - entry["mac_utilization"] * cycles,
    }
    bus = max(entry["bytes_read"], entry["bytes_written"]) / beat / cycles
    name, lost = max(losses.items(), key=lambda item: item[1])
    text = f"{name}: {lost / cycles:.1%} of cycles"
    if bus > 0.85:
        text = f"memory bus: {bus:.0%} of cycles move a beat; then {text}"
    speculation = entry.get("speculation_hits")
    if speculation and speculation["query_blocks"]:
        text += (f"; speculation hit {speculation['fraction']:.1%} of "
                 f"{speculation['query_blocks']:,} query blocks")
    elif speculation:
        text += "; no speculation (one block of keys per query)"
    return text


def attention_speculation(config, inputs):
    """How often the softmax unit's speculative max pass hit on an attention workload's
    ``inputs`` (float q, k, v, causal), counted on the core's program by the bit-exact model
    (`speculation_hits`): ``{"fraction", "hits", "query_blocks"}``, ``query_blocks`` the
    queries of the BLOCKs without ``first`` (``fraction`` None when there are none)."""
    from .sim.attention_model import speculation_hits

    (qi, ki, vi), _, frac, causal = _quantized_attention(inputs)
    hits, blocks = speculation_hits(config, qi, ki, vi, frac, causal)
    return {"fraction": round(hits / blocks, 4) if blocks else None, "hits": hits,
            "query_blocks": blocks}


def _workload_entry(config, label, op, shape, useful_macs, ideal, stats, seconds, **extra):
    """A workload's results; ``extra`` entries come before the limit, which may name them."""
    entry = {
        "op": op, "shape": list(shape), "config": label, "read_latency": READ_LATENCY,
        "cycles": stats.cycles, "useful_macs": useful_macs,
        "mac_utilization": round(useful_macs / (stats.cycles * config.macs), 4),
        "issued_mac_utilization": round(stats.array_occupancy, 4),
        "ideal_utilization": round(ideal, 4),
        "bytes_read": stats.bytes_read, "bytes_written": stats.bytes_written,
        "load_busy_cycles": stats.load_busy_cycles,
        "execute_busy_cycles": stats.execute_busy_cycles,
        "store_busy_cycles": stats.store_busy_cycles,
        "sim_seconds": round(seconds, 4),
        "sim_cycles_per_second": round(stats.cycles / seconds),
        **extra,
    }
    read, written = compulsory_bytes(op, shape)
    entry["roofline_utilization"] = round(
        roofline_utilization(config, useful_macs, ideal, read, written), 4)
    entry["program_roofline_utilization"] = round(roofline_utilization(
        config, useful_macs, ideal, stats.bytes_read, stats.bytes_written), 4)
    entry["limit"] = limiting_factor(config, entry)
    return entry


class BenchCheckError(AssertionError):
    """Some workload's output differs from the golden model: a bench number for a wrong answer
    is worthless. ``failures``: the entries that failed; ``results``: what was measured."""

    def __init__(self, failures, results):
        self.failures, self.results = failures, results
        super().__init__(f"{len(failures)} workload(s) gave a wrong answer: " + "; ".join(
            f"{w['config']} {w['op']} {'x'.join(map(str, w['shape']))}: {w['check']}"
            for w in failures))


def _mismatch(got, expected):
    """'' when ``got`` equals ``expected`` (dtype, shape, values), else what differs."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"MISMATCH: got {got.dtype} {got.shape}, expected {expected.dtype} {expected.shape}"
    bad = np.argwhere(got != expected)
    if not len(bad):
        return ""
    first = tuple(int(i) for i in bad[0])
    return (f"MISMATCH: {len(bad)} of {expected.size} elements differ, the first at {first}: "
            f"got {got[first]}, expected {expected[first]}")


def check_workload(config, op, inputs, got):
    """(passed, text): ``got``, the core's output of ``op`` on ``inputs``, against the numpy
    golden model. matmul (a, b) and conv2d (x, w, stride, padding) must be bit-exact (int32
    wrap-around), conv2d_epilogue and conv2d_pool (x, w, stride, padding, bias, requant) too
    (int8, with ReLU; conv2d_pool 2x2 max pooled); attention (q, k, v, causal), float (L, d),
    must equal the bit-exact model of the core's int8 attention, dequantized as
    `Device.attention` does, and be within ``ATTENTION_TOLERANCE`` (relative Frobenius error)
    of float attention."""
    from .demo import ATTENTION_TOLERANCE
    from .sim.golden import apply_epilogue, conv2d_int32, matmul_int32

    if op == "matmul":
        problem = _mismatch(got, matmul_int32(*inputs).astype(np.int32))
        return not problem, problem or "exact"
    if op == "conv2d":
        x, w, stride, padding = inputs
        problem = _mismatch(got, conv2d_int32(x, w, stride, padding).astype(np.int32))
        return not problem, problem or "exact"
    if op in CONV_OPS:
        x, w, stride, padding, bias, requant = inputs
        problem = _mismatch(got, apply_epilogue(conv2d_int32(x, w, stride, padding), 1, (2, 3),
                                                bias=bias, requant=requant, relu=True,
                                                pool=op == "conv2d_pool"))
        return not problem, problem or "exact"
    from .sim.attention_model import attention_float, attention_int8_model

    (qi, ki, vi), (sq, sk, sv), frac, causal = _quantized_attention(inputs)
    model = attention_int8_model(config, qi, ki, vi, frac, causal)
    expected = (model.astype(np.float64) * (sv / 2 ** SOFTMAX_OUT_FRAC)).astype(np.float32)[0]
    reference = attention_float(qi * sq, ki * sk, vi * sv, causal)[0]
    error = float(np.linalg.norm(np.asarray(got, np.float64) - reference)
                  / np.linalg.norm(reference))
    problem = _mismatch(got, expected)
    if error > ATTENTION_TOLERANCE:
        problem = (f"{problem + '; ' if problem else ''}float err {error:.2%} over the "
                   f"{ATTENTION_TOLERANCE:.0%} budget")
    return not problem, problem or f"exact, float err {error:.2%}"


def _quantized_attention(inputs):
    """An attention workload's inputs (float q, k, v (n, d), causal) as the core runs them:
    ((q, k, v) int8 of one head, their scales, frac, causal) (`quantize_attention`)."""
    from .firmware.attention import quantize_attention

    *operands, causal = inputs
    return (*quantize_attention(*(x[None] for x in operands)), causal)


def bench_workloads(large):
    """(op, shape) of every workload, the large ones with ``large``."""
    return ([("matmul", shape) for shape in MATMULS + (LARGE_MATMULS if large else [])]
            + [("conv2d", shape) for shape in CONVS + (LARGE_CONVS if large else [])]
            + [(op, shape) for op in CONV_OPS[1:]
               for shape in (LARGE_CONV_EPILOGUES if large else [])]
            + [("attention", shape) for shape in ATTENTIONS + (LARGE_ATTENTIONS if large else [])])


def runs_on(config, op):
    """Whether the bench runs workloads of ``op`` on the core ``config``: attention needs the
    softmax unit, the bench's convolutions the im2col walker."""
    if op == "attention":
        return config.softmax
    return op == "matmul" or config.im2col  # the rest are CONV_OPS


def measure_workloads(dev, label, workloads, rng, progress=None):
    """Run ``workloads`` [(op, shape)] on device ``dev`` (core ``label``) with inputs from
    ``rng``: one entry each, with its ``check`` against the golden model (`check_workload`)
    and ``check_passed``. ``progress(entry)`` is called as each one finishes."""
    from .firmware.conv2d import conv2d_output_shape

    config = dev.config
    entries = []
    for op, shape in workloads:
        if op == "matmul":
            m, k, n = shape
            inputs = (rng.integers(-128, 128, (m, k), dtype=np.int8),
                      rng.integers(-128, 128, (k, n), dtype=np.int8))
            ideal = ideal_gemm_utilization(config, m, k, n)
        elif op in CONV_OPS:
            nb, c, h, w, k, r, s, stride, padding = shape
            x = rng.integers(-128, 128, (nb, c, h, w), dtype=np.int8)
            f = rng.integers(-128, 128, (k, c, r, s), dtype=np.int8)
            _, _, p, q = conv2d_output_shape(x.shape, f.shape, stride, padding, 1)
            inputs = (x, f, stride, padding)
            if op != "conv2d":  # a shift that keeps most outputs inside int8
                inputs += (rng.integers(-5000, 5000, k),
                           (rng.integers(1 << 14, 1 << 15, k),
                            np.full(k, 21 + (c * r * s).bit_length() // 2)))
            ideal = ideal_gemm_utilization(config, nb * p * q, c * r * s, k)
        else:
            seq, kv, dim, causal = shape
            inputs = (*(rng.standard_normal((n, dim)).astype(np.float32)
                        for n in (seq, kv, kv)), causal)
            ideal = ideal_attention_utilization(config, seq, kv, dim, causal)
        start = time.perf_counter()
        if op == "matmul":
            got = dev.matmul(*inputs)
        elif op == "conv2d":
            got = dev.conv2d(inputs[0], inputs[1], stride=inputs[2], padding=inputs[3])
        elif op in CONV_OPS:
            got = dev.conv2d(inputs[0], inputs[1], stride=inputs[2], padding=inputs[3],
                             bias=inputs[4], requant=inputs[5], relu=True,
                             pool=op == "conv2d_pool")
        else:
            got = dev.attention(*inputs[:3], causal=inputs[3])
        seconds = time.perf_counter() - start
        extra = ({"score_matrix_bytes": 4 * shape[0] * shape[1],
                  "speculation_hits": attention_speculation(config, inputs)}
                 if op == "attention" else {})
        entry = _workload_entry(config, label, op, shape, workload_macs(op, shape), ideal,
                                dev.stats, seconds, **extra)
        entry["check_passed"], entry["check"] = check_workload(config, op, inputs, got)
        entries.append(entry)
        if progress:
            progress(entry)
    return entries


class _Progress:
    """A tqdm bar of useful MACs on stderr (on a terminal), and a line per finished workload
    with an estimate of the time left (the time per useful MAC so far, times the MACs left)."""

    def __init__(self, planned_macs):
        self.total = len(planned_macs)
        self.left = sum(planned_macs)
        self.finished = self.done_macs = 0
        self.start = time.perf_counter()
        self.bar = tqdm(total=self.left, unit="MAC", unit_scale=True, file=sys.stderr,
                        disable=None, leave=False, desc="bench")

    def __call__(self, entry):
        self.finished += 1
        self.done_macs += entry["useful_macs"]
        self.left -= entry["useful_macs"]
        self.bar.update(entry["useful_macs"])
        elapsed = time.perf_counter() - self.start
        estimate = elapsed / self.done_macs * self.left
        self.bar.write(f"[{self.finished}/{self.total}] {entry['config']} {entry['op']} "
                       f"{'x'.join(map(str, entry['shape']))}: {entry['cycles']:,} cycles, "
                       f"{entry['mac_utilization']:.1%}, {entry['check']} ({elapsed:.0f} s, "
                       f"about {estimate:.0f} s left)", file=sys.stderr)
        if not self.left:
            self.bar.close()


def _demo_shape(op, shape):
    """A bench shape (a tuple) as the `DEMO_WORKLOADS`-style dict of the same workload."""
    if op == "matmul":
        return dict(zip(("m", "k", "n"), shape))
    if op in CONV_OPS:
        return {**dict(zip(("n", "c", "h", "w", "k", "r", "s", "stride", "padding"), shape)),
                "dilation": 1}
    return {"heads": 1, **dict(zip(("seq", "kv", "dim", "causal"), shape))}


def workload_macs(op, shape):
    """`demo.useful_macs` of a bench shape."""
    return useful_macs("conv2d" if op in CONV_OPS else op, _demo_shape(op, shape))


def run_bench(quick=False, builds=False, configs=CONFIGS):
    """Measure every workload and target (``quick``: leave out the large workloads; ``builds``:
    run the board builds that are not cached yet). Every workload's output is checked against
    the golden model; if any is wrong, `BenchCheckError` (with the results so far) once all
    workloads have run."""
    from .sim import SimDevice

    results = {}
    _speed(results)
    rng = np.random.default_rng(0)
    planned = {label: [(op, shape) for op, shape
                       in bench_workloads(not quick and config == PRESETS["large"])
                       if runs_on(config, op)]
               for label, config in configs.items()}
    progress = _Progress([workload_macs(op, shape) for work in planned.values()
                          for op, shape in work])
    workloads = []
    for label, config in configs.items():
        with SimDevice(config, memory="rtl", memory_size=MEMORY_SIZE,
                       read_latency=READ_LATENCY) as dev:
            workloads += measure_workloads(dev, label, planned[label], rng, progress)
    results["workloads"] = workloads
    failures = [w for w in workloads if not w["check_passed"]]
    if failures:
        raise BenchCheckError(failures, results)
    from .sim.speed import measure_sim_speed

    results["sim_speed"] = measure_sim_speed(CoreConfig(rows=8, cols=8), *SPEED_MATMUL,
                                             read_latency=READ_LATENCY)
    results["boards"] = board_results(builds)
    results["targets"] = target_rows(results)
    return results


BOARD_TARGETS = [("ulx3s-85f", 16, 16, 100.0), ("icebreaker", 4, 4, 25.0)]
"""(board, rows, cols, Fmax target in MHz) of docs/DESIGN.md (Targets)."""


def board_results(run_builds=False):
    """The build report of each board target: built now with ``run_builds`` (an hour or more in
    the WebAssembly tools), else the cached one of an earlier `tpugen build`, else None."""
    from .fpga.boards import board_named
    from .fpga.build import BuildError, build, cached_report

    boards = []
    for name, rows, cols, target_mhz in BOARD_TARGETS:
        board = board_named(name)
        config = board.default_config(rows, cols)
        report = cached_report(board, config)
        if run_builds and report is None:
            try:
                report = build(board, config).report
            except BuildError as error:
                report = error.report
        boards.append({"board": name, "rows": rows, "cols": cols, "target_mhz": target_mhz,
                       "report": report})
    return boards


def _find(results, op, shape, config="16x16"):
    return next((w for w in results["workloads"]
                 if w["op"] == op and w["shape"] == list(shape) and w["config"] == config), None)


def _target_row(what, target, limit, measured=None, met=None, ideal=None, roofline=None):
    """One row of the target table; ``measured`` and ``met`` stay None when not measured."""
    return {"what": what, "target": target, "measured": measured, "met": met, "ideal": ideal,
            "roofline": roofline, "limit": limit}


def _workload_target(what, entry, target):
    wanted = f">= {target:.0%}"
    if entry is None:
        return _target_row(what, wanted, "not measured (tpugen bench without --quick)")
    return _target_row(
        what, wanted, entry["limit"],
        measured=f"{entry['mac_utilization']:.1%} ({entry['cycles']:,} cycles)",
        met=entry["mac_utilization"] >= target and entry.get("check_passed", True),
        ideal=f"{entry['ideal_utilization']:.1%}",
        roofline=(f"{entry['roofline_utilization']:.1%} (this program's bytes: "
                  f"{entry['program_roofline_utilization']:.1%})"))


def _board_target(board):
    what = f"{board['rows']}x{board['cols']} on {board['board']}"
    target = f"fits, Fmax >= {board['target_mhz']:.0f} MHz"
    report = board["report"]
    if report is None:
        return _target_row(what, target, f"no finished build: never built, or did not route "
                                         f"(tpugen build --board {board['board']} "
                                         f"--rows {board['rows']} --cols {board['cols']})")
    if report["overflow"]:
        measured = "does not fit: " + ", ".join(
            f"{kind} {report['resources'][kind]['percent']:.0f}%" for kind in report["overflow"])
        return _target_row(what, target, "logic outside the array (see the build report)",
                           measured=measured, met=False)
    fmax = report["fmax_mhz"]
    return _target_row(what, target, "critical path in nextpnr's report" if fmax else "not routed",
                       measured=f"fits ({report['resources']['luts']['percent']:.0f}% LUTs), "
                                f"Fmax {fmax} MHz",
                       met=fmax is not None and fmax >= board["target_mhz"])


WORKLOAD_TARGETS = [  # (what, op, shape, core, utilization)
    (f"matmul 512^3 on 16x16, read latency {READ_LATENCY}", "matmul", LARGE_MATMULS[0], "16x16",
     0.95),
    ("conv2d 3x3 64->64 56x56 pad 1 on 16x16", "conv2d", LARGE_CONVS[0], "16x16", 0.95),
    ("conv2d 3x3 64->64 56x56 + per-channel bias, requant, ReLU (no pool) on 16x16",
     "conv2d_epilogue", LARGE_CONV_EPILOGUES[0], "16x16", 0.80),
    ("conv2d 3x3 64->64 56x56 + per-channel bias, requant, ReLU, 2x2 max pool on 16x16",
     "conv2d_pool", LARGE_CONV_EPILOGUES[0], "16x16", 0.80),
    ("fused attention L=S=512 d=64 on 16x16", "attention", LARGE_ATTENTIONS[0], "16x16", 0.85),
    ("fused attention L=S=2048 d=64 causal on 16x16", "attention", LARGE_ATTENTIONS[2], "16x16",
     0.80),
    ("matmul 64^3 on 16x16", "matmul", (64, 64, 64), "16x16", 0.75),
    ("skinny matmul 256x16x256 on 8x8", "matmul", (256, 16, 256), "8x8", 0.70),
    ("skinny matmul 16x256x256 on 8x8", "matmul", (16, 256, 256), "8x8", 0.70),
]
"""Utilization targets of docs/DESIGN.md (Targets) (dashed lines on the plot)."""


def target_rows(results):
    """The rows of docs/DESIGN.md (Targets): target, measured, ideal, roofline, limit."""
    rows = []
    for what, op, shape, core, target in WORKLOAD_TARGETS:
        entry = _find(results, op, shape, core)
        row = _workload_target(what, entry, target)
        if op == "attention" and entry is not None:
            seq, _, dim, _ = shape
            traffic = entry["bytes_read"] + entry["bytes_written"]
            row["measured"] += (f"; {traffic:,} bytes moved = {traffic / (seq * dim):.1f} L*d "
                                f"(the scores alone would be {entry['score_matrix_bytes']:,})")
        rows.append(row)
    rows += [_board_target(board) for board in results.get("boards", [])]
    speed = results.get("sim_speed")
    rows.append(_target_row(
        "8x8 core under cocotb + Verilator", ">= 50,000 cycles/s",
        speed.get("limit") if speed else "not measured",
        measured=f"{speed['cycles_per_second']:,.0f} cycles/s" if speed else None,
        met=speed["cycles_per_second"] >= 50_000 if speed else None))
    for label, target in SIM_DEVICE_TARGETS.items():
        entries = [w for w in results.get("workloads", []) if w["config"] == label]
        rate = (sum(w["cycles"] for w in entries) / sum(w["sim_seconds"] for w in entries)
                if entries else None)
        slowest = min((w["sim_cycles_per_second"] for w in entries), default=None)
        rows.append(_target_row(
            f"SimDevice {label}, one call each (compile, write, run, read back)",
            f">= {target:,} cycles/s", "Verilator's model; per call the host's compile and "
            "transfers (about 10 ms)",
            measured=(f"{rate:,.0f} cycles/s over the {len(entries)} workloads (slowest "
                      f"{slowest:,})" if entries else None),
            met=rate >= target if entries else None))
    seconds = results.get("generate_tpu_core_16x16_seconds")
    rows.append(_target_row(
        "tpugen generate 16x16", "< 10 s", "Amaranth's netlist build (Python) of the whole design",
        measured=f"{seconds} s" if seconds is not None else None,
        met=seconds < 10 if seconds is not None else None))
    return rows


def workload_label(workload):
    if workload["op"] == "matmul":
        return "matmul " + "x".join(map(str, workload["shape"]))
    if workload["op"] == "attention":
        seq, kv, dim, causal = workload["shape"]
        return f"attention L{seq} S{kv} d{dim}" + (" causal" if causal else "")
    _, c, h, w, k, r, s, stride, _ = workload["shape"]
    epilogue = {"conv2d": "", "conv2d_epilogue": " + epilogue",
                "conv2d_pool": " + epilogue + pool"}[workload["op"]]
    return f"conv {c}->{k} {h}x{w} {r}x{s}/{stride}{epilogue}"


def plot_bench(results, path):
    """Measured and ideal MAC utilization of every workload, one panel per core."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(w["config"] for w in results["workloads"]))
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.5), squeeze=False)
    for axis, label in zip(axes[0], configs):
        entries = [w for w in results["workloads"] if w["config"] == label]
        names = [workload_label(w) for w in entries]
        x = np.arange(len(entries))
        axis.bar(x - 0.27, [w["ideal_utilization"] for w in entries], 0.27, label="ideal")
        axis.bar(x, [w["roofline_utilization"] for w in entries], 0.27,
                 label="memory roofline (the core's AXI width)")
        axis.bar(x + 0.27, [w["mac_utilization"] for w in entries], 0.27,
                 label=f"measured (read latency {READ_LATENCY})")
        for i, w in enumerate(entries):
            target = next((t for _, op, shape, core, t in WORKLOAD_TARGETS
                           if (op, list(shape), core) == (w["op"], w["shape"], w["config"])),
                          None)
            if target:
                axis.plot([i - 0.45, i + 0.45], [target, target], "k--", linewidth=1,
                          label="target")
        axis.set_xticks(x, names, fontsize=7, rotation=40, ha="right")
        axis.set_ylim(0, 1)
        axis.set_ylabel("MAC utilization")
        axis.set_title(f"tpu_core {label}")
    handles = {label: handle for axis in axes[0]
               for handle, label in zip(*axis.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles),
               fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)


README_BEGIN = "<!-- bench targets: begin (tpugen bench --readme) -->"
README_END = "<!-- bench targets: end -->"


def _markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows])


def bench_targets_markdown(results):
    """The targets of one `run_bench` as a markdown table: wanted, measured, met, limit."""
    met = {True: "**yes**", False: "no", None: "-"}
    return _markdown_table(
        ("target", "wanted", "measured", "met", "what limits it"),
        [(t["what"], t["target"], t["measured"] or "not measured", met[t["met"]], t["limit"])
         for t in results["targets"]])


def readme_with_targets(readme, results):
    """``readme`` (text) with the part between `README_BEGIN` and `README_END` replaced by the
    targets table of ``results``; ValueError if the markers are missing."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the README has no {README_BEGIN!r} ... {README_END!r} section")
    return (readme[:begin + len(README_BEGIN)] + "\n" + bench_targets_markdown(results) + "\n"
            + readme[end:])


def bench_markdown(results):
    """The results of one `run_bench` as markdown (docs/bench/bench.md): the targets, then
    every workload with its ideal, roofline and limit."""
    workloads = _markdown_table(
        ("core", "op", "shape", "check", "cycles", "MAC util", "ideal", "roofline", "bytes read",
         "bytes written", "sim cycles/s", "limit"),
        [(w["config"], w["op"], "x".join(map(str, w["shape"])), w["check"], f"{w['cycles']:,}",
          f"{w['mac_utilization']:.1%}", f"{w['ideal_utilization']:.1%}",
          f"{w['roofline_utilization']:.1%}", f"{w['bytes_read']:,}", f"{w['bytes_written']:,}",
          f"{w['sim_cycles_per_second']:,}", w["limit"]) for w in results["workloads"]])
    return (f"# tpugen bench\n\nGenerated by `tpugen bench --markdown` (`make bench`) from one "
            f"run; memory reads {READ_LATENCY} cycles late; MAC util is the operation's own MACs "
            f"over cycles x rows x cols.\n\n## Targets\n\n{bench_targets_markdown(results)}\n\n"
            f"## Workloads\n\n{workloads}\n")
