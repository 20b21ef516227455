"""The architecture contract (`tpugen.arch`): the hardware is what it says, no copy of it is
written out elsewhere, and imports flow one way (the runtime never loads the HDL)."""
import ast
import dataclasses
import random
import re
import subprocess
import sys
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Fragment, Shape
from amaranth.lib import data, enum

from tpugen import CoreConfig
from tpugen.arch import (ENGINE_OPCODES, OPCODE_ENGINE, OPCODE_MASK, PENDING_DEPTH, QUEUE_DEPTH,
                         TOKEN_BITS, TOKEN_FLAGS, TOKEN_LIMIT, Engine, opcode_of, token_flag_bit)
from tpugen.firmware.program import Deps
from tpugen.hdl.controller import ENGINES, Controller
from tpugen.isa import Header, Opcode, encode, instruction_layout, pack
from tpugen.sim.testbench import UNKNOWN_INSTRUCTION

ROOT = Path(__file__).parent.parent
SMALL = CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32)


def _fifo_depths(controller):
    fragment = Fragment.get(controller, None)
    return {name: sub.origins[0].depth for sub, name, _ in fragment.subfragments}


def test_the_controller_is_built_from_the_contract():
    controller = Controller(SMALL)
    fifos = _fifo_depths(controller)
    assert list(ENGINES) == [engine.name.lower() for engine in Engine]
    assert [opcodes for opcodes, _ in ENGINES.values()] == list(ENGINE_OPCODES.values())
    assert SMALL.queue_depth == QUEUE_DEPTH == 2
    shallow = _fifo_depths(Controller(dataclasses.replace(SMALL, queue_depth=1)))
    for name in ENGINES:
        assert fifos[f"{name}_queue"] == QUEUE_DEPTH and shallow[f"{name}_queue"] == 1
        assert fifos[f"{name}_pending"] == PENDING_DEPTH
    text = rtlil.convert(controller)
    widths = re.findall(r"wire width (\d+) (?:\S+ )*\\tokens_\d_\d\n", text)
    assert widths and set(widths) == {str(TOKEN_BITS)}
    # Each counter's room for a push: its next value with and without a take below the limit.
    limits = re.findall(rf"cell \$lt \S+\n(?:\s*parameter .*\n)*\s*connect \\A \S+ "
                        rf"\[{TOKEN_BITS - 1}:0\]\n\s*connect \\B {TOKEN_BITS}'([01]+)", text)
    assert len(limits) == 2 * 2 * (len(Engine) - 1)
    assert {int(bits, 2) for bits in limits} == {TOKEN_LIMIT}


def test_the_fuzz_model_uses_the_hardware_limits():
    from tpugen.sim import fuzz
    assert fuzz.TOKEN_LIMIT == TOKEN_LIMIT == 247


def test_header_fields_come_from_the_layout():
    assert set(OPCODE_ENGINE) == set(Opcode) - {Opcode.END}
    for opcode in Opcode:
        raw = encode(opcode)
        assert opcode_of(raw) == opcode and raw[0] & ~OPCODE_MASK == 0
    assert opcode_of(bytes(64)) is None and opcode_of(UNKNOWN_INSTRUCTION) is None
    for flag in TOKEN_FLAGS:
        raw = encode(Opcode.MATMUL, header=Deps(**{flag: True}).fields())
        assert int.from_bytes(raw, "little") & ~OPCODE_MASK == 1 << token_flag_bit(flag)
        assert Header[flag].width == 1


# Copies of contract facts that have been written out before; each pattern names what replaces it.
COPIES = {
    r"\bOp\([0-9]+,": "Op(Engine.LOAD, ...)",
    r"engine: int\b": "engine: Engine",
    r"\(\"load\", \"execute\", \"store\"\)": "arch.Engine",
    r"\b_?(?:PENDING_DEPTH|TOKEN_BITS|TOKEN_LIMIT) = |\b_?QUEUE_DEPTH = 2\b": "arch",
    r"st\.integers\(4, 7\)": "arch.token_flag_bit",
    r"raw\[0\] & ": "arch.opcode_of",
    r"64 // beat": "isa.INSTRUCTION_BYTES",
    r"/ 256\)": "arch.SOFTMAX_OUT_FRAC",
    r"\bstatus & [0-9]": "register(\"STATUS\").fields_of",
    r"\"IRQ_STATUS\"\)?(?:\.offset)?, 0b": "register(\"IRQ_STATUS\").mask",
    r"read_registers\(.*, (?:[2-9]|[1-9][0-9]+)\)": "registers.register_span",
    r"CRC_POLYNOMIAL|_crc8_": "wire.CRC",
    r"ENGINES = \{Opcode": "arch.OPCODE_ENGINE",
    r"\b2 \*\* 8 - 1\b": "arch.TOKEN_BITS",
    r"\"(?:STATUS|IRQ_STATUS|CONTROL)\"\)? ?(?:==|,) 0b": "register(name).value(field=1)",
    r"\(0b01 if ": "register(\"IRQ_STATUS\").value",
    r"bytes\(\[0x0F\]\)": "sim.testbench.UNKNOWN_INSTRUCTION",
}
CONTRACT = {"tpugen/arch.py", "tpugen/isa.py", "tpugen/registers.py", "tpugen/wire.py",
            "tests/test_arch.py"}


RUNTIME_ONLY = {r"read_registers\(.*, (?:[2-9]|[1-9][0-9]+)\)"}
"""Patterns not checked in tests/ (the link tests read any number of words on purpose)."""


