"""`tpugen demo` and `tpugen run`: workloads on the simulated core, checked against numpy."""
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .arch import SOFTMAX_OUT_FRAC

__all__ = ["ATTENTION_TOLERANCE", "DEMO_WORKLOADS", "Workload", "format_table", "prepare_workload",
           "run_demo", "run_workloads"]

ATTENTION_TOLERANCE = 2e-2
"""Relative Frobenius error allowed against the float reference (docs/DESIGN.md, Targets)."""

_FUSED = {"bias": True, "requant": True, "relu": True}

DEMO_WORKLOADS = [
    ("matmul", {"m": 37, "k": 13, "n": 6}),
    ("matmul", {"m": 64, "k": 64, "n": 64}),
    ("matmul", {"m": 100, "k": 30, "n": 17, **_FUSED}),
    ("conv2d", {"n": 1, "c": 3, "h": 16, "w": 16, "k": 8, "r": 3, "s": 3, "stride": 1,
                "padding": 1, "dilation": 1}),
    ("conv2d", {"n": 2, "c": 8, "h": 9, "w": 9, "k": 16, "r": 3, "s": 3, "stride": 2,
                "padding": 0, "dilation": 1}),
    ("conv2d", {"n": 1, "c": 8, "h": 15, "w": 15, "k": 12, "r": 3, "s": 3, "stride": 1,
                "padding": 1, "dilation": 1, **_FUSED, "pool": True}),
    ("attention", {"heads": 1, "seq": 50, "kv": 70, "dim": 24, "causal": False}),
    ("attention", {"heads": 2, "seq": 64, "kv": 64, "dim": 32, "causal": True}),
]
"""(op, shape): awkward shapes, a cube, padded and strided convs, conv + bias + requant + ReLU
+ 2x2 max pool in one program, and fused attention (multi-head, causal)."""


