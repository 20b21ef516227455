"""`tpugen sweep`: which configuration fits a board and runs the bench workloads fastest.

Each point of a grid (a configuration on a board) is measured by a job on dask.distributed
(synthesis for the resources, place and route for Fmax where asked), on a `LocalCluster` or an
existing scheduler; the cost model (`plan_gemm`, `gemm_cycles`) gives the cycles of every bench
workload. The result is one table (CSV and JSON), plots and a summary naming the fastest
configuration that fits each board, per workload (docs/sweep.md)."""
import csv
import hashlib
import importlib.util
import io
import json
import math
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tqdm import tqdm

from . import __version__
from .bench import bench_workloads, workload_label, workload_macs
from .config import CoreConfig
from .fpga.boards import board_named
from .toolchain import cache_dir

__all__ = ["DEFAULT_TIMEOUT", "WORKLOADS", "Point", "SweepProgress", "best_configurations",
           "format_summary", "grid", "lut_equivalents", "measure_point", "parse_sizes",
           "parse_vary", "plot_sweep", "run_sweep", "workload_cycles", "write_results"]

WORKLOADS = bench_workloads(large=False)
"""(op, shape) of the bench workloads (`tpugen bench --quick`) the cost model times."""
DEFAULT_TIMEOUT = 3600.0
"""Seconds a point's job may run before it is stopped and reported as timed out."""
_DERIVED = ("lut_multipliers",)
"""Fields a point derives from its board (PEs on LUTs: those the DSP blocks cannot hold)."""


@dataclass(frozen=True)
class Point:
    """One configuration on one board; ``place_and_route``: also measure Fmax (slow)."""
    board: str
    config: CoreConfig
    place_and_route: bool = False

    @property
    def label(self):
        """The board, the array and the fields that differ from the board's own configuration
        ("ulx3s-85f 8x8 axi_data_width=32")."""
        config = self.config
        own = asdict(board_named(self.board).default_config(config.rows, config.cols))
        changed = [f"{name}={value}" for name, value in asdict(config).items()
                   if name not in _DERIVED and value != own[name]]
        return " ".join([self.board, f"{config.rows}x{config.cols}", *changed])


def parse_sizes(text):
    """[(rows, cols)] of ``text`` like "2x2,4x4,8x16"; ValueError naming --sizes."""
    sizes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise ValueError(f"--sizes {item.strip()!r} is invalid: allowed ROWSxCOLS, e.g. "
                             "2x2,4x4,8x8")
        sizes.append((int(parts[0]), int(parts[1])))
    return sizes


def parse_vary(items):
    """{field: [values]} of ``items`` like ["axi_data_width=32,64", "softmax=true,false"];
    ValueError naming --vary."""
    types = {field.name: field.type for field in fields(CoreConfig)
             if field.name not in ("rows", "cols", *_DERIVED)}
    vary = {}
    for item in items:
        name, equals, values = item.partition("=")
        if not equals or name not in types or not values:
            raise ValueError(f"--vary {item!r} is invalid: allowed FIELD=V1,V2,... with FIELD "
                             f"one of {', '.join(types)}")
        parsed = []
        for value in values.split(","):
            if types[name] is bool and value.lower() in ("true", "false"):
                parsed.append(value.lower() == "true")
            elif types[name] is int and value.lstrip("-").isdigit():
                parsed.append(int(value))
            elif types[name] is str:
                parsed.append(value)
            else:
                raise ValueError(f"--vary {item!r} is invalid: {value!r} is not a "
                                 f"{types[name].__name__}")
        vary[name] = parsed
    return vary


def grid(boards, sizes, vary=None, *, place_and_route=False):
    """Points of every board x size x combination of ``vary`` ({field: [values]}): each
    board's own configuration (`Board.default_config`) with the varied fields replaced and
    as many PEs on DSP blocks as the board has to spare; a point with the softmax unit has the
    epilogue multiplier (its O / l), unless ``vary`` sets it. A bad value: ValueError naming
    it."""
    combinations = [{}]
    for name, values in (vary or {}).items():
        combinations = [{**done, name: value} for done in combinations for value in values]
    points = []
    for name in boards:
        try:
            board = board_named(name)
        except ValueError as error:
            raise ValueError(f"boards: {error}") from None
        for rows, cols in sizes:
            for changes in combinations:
                config = board.default_config(rows, cols)
                if changes.get("softmax"):
                    changes = {"epilogue_multiplier": True, **changes}
                config = replace(config, lut_multipliers=0, **changes)
                points.append(Point(name, board.with_dsp_pes(config), place_and_route))
    return points