def _random_init(layout, rng):
    """A mapping (most fields) or a list (every element) for ``layout``, some values past
    their field's width."""
    def value(shape):
        if isinstance(shape, data.Layout):
            return _random_init(shape, rng)
        if isinstance(shape, enum.EnumMeta):
            return rng.choice(list(shape))
        width = Shape.cast(shape).width
        return rng.randrange(-2 ** width, 2 ** (width + 1))
    if isinstance(layout, data.ArrayLayout):
        return [value(field.shape) for _, field in layout]
    return {key: value(field.shape) for key, field in layout if rng.random() < 0.8}


def test_pack_is_amaranths_const():
    """`isa.pack` (the compilers' fast encoder) gives the bits of ``layout.const(init)`` for
    every instruction layout, with fields left out and values out of range."""
    rng = random.Random(5)
    layouts = {instruction_layout(op) for op in Opcode} | {instruction_layout(Opcode.LOAD, True)}
    for layout in layouts:
        for _ in range(50):
            init = _random_init(layout, rng)
            assert pack(layout, init) == layout.const(init).as_bits(), (layout, init)


def test_no_copy_of_the_contract():
    found = []
    for folder in ("tpugen", "hdl", "sim", "firmware", "fpga", "tests"):
        patterns = {pattern: use for pattern, use in COPIES.items()
                    if folder != "tests" or pattern not in RUNTIME_ONLY}
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in CONTRACT:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{name}:{number}: {line.strip()} (use {use})"
                          for pattern, use in patterns.items() if re.search(pattern, line)]
    assert not found, "\n".join(found)


def _loaded_after(modules, watched):
    """The modules of ``watched`` (dotted prefixes) that importing ``modules`` loads, in a
    fresh interpreter."""
    code = (f"import sys, {', '.join(modules)}; "
            f"print(sorted(m for m in sys.modules if m.startswith({tuple(watched)!r})))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return run.stdout.strip()


def test_the_runtime_loads_neither_the_hdl_nor_hypothesis():
    runtime = ["tpugen.firmware", "tpugen.firmware.link", "tpugen.firmware.c_header"]
    assert _loaded_after(runtime, ["tpugen.hdl", "tpugen.sim", "hypothesis"]) == "[]"


def test_the_fuzz_model_needs_no_hypothesis():
    assert _loaded_after(["tpugen.sim.fuzz_model"], ["hypothesis"]) == "[]"


def test_the_simulation_backend_loads_no_verification_code():
    """Every module of sim/ is either backend or verification (`tpugen.sim`); the runtime,
    the CLI, the demo, the benchmarks and the backend load none of the verification modules
    (nor hypothesis)."""
    from tpugen import sim
    modules = {path.stem for path in (ROOT / "sim").glob("*.py")} - {"__init__"}
    assert sorted(sim.BACKEND + sim.VERIFICATION) == sorted(modules)
    product = ["tpugen.firmware", "tpugen.cli", "tpugen.bench", "tpugen.demo"]
    verification = [f"tpugen.sim.{name}" for name in sim.VERIFICATION]
    assert _loaded_after(product + [f"tpugen.sim.{name}" for name in sim.BACKEND],
                         verification + ["hypothesis"]) == "[]"
    assert _loaded_after(["tpugen.sim.tb_core"], verification) != "[]"  # the check sees them


PACKAGES = {"hdl": "tpugen.hdl", "firmware": "tpugen.firmware"}
"""Folder of the repository -> the package it is installed as (pyproject.toml)."""


def _imports(path, package, module_level_only):
    """(line, absolute module name) of every import in ``path`` (a module of ``package``);
    with ``module_level_only``, those that run at import time (not inside a function)."""
    tree = ast.parse(path.read_text())
    nodes = []
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            nodes.append(node)
        if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        pending += list(ast.iter_child_nodes(node))
    found = []
    for node in sorted(nodes, key=lambda node: node.lineno):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
        else:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _import_violations(folder, forbidden, module_level_only):
    package = PACKAGES[folder]
    return [f"{folder}/{path.name}:{line}: imports {module}"
            for path in sorted((ROOT / folder).glob("*.py"))
            for line, module in _imports(path, package, module_level_only)
            if any(module == f or module.startswith(f + ".") for f in forbidden)]


def test_imports_flow_one_way():
    """hdl/ imports neither sim/ nor firmware/, and firmware/ does not import sim/, not even
    inside a function: `SimDevice` is sim/'s (sim/ uses the runtime, never the reverse)."""
    assert _import_violations("hdl", ["tpugen.sim", "tpugen.firmware"], False) == []
    assert _import_violations("firmware", ["tpugen.sim"], False) == []
    hdl = [f"tpugen.hdl.{path.stem}" for path in sorted((ROOT / "hdl").glob("*.py"))
           if path.stem != "__init__"]
    assert _loaded_after(hdl, ["tpugen.sim", "tpugen.firmware"]) == "[]"


def test_the_import_check_sees_a_violation(tmp_path):
    """The checker above finds relative and absolute imports, in functions too."""
    module = tmp_path / "m.py"
    module.write_text("from ..sim import golden\nimport tpugen.firmware.link\n"
                      "def f():\n    from ..firmware.device import SimDevice\n")
    assert [name for _, name in _imports(module, "tpugen.hdl", False)] == [
        "tpugen.sim.golden", "tpugen.firmware.link", "tpugen.firmware.device.SimDevice"]
    assert len(_imports(module, "tpugen.hdl", True)) == 2
