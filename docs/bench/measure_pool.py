"""Issue 20's conv2d with a per-channel epilogue and 2x2 pooling (``pool``, the default), the
same epilogue without pooling (``epilogue``) or none (``plain``, int32 outputs): cycles, useful
MAC utilization, bytes and engine busy counters of the ResNet-style 3x3 64->64 56x56 layer on
the 16x16 large preset (``16x16``) or a 3x3 32->32 28x28 one on the 8x8 core (``8x8``), memory
reads 20 cycles late, checked bit-exact against `apply_epilogue(conv2d_int32(...))`. Prints one
JSON line: ``nice .venv/bin/python docs/bench/measure_pool.py 16x16 [pool|epilogue|plain]``."""
import json
import sys
import time

import numpy as np

from tpugen.bench import MEMORY_SIZE, READ_LATENCY
from tpugen.config import PRESETS, CoreConfig
from tpugen.sim import SimDevice
from tpugen.sim.golden import apply_epilogue, conv2d_int32

SHAPES = {"16x16": (PRESETS["large"], (1, 64, 56, 56), 64),
          "8x8": (CoreConfig(rows=8, cols=8), (1, 32, 28, 28), 32)}


def main(label, mode="pool"):
    config, x_shape, k = SHAPES[label]
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, x_shape, dtype=np.int8)
    w = rng.integers(-128, 128, (k, x_shape[1], 3, 3), dtype=np.int8)
    options = {"bias": rng.integers(-5000, 5000, k),
               "requant": (rng.integers(1000, 30000, k), 22), "relu": True,
               "pool": mode == "pool"}
    if mode == "plain":
        options = {}
    elif mode not in ("pool", "epilogue"):
        raise ValueError(f"mode={mode!r} is invalid: allowed pool, epilogue or plain")
    expected = apply_epilogue(conv2d_int32(x, w, 1, 1), channel_axis=1, spatial_axes=(2, 3),
                              **options)
    with SimDevice(config, memory="rtl", memory_size=MEMORY_SIZE,
                   read_latency=READ_LATENCY) as dev:
        start = time.perf_counter()
        got = dev.conv2d(x, w, padding=1, **options)
        seconds = time.perf_counter() - start
        stats = dev.stats
    print(json.dumps({
        "config": label, "mode": mode, "x": x_shape, "w": w.shape,
        "exact": bool(np.array_equal(got, expected)),
        "cycles": stats.cycles, "mac_utilization": round(stats.mac_utilization, 4),
        "array_occupancy": round(stats.array_occupancy, 4), "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written, "load_busy": stats.load_busy_cycles,
        "execute_busy": stats.execute_busy_cycles, "store_busy": stats.store_busy_cycles,
        "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