def format_table(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
             for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _epilogue_options(config, rng, shape, acc, channels):
    """Random per-channel bias and requantization that keep int8 outputs in range, or {}. On a
    core without the epilogue multiplier the multipliers are powers of two, which the runtime
    folds into the shift: the whole epilogue runs on the core (as `tpugen compile`'s C driver,
    which has no host epilogue, needs)."""
    options = {}
    if shape.get("bias"):
        options["bias"] = rng.integers(-2000, 2000, channels)
    if shape.get("requant"):
        if config.epilogue_multiplier:
            multiplier = rng.integers(1 << 14, 1 << 16, channels)
        else:
            multiplier = 1 << rng.integers(0, 16, channels)
        peak = max(1, int(np.abs(acc).max()))
        shift = int(np.ceil(np.log2(peak * multiplier.max() / 127)))
        least = 0 if config.epilogue_multiplier else int(multiplier.max()).bit_length() - 1
        options["requant"] = (multiplier, np.full(channels, max(shift, least)))
    if shape.get("relu"):
        options["relu"] = True
    if shape.get("pool"):
        options["pool"] = True
    return options


def _epilogue_label(options):
    return "".join(f" +{name}" for name in ("bias", "requant", "relu", "pool") if name in options)


@dataclass(frozen=True)
class Workload:
    """One operation with its operands: ``call(dev)`` runs it on a `Device` and returns the
    device's output; ``expected`` is that output, bit-exact (numpy); ``check(got)`` gives
    (ok, text)."""
    label: str
    call: Callable
    expected: np.ndarray
    check: Callable


def _exact(expected):
    def check(got):
        exact = got.dtype == expected.dtype and np.array_equal(got, expected)
        return exact, "exact" if exact else "MISMATCH"
    return check


def prepare_workload(config, rng, op, shape):
    """The `Workload` of (op, shape) on ``config``, its operands drawn from ``rng``."""
    from .sim.golden import apply_epilogue, conv2d_int32, matmul_int32

    if op == "matmul":
        a = rng.integers(-128, 128, (shape["m"], shape["k"]), dtype=np.int8)
        b = rng.integers(-128, 128, (shape["k"], shape["n"]), dtype=np.int8)
        acc = matmul_int32(a, b)
        options = _epilogue_options(config, rng, shape, acc, shape["n"])
        expected = apply_epilogue(acc, channel_axis=1, **options)
        label = f"{shape['m']}x{shape['k']}x{shape['n']}" + _epilogue_label(options)
        return Workload(label, lambda dev: dev.matmul(a, b, **options), expected,
                        _exact(expected))
    if op == "conv2d":
        x = rng.integers(-128, 128, (shape["n"], shape["c"], shape["h"], shape["w"]),
                         dtype=np.int8)
        w = rng.integers(-128, 128, (shape["k"], shape["c"], shape["r"], shape["s"]),
                         dtype=np.int8)
        conv = {key: shape[key] for key in ("stride", "padding", "dilation")}
        acc = conv2d_int32(x, w, **conv)
        options = _epilogue_options(config, rng, shape, acc, shape["k"])
        expected = apply_epilogue(acc, channel_axis=1, spatial_axes=(2, 3), **options)
        label = (f"x{tuple(x.shape)} w{tuple(w.shape)} s{conv['stride']} p{conv['padding']}"
                 + (f" d{conv['dilation']}" if conv["dilation"] != 1 else "")
                 + _epilogue_label(options))
        return Workload(label, lambda dev: dev.conv2d(x, w, **conv, **options), expected,
                        _exact(expected))
    return _attention_workload(config, rng, shape)


def _attention_workload(config, rng, shape):
    from .firmware.attention import quantize_attention
    from .sim.attention_model import attention_float, attention_int8_model

    heads, seq, kv, dim = shape["heads"], shape["seq"], shape["kv"], shape["dim"]
    q, k, v = (rng.standard_normal((heads, n, dim)).astype(np.float32) for n in (seq, kv, kv))
    (qi, ki, vi), (sq, sk, sv), frac = quantize_attention(q, k, v)
    expected = attention_int8_model(config, qi, ki, vi, frac, causal=shape["causal"])
    reference = attention_float(qi * sq, ki * sk, vi * sv, causal=shape["causal"])

    def check(got):
        error = np.linalg.norm(got * (sv / 2 ** SOFTMAX_OUT_FRAC) - reference) \
            / np.linalg.norm(reference)
        exact = np.array_equal(got, expected)
        return (exact and error <= ATTENTION_TOLERANCE,
                f"{'exact' if exact else 'MISMATCH'}, float err {error:.2%}")

    label = (f"{heads}h L{seq} S{kv} d{dim}" + (" causal" if shape["causal"] else ""))
    return Workload(label, lambda dev: dev.attention_int8(qi, ki, vi, frac,
                                                          causal=shape["causal"]),
                    expected, check)


def useful_macs(op, shape):
    """The operation's own multiply-accumulates for a `DEMO_WORKLOADS`-style shape (a partial
    tile counts what it computes, not the lanes it occupies), as `Stats.macs` counts them."""
    if op == "matmul":
        return shape["m"] * shape["k"] * shape["n"]
    if op == "conv2d":
        from .firmware.conv2d import conv2d_macs

        return conv2d_macs((shape["n"], shape["c"], shape["h"], shape["w"]),
                           (shape["k"], shape["c"], shape["r"], shape["s"]),
                           shape["stride"], shape["padding"], shape["dilation"])
    from .firmware.attention import attention_macs

    return attention_macs(shape["heads"], shape["seq"], shape["kv"], shape["dim"],
                          shape.get("causal", False))


def run_workloads(config, workloads, seed=0, waves=None, waves_window=(None, None),
                  memory="rtl", as_json=False):
    """Run (op, shape) workloads on one SimDevice with ``memory`` ("rtl" or "axiram"); print
    a table (or JSON with ``as_json``); 0 if all pass, else 1. ``waves``: trace to this VCD
    file, clock cycles ``waves_window`` (first, last; None: open) of the session."""
    from .sim import SimDevice

    rng = np.random.default_rng(seed)
    results = []
    print(f"starting a simulated {config.rows}x{config.cols} core (a new configuration is built "
          "with Verilator first: about a minute)", file=sys.stderr)
    with SimDevice(config, memory=memory, waves=waves, waves_from=waves_window[0],
                   waves_until=waves_window[1]) as dev:
        if dev.build_seconds:
            print(f"built the Verilator model in {dev.build_seconds:.0f} s (cached for the next "
                  "run)", file=sys.stderr)
        for op, shape in workloads:
            workload = prepare_workload(config, rng, op, shape)
            ok, check = workload.check(workload.call(dev))
            label = workload.label
            stats = dev.stats
            results.append({"op": op, "shape": label, "ok": bool(ok), "check": check,
                            "cycles": stats.cycles,
                            "mac_utilization": stats.mac_utilization,
                            "array_occupancy": stats.array_occupancy,
                            "bytes_read": stats.bytes_read,
                            "bytes_written": stats.bytes_written})
    failed = sum(not result["ok"] for result in results)
    if as_json:
        print(json.dumps({"config": asdict(config), "memory": memory, "workloads": results},
                         indent=2))
    else:
        memory_name = {"rtl": "memory in the model", "axiram": "cocotbext-axi AxiRam"}[memory]
        print(f"tpu_core {config.rows}x{config.cols} int8, {config.scratchpad_kib} KiB "
              f"scratchpad, {config.accumulator_kib} KiB accumulator, AXI "
              f"{config.axi_data_width}-bit, on Verilator ({memory_name})")
        print(format_table(("op", "shape", "check", "cycles", "MAC util", "bytes read",
                            "bytes written"),
                           [(r["op"], r["shape"], r["check"], r["cycles"],
                             f"{r['mac_utilization']:.1%}", r["bytes_read"], r["bytes_written"])
                            for r in results]))
    if waves:
        from .sim.gtkw import write_gtkw

        layout = Path(waves).with_suffix(".gtkw")
        write_gtkw(waves, layout)
        print(f"wrote {waves} and {layout} (gtkwave {layout}: registers, the AXI channels, "
              "engine states and queues in groups)", file=sys.stderr)
    return 1 if failed else 0


def run_demo(config, **options):
    """The demo workloads on ``config``; ``options``: those of `run_workloads`."""
    return run_workloads(config, DEMO_WORKLOADS, **options)
