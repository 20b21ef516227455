"""Issue 20's small and skinny matmuls: cycles and useful MAC utilization of every bench matmul
(`tpugen.bench.MATMULS`, 512^3 on 16x16 with ``--large``) on both bench cores at the bench's
read latency, and the demo's matmuls (8x8, no added latency), each checked bit-exact. With
``--conv-attention`` also the bench's conv2d and attention rows on 16x16 (the large ones but
the 2048-token attention). Writes JSON to the path given:
``nice .venv/bin/python docs/bench/measure_gemm.py out.json [--large] [--conv-attention]``."""
import json
import sys

import numpy as np

from tpugen.bench import (ATTENTIONS, CONFIGS, CONVS, LARGE_ATTENTIONS, LARGE_CONVS,
                          LARGE_MATMULS, MATMULS, MEMORY_SIZE, READ_LATENCY, measure_workloads)
from tpugen.config import CoreConfig
from tpugen.demo import DEMO_WORKLOADS, prepare_workload
from tpugen.sim import SimDevice


def main(path, large=False, conv_attention=False):
    results = []
    for label, config in CONFIGS.items():
        workloads = [("matmul", s) for s in
                     MATMULS + (LARGE_MATMULS if large and label == "16x16" else [])]
        if conv_attention and label == "16x16":
            workloads += ([("conv2d", s) for s in CONVS + LARGE_CONVS]
                          + [("attention", s) for s in ATTENTIONS + LARGE_ATTENTIONS[:2]])
        with SimDevice(config, memory="rtl", memory_size=MEMORY_SIZE,
                       read_latency=READ_LATENCY) as dev:
            for entry in measure_workloads(dev, label, workloads, np.random.default_rng(0)):
                assert entry["check_passed"], entry
                results.append({"config": label, "op": entry["op"], "shape": entry["shape"],
                                "cycles": entry["cycles"],
                                "mac_utilization": entry["mac_utilization"],
                                **{key: entry[key] for key in (
                                    "bytes_read", "bytes_written", "load_busy_cycles",
                                    "execute_busy_cycles", "store_busy_cycles")}})
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
    main(sys.argv[1], large="--large" in sys.argv, conv_attention="--conv-attention" in sys.argv)
