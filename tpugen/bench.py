"""`tpugen bench`: generator, Verilator build, simulation speed and core utilization."""
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from .config import PRESETS, CoreConfig

__all__ = ["BENCH_MATMULS", "run_bench"]

BENCH_MATMULS = [(64, 64, 64), (256, 64, 32), (128, 128, 128)]


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


def run_bench(matmuls=BENCH_MATMULS):
    from .hdl.generate import generate_verilog
    from .sim.verilator import run_testbench

    results = {}
    for design in ("tpu_core", "systolic_array"):
        start = time.perf_counter()
        generate_verilog(PRESETS["large"], design)
        results[f"generate_{design}_16x16_seconds"] = round(time.perf_counter() - start, 3)

    config = CoreConfig()
    with tempfile.TemporaryDirectory(prefix="tpugen-bench-") as tmp, _cold_cache():
        array = run_testbench(config, "tpugen.sim.tb_array", {"seed": 0, "tile_lengths": [256] * 16},
                              Path(tmp) / "array")
        core = run_testbench(config, "tpugen.sim.tb_core",
                             {"seed": 0, "monitor": False, "shapes": [list(s) for s in matmuls]},
                             Path(tmp) / "core", design="tpu_core", testcase="matmul")
    results["verilator_build_array_8x8_seconds"] = round(array["build_seconds"], 1)
    results["verilator_build_tpu_core_8x8_seconds"] = round(core["build_seconds"], 1)
    results["array_8x8_sim_cycles_per_second"] = round(array["cycles"] / array["sim_seconds"])
    results["array_8x8_streaming_mac_utilization"] = round(
        array["macs"] / (array["cycles"] * config.macs), 4)
    total_cycles = sum(run["cycles"] for run in core["runs"])
    results["tpu_core_8x8_sim_cycles_per_second"] = round(total_cycles / core["sim_seconds"])
    for run in core["runs"]:
        name = "matmul_" + "x".join(map(str, run["shape"]))
        busy = {engine: run[f"{engine}_busy_cycles"] for engine in ("load", "execute", "store")}
        results[name] = {
            "cycles": run["cycles"],
            "mac_utilization": round(run["macs"] / (run["cycles"] * config.macs), 4),
            "bytes_read": run["bytes_read"],
            "bytes_written": run["bytes_written"],
            **{f"{engine}_busy_cycles": value for engine, value in busy.items()},
            **{f"{engine}_stall_cycles": run[f"{engine}_stall_cycles"] for engine in busy},
            # > 1 when engines overlap: the sum of busy cycles over the wall cycles.
            "engine_overlap": round(sum(busy.values()) / run["cycles"], 3),
        }
    return results
