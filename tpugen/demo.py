"""`tpugen demo` and `tpugen run`: workloads on the simulated core, checked against numpy."""
import numpy as np

__all__ = ["DEMO_WORKLOADS", "format_table", "run_demo", "run_workloads"]

DEMO_WORKLOADS = [
    ("matmul", {"m": 37, "k": 13, "n": 6}),
    ("matmul", {"m": 64, "k": 64, "n": 64}),
    ("matmul", {"m": 100, "k": 30, "n": 17}),
    ("conv2d", {"n": 1, "c": 3, "h": 16, "w": 16, "k": 8, "r": 3, "s": 3, "stride": 1,
                "padding": 1, "dilation": 1}),
    ("conv2d", {"n": 2, "c": 8, "h": 9, "w": 9, "k": 16, "r": 3, "s": 3, "stride": 2,
                "padding": 0, "dilation": 1}),
]
"""(op, shape): awkward shapes, a cube, a padded conv and a strided one."""


def format_table(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
             for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _run_one(dev, rng, op, shape):
    from .sim.golden import conv2d_int32, matmul_int32

    if op == "matmul":
        a = rng.integers(-128, 128, (shape["m"], shape["k"]), dtype=np.int8)
        b = rng.integers(-128, 128, (shape["k"], shape["n"]), dtype=np.int8)
        return f"{shape['m']}x{shape['k']}x{shape['n']}", dev.matmul(a, b), matmul_int32(a, b)
    x = rng.integers(-128, 128, (shape["n"], shape["c"], shape["h"], shape["w"]), dtype=np.int8)
    w = rng.integers(-128, 128, (shape["k"], shape["c"], shape["r"], shape["s"]), dtype=np.int8)
    options = {key: shape[key] for key in ("stride", "padding", "dilation")}
    label = (f"x{tuple(x.shape)} w{tuple(w.shape)} s{options['stride']} p{options['padding']}"
             + (f" d{options['dilation']}" if options["dilation"] != 1 else ""))
    return label, dev.conv2d(x, w, **options), conv2d_int32(x, w, **options)


def run_workloads(config, workloads, seed=0, waves=None):
    """Run (op, shape) workloads on one SimDevice; print the table; 0 if all are exact."""
    from .firmware import SimDevice

    rng = np.random.default_rng(seed)
    rows, failed = [], 0
    with SimDevice(config, waves=waves) as dev:
        for op, shape in workloads:
            label, got, expected = _run_one(dev, rng, op, shape)
            exact = np.array_equal(got, expected)
            failed += not exact
            stats = dev.stats
            rows.append((op, label, "exact" if exact else "MISMATCH", stats.cycles,
                         f"{stats.mac_utilization:.1%}", stats.bytes_read, stats.bytes_written))
    print(f"tpu_core {config.rows}x{config.cols} int8, {config.scratchpad_kib} KiB scratchpad, "
          f"{config.accumulator_kib} KiB accumulator, AXI {config.axi_data_width}-bit, "
          "on Verilator + cocotbext-axi")
    print(format_table(("op", "shape", "check vs numpy", "cycles", "MAC util", "bytes read",
                        "bytes written"), rows))
    return 1 if failed else 0


def run_demo(config):
    return run_workloads(config, DEMO_WORKLOADS)
