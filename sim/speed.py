"""Simulation speed of the core with its memory inside the Verilator model (`SimSystem`)."""
import json
import tempfile
from pathlib import Path

from .verilator import build_model

__all__ = ["measure_sim_speed"]


def measure_sim_speed(config, m, k, n, *, read_latency=0, memory_kib=1024, seed=0,
                      timeout_cycles=100_000_000):
    """Run a random int8 (m, k) @ (k, n) matmul on `SimSystem` for ``config`` (checked
    bit-exactly against numpy) and time it.

    Returns the simulated cycles from the start to the interrupt (``sim_cycles``), the wall and
    CPU seconds they took (``run_seconds``, ``run_cpu_seconds``), ``cycles_per_second``, what
    limits it (``limit``), the seconds to load the operands and read the result through VPI
    (``load_seconds``, ``read_seconds``), ``build_seconds`` (0.0 from the cache) and the core's
    counters (``cycles``, ``macs``, ...).
    """
    model = build_model(config, "sim_system", memory_kib=memory_kib, read_latency=read_latency)
    params = {"config": config.to_json(), "m": m, "k": k, "n": n, "seed": seed,
              "memory_bytes": memory_kib << 10, "timeout_cycles": timeout_cycles}
    with tempfile.TemporaryDirectory(prefix="tpugen-speed-") as work_dir:
        model.run("tpugen.sim.tb_speed", work_dir, env={"TPUGEN_TB": json.dumps(params)})
        stats = json.loads((Path(work_dir) / "stats.json").read_text())
    cpu_share = stats["run_cpu_seconds"] / stats["run_seconds"]
    stats["cycles_per_second"] = round(stats["sim_cycles"] / stats["run_seconds"])
    per_cpu_second = stats["sim_cycles"] / stats["run_cpu_seconds"]
    stats["limit"] = (f"Verilator's evaluation of the model (no Python while the core runs); "
                      f"the simulator had {cpu_share:.0%} of a CPU: {per_cpu_second:,.0f} cycles "
                      f"per CPU second")
    stats["build_seconds"] = model.build_seconds
    return stats
