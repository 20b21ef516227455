"""`tpugen bench`: generator, Verilator build and simulation speed."""
import os
import tempfile
import time
from pathlib import Path

from .config import CoreConfig

__all__ = ["run_bench"]


def run_bench():
    from .hdl.generate import generate_verilog
    from .sim.verilator import run_testbench

    results = {}
    large = CoreConfig(rows=16, cols=16)
    start = time.perf_counter()
    generate_verilog(large)
    results["generate_16x16_seconds"] = round(time.perf_counter() - start, 3)

    config = CoreConfig(rows=8, cols=8)
    with tempfile.TemporaryDirectory(prefix="tpugen-bench-") as tmp:
        saved = os.environ.get("TPUGEN_CACHE")
        os.environ["TPUGEN_CACHE"] = str(Path(tmp) / "cache")  # a cold build
        try:
            stats = run_testbench(config, "tpugen.sim.tb_array",
                                  {"seed": 0, "tile_lengths": [256] * 16}, Path(tmp) / "run")
        finally:
            if saved is None:
                del os.environ["TPUGEN_CACHE"]
            else:
                os.environ["TPUGEN_CACHE"] = saved
    results["verilator_build_8x8_seconds"] = round(stats["build_seconds"], 3)
    results["array_8x8_sim_cycles"] = stats["cycles"]
    results["array_8x8_sim_cycles_per_second"] = round(stats["cycles"] / stats["sim_seconds"])
    results["array_8x8_mac_utilization"] = round(stats["macs"] / (stats["cycles"] * config.macs), 4)
    return results
