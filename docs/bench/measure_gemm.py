"""Issue 20's small and skinny matmuls: cycles and useful MAC utilization of every bench matmul
(`tpugen.bench.MATMULS`, 512^3 on 16x16 with ``--large``) on both bench cores at the bench's
read latency, and the demo's matmuls (8x8, no added latency), each checked bit-exact. Writes
JSON to the path given: ``nice .venv/bin/python docs/bench/measure_gemm.py out.json``."""
import json
import sys

import numpy as np

from tpugen.bench import (CONFIGS, LARGE_MATMULS, MATMULS, MEMORY_SIZE, READ_LATENCY,
                          measure_workloads)
from tpugen.config import CoreConfig
from tpugen.demo import DEMO_WORKLOADS, prepare_workload
from tpugen.sim import SimDevice


def main(path, large=False):
    results = []
    for label, config in CONFIGS.items():
        shapes = MATMULS + (LARGE_MATMULS if large and label == "16x16" else [])
        with SimDevice(config, memory="rtl", memory_size=MEMORY_SIZE,
                       read_latency=READ_LATENCY) as dev:
            for entry in measure_workloads(dev, label, [("matmul", s) for s in shapes],
                                           np.random.default_rng(0)):
                assert entry["check_passed"], entry
                results.append({"config": label, "shape": entry["shape"],
                                "cycles": entry["cycles"],
                                "mac_utilization": entry["mac_utilization"],
                                **{key: entry[key] for key in (
                                    "bytes_read", "load_busy_cycles", "execute_busy_cycles",
                                    "store_busy_cycles")}})
                print(results[-1], flush=True)
    config = CoreConfig(rows=8, cols=8)
    rng = np.random.default_rng(0)
    with SimDevice(config, memory="rtl") as dev:
        for op, shape in DEMO_WORKLOADS:
            workload = prepare_workload(config, rng, op, shape)
            ok, _ = workload.check(workload.call(dev))
            if op == "matmul":
                assert ok, workload.label
                results.append({"config": "demo 8x8", "shape": workload.label,
                                "cycles": dev.stats.cycles,
                                "mac_utilization": dev.stats.mac_utilization})
                print(results[-1], flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], large="--large" in sys.argv)
