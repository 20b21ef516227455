"""`tpugen demo`: generate a core, run workloads on Verilator, check them against numpy."""
import tempfile

from .sim.verilator import run_testbench

__all__ = ["DEMO_MATMULS", "format_table", "run_demo"]

DEMO_MATMULS = [(1, 1, 1), (37, 13, 6), (64, 64, 64), (100, 30, 17)]
"""(M, K, N): a trivial one, awkward shapes, and a cube."""


def format_table(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
             for line in (header, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(config):
    """Run tiled matmuls on the generated `tpu_core` under Verilator, print a table."""
    print(f"tpugen demo: tpu_core {config.rows}x{config.cols} int8, "
          f"{config.scratchpad_kib} KiB scratchpad, {config.accumulator_kib} KiB accumulator, "
          f"AXI {config.axi_data_width}-bit, on Verilator + cocotbext-axi")
    header = ("op", "shape (MxKxN)", "check vs numpy", "cycles", "MAC util", "bytes read",
              "bytes written")
    with tempfile.TemporaryDirectory(prefix="tpugen-demo-") as tmp:
        try:
            stats = run_testbench(config, "tpugen.sim.tb_core",
                                  {"seed": 0, "shapes": [list(s) for s in DEMO_MATMULS]},
                                  tmp, design="tpu_core", testcase="matmul")
        except AssertionError as error:
            print(format_table(header, [("matmul", "x".join(map(str, s)), "FAIL", "-", "-", "-", "-")
                                        for s in DEMO_MATMULS]))
            print(error)
            return 1
    rows = []
    for run in stats["runs"]:
        utilization = run["macs"] / (run["cycles"] * config.macs)
        rows.append(("matmul", "x".join(map(str, run["shape"])), "exact", run["cycles"],
                     f"{utilization:.1%}", run["bytes_read"], run["bytes_written"]))
    print(format_table(header, rows))
    return 0