def lut_equivalents(family, counts):
    """The LUTs the cells of ``counts`` (`synth_report` totals) take: an iCE40 SB_CARRY shares
    its logic cell with an SB_LUT4; an ECP5 CCU2C holds two LUT4s and a TRELLIS_DPR16X4 six
    (slices A and B as RAM, slice C's write port)."""
    if family == "ice40":
        return counts["luts"]
    return counts["luts"] + 2 * counts["carry"] + 6 * counts["lut_rams"]


def measure_point(board_name, config, place_and_route):
    """The default job of a point: {"resources": {kind: count}, "fmax_mhz", "source"} from a
    flat yosys synthesis of the core alone (what `tpugen build --synth-only` runs), or with
    ``place_and_route`` from the board build's report (the whole board system, cached)."""
    board = board_named(board_name)
    if place_and_route:
        from .fpga.build import BuildError, build

        try:
            report = build(board, config).report
        except BuildError as error:
            if error.report is None:
                raise
            report = error.report
        return {"resources": {kind: numbers["used"]
                              for kind, numbers in report["resources"].items()},
                "fmax_mhz": report["fmax_mhz"], "source": "nextpnr (board system)"}
    from .fpga.synth import synth_report

    report = synth_report(config, board.family, per_block=False)
    total = report["total"]
    resources = {resource.kind: total[resource.kind] for resource in board.resources}
    resources["luts"] = lut_equivalents(board.family, total)
    return {"resources": resources, "fmax_mhz": None, "source": "yosys (core alone)",
            "cells": {kind: count for kind, count in total.items() if kind != "by_type"},
            "synth_seconds": report["seconds"]}


