"""`tpugen demo`: generate a core, run workloads on Verilator, check them against numpy."""
import tempfile
from pathlib import Path

from .hdl.array import min_tile_length
from .sim.verilator import run_testbench

__all__ = ["run_demo", "format_table"]


def format_table(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(config):
    """Stream weight tiles through the array; print op, shape, check, cycles, utilization."""
    shortest = min_tile_length(config)
    workloads = [
        ("one tile", [shortest]),
        ("8 tiles back to back", [64] * 8),
        ("mixed tile lengths", [shortest, 1, 3 * shortest, 17]),
    ]
    rows, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="tpugen-demo-") as tmp:
        for index, (name, lengths) in enumerate(workloads):
            shape = f"{len(lengths)} x ({'|'.join(map(str, sorted(set(lengths))))} x {config.rows}) @ ({config.rows} x {config.cols})"
            try:
                stats = run_testbench(config, "tpugen.sim.tb_array",
                                      {"seed": index, "tile_lengths": lengths}, Path(tmp) / str(index))
            except AssertionError:
                rows.append((f"array: {name}", shape, "FAIL", "-", "-"))
                failed += 1
                continue
            utilization = stats["macs"] / (stats["cycles"] * config.macs)
            rows.append((f"array: {name}", shape, "exact", stats["cycles"], f"{utilization:.1%}"))
    print(f"tpugen demo: {config.rows}x{config.cols} weight-stationary int8 array on Verilator")
    print(format_table(("op", "shape (tiles x A @ W)", "check vs numpy", "cycles", "MAC util"), rows))
    return 1 if failed else 0
