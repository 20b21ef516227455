"""`tpugen bench`: generator and simulator speed, and MAC utilization against the ideal."""
import math
import os
import tempfile
import time
from contextlib import contextmanager

import numpy as np

from .config import PRESETS, CoreConfig

__all__ = ["ideal_attention_utilization", "ideal_gemm_utilization", "run_bench", "plot_bench"]

MATMULS = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 16, 256), (16, 256, 256),
           (1024, 64, 8)]
LARGE_MATMULS = [(512, 512, 512)]
CONVS = [  # ResNet-like layers (N, C, H, W, K, R, S, stride, padding), scaled to simulate quickly
    (1, 16, 14, 14, 16, 3, 3, 1, 1),
    (1, 32, 14, 14, 32, 1, 1, 1, 0),
    (1, 16, 14, 14, 32, 3, 3, 2, 1),
]
LARGE_CONVS = [(1, 64, 56, 56, 64, 3, 3, 1, 1)]
ATTENTIONS = [(64, 64, 32), (128, 128, 64), (256, 256, 64)]  # (L, S, d), one head
LARGE_ATTENTIONS = [(512, 512, 64), (512, 512, 128)]
CONFIGS = {"8x8": CoreConfig(rows=8, cols=8), "16x16": PRESETS["large"]}


def ideal_gemm_utilization(config, m, k, n):
    """Useful MACs over array MACs when every array cycle streams an activation vector: only
    partial tiles (K not a multiple of rows, N not of cols) and the fill/drain are lost."""
    cycles = math.ceil(k / config.rows) * math.ceil(n / config.cols) * m + config.rows + config.cols
    return m * k * n / (cycles * config.macs)


def ideal_attention_utilization(config, seq, kv, dim):
    """The same for attention's two GEMMs, S = Q K^T and O = P V (softmax steps cost 0)."""
    cycles = (math.ceil(dim / config.rows) * math.ceil(kv / config.cols) * seq
              + math.ceil(kv / config.rows) * math.ceil(dim / config.cols) * seq
              + config.rows + config.cols)
    return 2 * seq * kv * dim / (cycles * config.macs)


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


def _speed(results):
    from .hdl.generate import generate_verilog
    from .sim.verilator import build_model

    for design in ("tpu_core", "systolic_array"):
        start = time.perf_counter()
        generate_verilog(PRESETS["large"], design)
        results[f"generate_{design}_16x16_seconds"] = round(time.perf_counter() - start, 2)
    with _cold_cache():
        model = build_model(CoreConfig(), "tpu_core")
    results["verilator_build_tpu_core_8x8_seconds"] = round(model.build_seconds, 1)


def _workload_entry(config, label, useful_macs, ideal, stats, seconds):
    return {
        "config": label, "cycles": stats.cycles, "useful_macs": useful_macs,
        "mac_utilization": round(useful_macs / (stats.cycles * config.macs), 4),
        "issued_mac_utilization": round(stats.mac_utilization, 4),
        "ideal_utilization": round(ideal, 4),
        "bytes_read": stats.bytes_read, "bytes_written": stats.bytes_written,
        "load_busy_cycles": stats.load_busy_cycles,
        "execute_busy_cycles": stats.execute_busy_cycles,
        "store_busy_cycles": stats.store_busy_cycles,
        "sim_cycles_per_second": round(stats.cycles / seconds),
    }


def run_bench(large=False, configs=CONFIGS):
    """Measure everything; ``large`` adds the 512-cube matmul and the full 56x56 conv layer."""
    from .firmware import SimDevice
    from .firmware.matmul import conv2d_output_shape

    results = {}
    _speed(results)
    rng = np.random.default_rng(0)
    workloads = []
    for label, config in configs.items():
        with SimDevice(config) as dev:
            for m, k, n in MATMULS + (LARGE_MATMULS if large else []):
                a = rng.integers(-128, 128, (m, k), dtype=np.int8)
                b = rng.integers(-128, 128, (k, n), dtype=np.int8)
                start = time.perf_counter()
                dev.matmul(a, b)
                entry = _workload_entry(config, label, m * k * n,
                                        ideal_gemm_utilization(config, m, k, n), dev.stats,
                                        time.perf_counter() - start)
                workloads.append({"op": "matmul", "shape": [m, k, n], **entry})
            for nb, c, h, w, k, r, s, stride, padding in CONVS + (LARGE_CONVS if large else []):
                x = rng.integers(-128, 128, (nb, c, h, w), dtype=np.int8)
                f = rng.integers(-128, 128, (k, c, r, s), dtype=np.int8)
                _, _, p, q = conv2d_output_shape(x.shape, f.shape, stride, padding, 1)
                start = time.perf_counter()
                dev.conv2d(x, f, stride=stride, padding=padding)
                gemm = (nb * p * q, c * r * s, k)
                entry = _workload_entry(config, label, math.prod(gemm),
                                        ideal_gemm_utilization(config, *gemm), dev.stats,
                                        time.perf_counter() - start)
                workloads.append({"op": "conv2d", "shape": [nb, c, h, w, k, r, s, stride, padding],
                                  **entry})
            for seq, kv, dim in ATTENTIONS + (LARGE_ATTENTIONS if large else []):
                q, k, v = (rng.standard_normal((n, dim)).astype(np.float32)
                           for n in (seq, kv, kv))
                start = time.perf_counter()
                dev.attention(q, k, v)
                entry = _workload_entry(config, label, 2 * seq * kv * dim,
                                        ideal_attention_utilization(config, seq, kv, dim),
                                        dev.stats, time.perf_counter() - start)
                workloads.append({"op": "attention", "shape": [seq, kv, dim], **entry,
                                  "score_matrix_bytes": 4 * seq * kv})
    results["workloads"] = workloads
    return results


def _label(workload):
    if workload["op"] == "matmul":
        return "matmul " + "x".join(map(str, workload["shape"]))
    if workload["op"] == "attention":
        return "attention L{} S{} d{}".format(*workload["shape"])
    _, c, h, w, k, r, s, stride, _ = workload["shape"]
    return f"conv {c}->{k} {h}x{w} {r}x{s}/{stride}"


def plot_bench(results, path):
    """Measured and ideal MAC utilization of every workload, one panel per core."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(w["config"] for w in results["workloads"]))
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.5), squeeze=False)
    for axis, label in zip(axes[0], configs):
        entries = [w for w in results["workloads"] if w["config"] == label]
        names = [_label(w) for w in entries]
        x = np.arange(len(entries))
        axis.bar(x - 0.2, [w["ideal_utilization"] for w in entries], 0.4, label="ideal")
        axis.bar(x + 0.2, [w["mac_utilization"] for w in entries], 0.4, label="measured")
        axis.set_xticks(x, names, fontsize=7, rotation=40, ha="right")
        axis.set_ylim(0, 1)
        axis.set_ylabel("MAC utilization")
        axis.set_title(f"tpu_core {label}")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