def _sources_digest():
    """Digest of the generator's and the tools' recipes (hdl/ and fpga/): a changed design is a
    new point."""
    digest = hashlib.sha256()
    for package in ("hdl", "fpga"):
        root = Path(importlib.util.find_spec(f"{__package__}.{package}").origin).parent
        for path in sorted(root.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _point_key(point, measure):
    """The hash of what a point's measurement depends on: the results cache's key."""
    parts = [point.board, point.config.to_json(), str(point.place_and_route),
             f"{measure.__module__}.{measure.__qualname__}", __version__, _sources_digest()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


_STARTUP_SECONDS = 600
"""Seconds a job's process may take to start (Python, imports) before its timeout begins."""


def _child():
    """Body of the process `_run_isolated` starts: sys.path, then the job and its arguments
    (cloudpickle) on stdin; a byte on stdout once it is loaded; ("ok", result) or ("failed",
    error) pickled to the file argv[1]. Kills its process group (tools included) when its parent
    dies."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    sys.path[:] = pickle.load(sys.stdin.buffer)
    job, args = pickle.load(sys.stdin.buffer)
    sys.stdout.buffer.write(b"!")
    sys.stdout.flush()
    os.dup2(2, 1)  # what the job prints goes to the log, not to the pipe nobody reads
    try:
        outcome = ("ok", job(*args))
    except Exception as error:  # reported in the table, the sweep goes on
        outcome = ("failed", f"{type(error).__name__}: {error}")
    Path(sys.argv[1]).write_bytes(pickle.dumps(outcome))


def _run_isolated(job, args, timeout):
    """The dask task of a point: ``job(*args)`` in a process of its own (its own session), killed
    with its tools when it runs longer than ``timeout`` seconds (from when it is loaded).
    {"status": "ok" | "failed" | "timeout", "result" or "error", "seconds"}."""
    import cloudpickle

    with tempfile.TemporaryDirectory(prefix="tpugen-sweep-") as tmp:
        result_file, log_file = Path(tmp) / "outcome.pickle", Path(tmp) / "log.txt"
        with open(log_file, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-c", "from tpugen.sweep import _child; _child()",
                 str(result_file)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        child.stdin.write(pickle.dumps(sys.path) + cloudpickle.dumps((job, args)))
        child.stdin.close()
        loaded = select.select([child.stdout], [], [], _STARTUP_SECONDS)[0]
        start = time.perf_counter()
        try:
            child.wait(timeout=timeout if loaded else 0)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return {"status": "timeout", "seconds": round(time.perf_counter() - start, 1),
                    "error": f"timed out after {timeout:g} s" if loaded else
                             f"its process did not start in {_STARTUP_SECONDS} s"}
        finally:
            child.stdout.close()
        seconds = round(time.perf_counter() - start, 1)
        if not result_file.exists():
            tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return {"status": "failed", "seconds": seconds,
                    "error": f"the job's process exited with {child.returncode}: {tail[0]}"}
        status, value = pickle.loads(result_file.read_bytes())
    if status == "ok":
        return {"status": "ok", "result": value, "seconds": seconds}
    return {"status": "failed", "error": value, "seconds": seconds}


def workload_cycles(config, op, shape):
    """(cycles, note) of a bench workload from the cost model; cycles None when this core
    cannot run it (the note says why). conv2d is costed as its implicit GEMM, attention as its
    two GEMMs (Q K^T and P V; the softmax passes are not counted)."""
    from .firmware.attention import plan_attention
    from .firmware.conv2d import conv2d_lowering, conv2d_output_shape
    from .firmware.gemm_cost import gemm_cycles
    from .firmware.gemm_plan import plan_gemm

    try:
        if op == "matmul":
            return math.ceil(gemm_cycles(config, plan_gemm(config, *shape))), ""
        if op == "conv2d":
            n, c, h, w, k, r, s, stride, padding = shape
            _, _, p, q = conv2d_output_shape((n, c, h, w), (k, c, r, s), stride, padding, 1)
            if (not config.im2col
                    and conv2d_lowering(config, (n, c, h, w), (k, c, r, s)) == "im2col"):
                return None, "needs the im2col walker (the filters do not fit the scratchpad)"
            return math.ceil(gemm_cycles(config, plan_gemm(config, n * p * q, c * r * s, k,
                                                           m_tile_limit=p * q))), ""
        seq, kv, dim, _ = shape
        if not config.softmax:
            return None, "needs the softmax unit"
        plan_attention(config, seq, kv, dim)
        return math.ceil(gemm_cycles(config, plan_gemm(config, seq, dim, kv))
                + gemm_cycles(config, plan_gemm(config, seq, kv, dim))), ""
    except ValueError as error:
        return None, str(error)


def _row(point, outcome, cached, workloads):
    """The table row of ``point``: its measurement (``outcome`` of `_run_isolated`), whether the
    device holds it, and per workload the cost model's cycles, the time at the achieved Fmax
    (else the board's clock), MACs/s and MACs/s per LUT."""
    board = board_named(point.board)
    row = {"label": point.label, "board": point.board, "device": board.device,
           "config": asdict(point.config), "status": outcome["status"],
           "error": outcome.get("error", ""), "job_seconds": outcome["seconds"],
           "cached": cached}
    result = outcome.get("result")
    resources = result["resources"] if result else {}
    row["source"] = result["source"] if result else ""
    row["resources"] = {resource.kind: {
        "used": resources.get(resource.kind), "total": resource.total,
        "percent": (round(100 * resources[resource.kind] / resource.total, 1)
                    if resource.kind in resources else None)} for resource in board.resources}
    row["fits"] = (all(resources[kind] <= numbers["total"]
                       for kind, numbers in row["resources"].items()) if result else None)
    row["fmax_mhz"] = result["fmax_mhz"] if result else None
    row["clock_mhz"] = row["fmax_mhz"] or board.default_mhz
    row["clock"] = "Fmax" if row["fmax_mhz"] else "board clock"
    luts = resources.get("luts")
    row["workloads"] = []
    for op, shape in workloads:
        cycles, note = workload_cycles(point.config, op, shape)
        entry = {"name": workload_label({"op": op, "shape": list(shape)}), "op": op,
                 "shape": list(shape), "cycles": cycles, "note": note, "seconds": None,
                 "macs_per_second": None, "macs_per_second_per_lut": None}
        if cycles is not None:
            entry["seconds"] = cycles / (row["clock_mhz"] * 1e6)
            entry["macs_per_second"] = workload_macs(op, shape) / entry["seconds"]
            if luts:
                entry["macs_per_second_per_lut"] = entry["macs_per_second"] / luts
        row["workloads"].append(entry)
    return row


class SweepProgress:
    """A tqdm bar of points on stderr (on a terminal), and a line as each point finishes and
    every ``every`` seconds: points done, running, queued, failed; elapsed; an estimate of the
    time left (the points left at the rate the measured ones took)."""

    def __init__(self, total, every=60.0, stream=None):
        self.total, self.every = total, every
        self.stream = stream or sys.stderr
        self.start = self.shown = time.monotonic()
        self.done = self.failed = self.measured = 0
        self.bar = tqdm(total=total, unit="point", file=self.stream, disable=None, leave=False,
                        desc="sweep")

    def cached(self, count, directory):
        """``count`` points came from the results cache in ``directory``."""
        self.done += count
        self.bar.update(count)
        if count:
            self.bar.write(f"[sweep] {count} of {self.total} points from the cache "
                           f"({directory})", file=self.stream)

    def finished(self, row, running):
        self.done += 1
        self.bar.update(1)
        self.failed += row["status"] != "ok"
        self.measured += 1
        what = f"{row['status']} in {row['job_seconds']:.0f} s" + (
            f": {row['error']}" if row["error"] else "")
        self._line(f"{row['label']} {what}", running)

    def tick(self, running):
        if time.monotonic() - self.shown >= self.every:
            self._line("", running)

    def _line(self, text, running):
        now = time.monotonic()
        self.shown = now
        elapsed = now - self.start
        left = self.total - self.done
        estimate = ("about 0 s left" if not left else
                    f"about {elapsed / self.measured * left:.0f} s left" if self.measured
                    else "no estimate yet")
        queued = max(0, left - running)
        self.bar.write(f"[sweep] {self.done}/{self.total} done, {running} running, {queued} "
                       f"queued, {self.failed} failed; {elapsed:.0f} s elapsed, {estimate}"
                       + (f"; {text}" if text else ""), file=self.stream)
        if self.done == self.total:
            self.bar.close()


@contextmanager
def _client(scheduler, workers):
    """``with _client(...) as client``: a dask Client of the scheduler at ``scheduler`` (once it
    has a worker), else of a new LocalCluster of ``workers`` single-threaded processes
    (default: one per CPU), closed afterwards."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    if not scheduler:
        with LocalCluster(n_workers=workers or os.cpu_count(), threads_per_worker=1,
                          processes=True, dashboard_address=":0",
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield client
        return
    # Both waits last dask's distributed.comm.timeouts.connect (30 s).
    try:
        client = Client(scheduler)
    except (OSError, TimeoutError) as error:
        raise ConnectionError(f"cannot reach the dask scheduler at {scheduler}: "
                              f"{error}") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=dask.config.get("distributed.comm.timeouts.connect"))
        except TimeoutError:
            raise ConnectionError(f"the dask scheduler at {scheduler} has no workers") from None
        yield client


def run_sweep(points, *, measure=measure_point, workloads=WORKLOADS, scheduler=None,
              workers=None, timeout=DEFAULT_TIMEOUT, cache=None, quiet=False):
    """Measure ``points`` on dask and return their table rows, in order.

    ``measure(board_name, config, place_and_route)``: the job of a point, returning
    {"resources": {kind: count}, "fmax_mhz", "source"} (default: `measure_point`); it runs in a
    process of its own on a worker and is killed after ``timeout`` seconds. ``scheduler``: the
    address of a running scheduler (tcp://host:8786), else a LocalCluster of ``workers``
    processes. ``cache``: the directory of finished points (default: $TPUGEN_CACHE/sweep),
    keyed by a hash of each point; a failed or timed-out point is reported and not cached.
    ``quiet``: no progress lines."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r} is invalid: allowed a number of seconds > 0")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers={workers!r} is invalid: allowed an integer >= 1")
    cache = Path(cache) if cache is not None else cache_dir() / "sweep"
    cache.mkdir(parents=True, exist_ok=True)
    keys = [_point_key(point, measure) for point in points]
    outcomes = {}
    for index, key in enumerate(keys):
        path = cache / f"{key}.json"
        if path.exists():
            outcomes[index] = json.loads(path.read_text())
    progress = None if quiet else SweepProgress(len(points))
    rows = [None] * len(points)
    for index, outcome in outcomes.items():
        rows[index] = _row(points[index], outcome, True, workloads)
    if progress:
        progress.cached(len(outcomes), cache)
    todo = [index for index in range(len(points)) if index not in outcomes]
    if todo:
        from distributed import wait

        with _client(scheduler, workers) as client:
            # A priority for the smaller points: a sweep cut short has more of them.
            futures = {client.submit(_run_isolated, measure,
                                     (points[i].board, points[i].config,
                                      points[i].place_and_route),
                                     timeout, key=f"sweep-{keys[i]}", pure=False,
                                     priority=-points[i].config.macs): i
                       for i in todo}
            pending = set(futures)
            while pending:
                try:
                    done, pending = wait(pending, timeout=5, return_when="FIRST_COMPLETED")
                except TimeoutError:  # nothing finished in 5 s
                    done = set()
                threads = client.nthreads()
                running = sum(min(len(tasks), threads.get(worker, 1))
                              for worker, tasks in client.processing().items()) if pending else 0
                for future in done:
                    index = futures[future]
                    try:
                        outcome = future.result()
                    except Exception as error:  # the worker died, or the task failed in dask
                        outcome = {"status": "failed", "seconds": 0.0,
                                   "error": f"{type(error).__name__}: {error}"}
                    if outcome["status"] == "ok":
                        (cache / f"{keys[index]}.json").write_text(json.dumps(outcome))
                    rows[index] = _row(points[index], outcome, False, workloads)
                    if progress:
                        progress.finished(rows[index], running)
                if progress and not done:
                    progress.tick(running)
    return rows


_CSV_RESOURCES = ("luts", "ffs", "dsps", "block_rams", "sprams")


def _csv_rows(rows):
    """The table flattened: one CSV row per point, one column per field, resource and
    workload quantity."""
    names = [field.name for field in fields(CoreConfig)]
    flat = []
    for row in rows:
        line = {"label": row["label"], "board": row["board"], "device": row["device"],
                **{name: row["config"][name] for name in names},
                "status": row["status"], "error": row["error"], "fits": row["fits"],
                "source": row["source"], "job_seconds": row["job_seconds"]}
        for kind in _CSV_RESOURCES:
            numbers = row["resources"].get(kind, {})
            line[kind] = numbers.get("used")
            line[f"{kind}_percent"] = numbers.get("percent")
        line.update(fmax_mhz=row["fmax_mhz"], clock_mhz=row["clock_mhz"])
        for entry in row["workloads"]:
            for quantity in ("cycles", "seconds", "macs_per_second", "macs_per_second_per_lut"):
                value = entry[quantity]
                line[f"{entry['name']} {quantity}"] = (
                    f"{value:.6g}" if isinstance(value, float) else value)
        flat.append(line)
    return flat


def _closest(rows):
    """The row of ``rows`` whose most used resource is the smallest share of its device, as
    text: its label and what overflows."""
    def worst(row):
        return max(numbers["percent"] for numbers in row["resources"].values())

    row = min(rows, key=worst)
    over = [f"{kind.replace('_', ' ')} {numbers['percent']:.0f}%"
            for kind, numbers in row["resources"].items() if numbers["percent"] > 100]
    return f"{row['label']} ({', '.join(over)} of the device)"


def best_configurations(rows):
    """{board: {workload name: the row of the fastest configuration that fits}} (a workload
    no fitting configuration runs is left out)."""
    best = {}
    for row in rows:
        if not row["fits"]:
            continue
        for index, entry in enumerate(row["workloads"]):
            if entry["seconds"] is None:
                continue
            board = best.setdefault(row["board"], {})
            held = board.get(entry["name"])
            if held is None or entry["seconds"] < held["workloads"][index]["seconds"]:
                board[entry["name"]] = row
    return best


def _resource(row, kind):
    """"used (percent%)" of a resource of ``row``, "-" when not measured."""
    numbers = row["resources"].get(kind)
    if not numbers or numbers["used"] is None:
        return "-"
    return f"{numbers['used']:,} ({numbers['percent']:.0f}%)"


def format_summary(rows, command=""):
    """The summary as Markdown: the points (resources, fit, errors), then per board the fastest
    fitting configuration of each workload and the one fastest on the most workloads (or, when
    none fits, the one closest to fitting)."""
    lines = ["# Design-space sweep", ""]
    if command:
        lines += [f"`{command}`", ""]
    sources = ", ".join(dict.fromkeys(row["source"] for row in rows if row["source"]))
    lines += ["Resources of each point (used, % of the device; measured by "
              f"{sources or 'nothing'}), whether it fits (every resource within the device; "
              "a synthesis of the core alone leaves out the board system around it and place "
              "and route, which `--place-and-route` adds), and the cost model's time of each "
              "bench workload at the board's clock (or the Fmax of place and route). The whole "
              "table: sweep.csv / sweep.json; docs/sweep.md says how each number is made.", "",
              "| point | status | LUTs | FFs | DSPs | BRAMs | fits | clock MHz | job s |",
              "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for row in rows:
        status = row["status"] + (f": {row['error']}" if row["error"] else "")
        fits = {None: "-", True: "yes", False: "no"}[row["fits"]]
        lines.append(f"| {row['label']} | {status} | "
                     + " | ".join(_resource(row, kind)
                                  for kind in ("luts", "ffs", "dsps", "block_rams"))
                     + f" | {fits} | {row['clock_mhz']:g} | {row['job_seconds']:.0f} |")
    best = best_configurations(rows)
    for board in dict.fromkeys(row["board"] for row in rows):
        lines += ["", f"## Best on the {board}", ""]
        if board not in best:
            measured = [row for row in rows if row["board"] == board and row["fits"] is False]
            lines.append("No configuration of the sweep fits this board" + ("." if not measured
                         else "; the closest: " + _closest(measured) + "."))
            continue
        lines += ["| workload | fastest that fits | time | MACs/s | MACs/s per LUT |",
                  "|---|---|---:|---:|---:|"]
        wins = {}
        for name, row in best[board].items():
            entry = next(e for e in row["workloads"] if e["name"] == name)
            wins[row["label"]] = wins.get(row["label"], 0) + 1
            lines.append(f"| {name} | {row['label']} | {entry['seconds'] * 1e3:.3f} ms | "
                         f"{entry['macs_per_second'] / 1e9:.3f} G | "
                         f"{entry['macs_per_second_per_lut']:,.0f} |")
        label, count = max(wins.items(), key=lambda item: item[1])
        lines += ["", f"Best configuration on the {board}: **{label}** (fastest on {count} of "
                      f"{len(best[board])} workloads)."]
    return "\n".join(lines) + "\n"


def _pareto(points):
    """The (x, y) of ``points`` no other point beats in both (lower is better), by x."""
    front, lowest = [], math.inf
    for x, y in sorted(points):
        if y < lowest:
            front.append((x, y))
            lowest = y
    return front


def plot_sweep(rows, directory):
    """resources.png (% of the device against array size, per board), fmax.png (when place and
    route ran) and pareto.png (time per workload against LUTs, the Pareto front of the fitting
    points of each board marked) in ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def log_axis(axes, which, unit=1.0):
        """A log scale on ``axes``' x or y axis, labelled in plain numbers times ``unit``
        (mathtext's 10^x labels are slow to lay out)."""
        getattr(axes, f"set_{which}scale")("log")
        axis = getattr(axes, f"{which}axis")
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(
            lambda value, _: f"{value * unit / 1e3:g}k" if value * unit >= 1e4
            else f"{value * unit:g}"))
        axis.set_minor_formatter(NullFormatter())

    measured = [row for row in rows if row["status"] == "ok"]
    boards = list(dict.fromkeys(row["board"] for row in measured))
    paths = []
    if not boards:
        return paths

    def size(row):
        return row["config"]["rows"] * row["config"]["cols"]

    def size_axis(axis, board_rows):
        ticks = sorted({size(row): row for row in board_rows}.items())
        axis.set_xscale("log", base=2)
        axis.set_xticks([macs for macs, _ in ticks],
                        [f"{row['config']['rows']}x{row['config']['cols']}" for _, row in ticks])
        axis.set_xlabel("array")

    fig, axes = plt.subplots(1, len(boards), figsize=(6 * len(boards), 4.5), squeeze=False)
    for axis, board in zip(axes[0], boards):
        board_rows = sorted((row for row in measured if row["board"] == board), key=size)
        for kind in _CSV_RESOURCES:
            values = [(size(row), row["resources"][kind]["percent"]) for row in board_rows
                      if kind in row["resources"]]
            if any(percent for _, percent in values):  # log scale: an unused kind is not drawn
                axis.plot(*zip(*values), "o-", label=kind.replace("_", " "))
        axis.axhline(100, color="k", linestyle="--", linewidth=1, label="the whole device")
        log_axis(axis, "y")
        axis.set_ylabel("% of the device")
        size_axis(axis, board_rows)
        axis.set_title(f"{board} ({board_named(board).device}), {board_rows[0]['source']}")
        axis.legend(fontsize=8)
    fig.tight_layout()
    paths.append(Path(directory) / "resources.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    if any(row["fmax_mhz"] for row in measured):
        fig, axis = plt.subplots(figsize=(6, 4.5))
        for board in boards:
            values = sorted((size(row), row["fmax_mhz"]) for row in measured
                            if row["board"] == board and row["fmax_mhz"])
            if values:
                axis.plot(*zip(*values), "o-", label=board)
        size_axis(axis, measured)
        axis.set_ylabel("Fmax (MHz)")
        axis.legend()
        fig.tight_layout()
        paths.append(Path(directory) / "fmax.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    names = [entry["name"] for entry in measured[0]["workloads"]]
    columns = min(4, len(names))
    fig, axes = plt.subplots(-(-len(names) // columns), columns, squeeze=False,
                             figsize=(4.2 * columns, 3.4 * -(-len(names) // columns)))
    for index, name in enumerate(names):
        axis = axes.flat[index]
        for color, board in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], boards):
            values = [(row["resources"]["luts"]["used"], row["workloads"][index]["seconds"],
                       row["fits"]) for row in measured if row["board"] == board
                      and row["workloads"][index]["seconds"] is not None]
            for fits in (True, False):
                chosen = [(x, y) for x, y, ok in values if ok == fits]
                if chosen:
                    axis.scatter(*zip(*chosen), color=color if fits else "none",
                                 edgecolors=color,
                                 label=f"{board}" + ("" if fits else " (does not fit)"))
            front = _pareto([(x, y) for x, y, ok in values if ok])
            if front:
                axis.step(*zip(*front), where="post", color=color, linewidth=1)
        log_axis(axis, "x")
        log_axis(axis, "y", unit=1e3)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel(f"LUTs ({measured[0]['source']})", fontsize=8)
        axis.set_ylabel("time (ms)", fontsize=8)
    for axis in list(axes.flat)[len(names):]:
        axis.set_visible(False)
    handles = {label: handle for axis in axes.flat
               for handle, label in zip(*axis.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles),
               fontsize=8, title="filled: fits; line: Pareto front of the fitting points")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    paths.append(Path(directory) / "pareto.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_results(rows, directory, command=""):
    """sweep.json, sweep.csv, summary.md and the plots in ``directory``; their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    flat = _csv_rows(rows)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
    writer.writeheader()
    writer.writerows(flat)
    (directory / "sweep.csv").write_text(text.getvalue())
    (directory / "summary.md").write_text(format_summary(rows, command))
    return [directory / name for name in ("sweep.json", "sweep.csv", "summary.md")] + plot_sweep(
        rows, directory)
