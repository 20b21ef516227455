"""CoreConfig validation, JSON round trip, presets, and the generate command."""
import json
import re

import pytest

from tpugen import PRESETS, CoreConfig
from tpugen.cli import main


@pytest.mark.parametrize("field,value", [
    ("rows", 0), ("rows", 65), ("rows", 2.0), ("rows", True), ("cols", 0), ("cols", 100),
    ("data_width", 4), ("acc_width", 16), ("dataflow", "os"), ("scratchpad_kib", 3),
    ("scratchpad_kib", 2048), ("accumulator_kib", 0), ("axi_data_width", 48),
    ("descriptor_dims", 1), ("descriptor_dims", 5), ("descriptor_dims", True),
    ("descriptor_dims", 3.0), ("address_width", 15), ("address_width", 33),
    ("address_width", True), ("address_width", 20.0),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"CoreConfig\.{field}="):
        CoreConfig(**{field: value})


def test_the_softmax_unit_needs_the_epilogue_multiplier():
    # Attention's O / l is the store epilogue's multiply by NORMALIZE's row scales.
    with pytest.raises(ValueError, match=r"CoreConfig\.epilogue_multiplier=False is invalid "
                                         r"with softmax=True"):
        CoreConfig(epilogue_multiplier=False)
    assert not CoreConfig(softmax=False, epilogue_multiplier=False).softmax


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_json_round_trip(name):
    config = PRESETS[name]
    assert CoreConfig.from_json(config.to_json()) == config


def test_presets():
    assert (PRESETS["tiny"].rows, PRESETS["tiny"].cols) == (2, 2)
    assert (PRESETS["default"].rows, PRESETS["default"].cols) == (8, 8)
    assert (PRESETS["large"].rows, PRESETS["large"].cols) == (16, 16)
    assert (PRESETS["default"].descriptor_dims, PRESETS["micro"].descriptor_dims) == (4, 2)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        CoreConfig.preset("huge")


def test_from_json_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown CoreConfig field"):
        CoreConfig.from_json(json.dumps({"rows": 4, "colums": 4}))


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        CoreConfig().rows = 4


def test_generate_command(tmp_path):
    config = tmp_path / "core.json"
    config.write_text(CoreConfig(rows=2, cols=3).to_json())
    out = tmp_path / "array.v"
    assert main(["generate", "--config", str(config), "--cols", "4", "--design", "systolic_array",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "module systolic_array" in text
    assert "input [18:0] acts__payload" in text  # 2 x 9-bit activation + last
    assert "output [128:0] results__payload" in text  # 4 x int32 + last


def test_generate_rejects_bad_rows(tmp_path, capsys):
    assert main(["generate", "--rows", "0", "-o", str(tmp_path / "x.v")]) == 2
    assert "CoreConfig.rows=0" in capsys.readouterr().err


def test_generate_tpu_core_ports_bind_by_prefix(tmp_path):
    out = tmp_path / "core.v"
    assert main(["generate", "--preset", "tiny", "-o", str(out)]) == 0
    text = out.read_text()
    assert "module tpu_core(" in text
    for port in ("input clk;", "input rst;", "output irq;", "output [31:0] m_axi_araddr;",
                 "output [3:0] m_axi_wstrb;", "input [31:0] m_axi_rdata;", "output m_axi_bready;",
                 "input [11:0] s_axil_awaddr;", "output [31:0] s_axil_rdata;"):
        assert port in text, port
    tops = re.findall(r"\(\* top = +1 +\*\)\n(?:\(\*[^\n]*\*\)\n)*module (\w+)\(", text)
    assert tops == ["tpu_core"], f"modules marked top: {tops} (yosys picks the first)"
    assert text.count("(* top") == 1


def test_c_header_compiles_and_matches_the_config(tmp_path):
    import subprocess

    out, header = tmp_path / "core.v", tmp_path / "tpu_params.h"
    assert main(["generate", "--preset", "tiny", "--design", "systolic_array", "-o", str(out),
                 "--header", str(header)]) == 0
    program = tmp_path / "check.c"
    program.write_text(
        '#include "tpu_params.h"\n'
        "_Static_assert(TPU_ROWS == 2 && TPU_COLS == 2, \"geometry\");\n"
        "_Static_assert(TPU_REG_CONTROL == 0x020u, \"CONTROL offset\");\n"
        "_Static_assert(TPU_CONTROL_SOFT_RESET_MASK == 0x2u, \"soft reset bit\");\n"
        "_Static_assert(TPU_ERROR_WATCHDOG == 7u && TPU_OP_MATMUL == 2u, \"codes\");\n"
        "_Static_assert(TPU_ID_VALUE == 0x54505547u, \"ID\");\n"
        "int main(void) { return 0; }\n")
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(tmp_path), "-o",
                    str(tmp_path / "check"), str(program)], check=True)


def test_isa_markdown_is_current():
    from pathlib import Path

    from tpugen.isa_doc import isa_markdown

    doc = Path(__file__).parent.parent / "docs" / "isa.md"
    assert doc.read_text() == isa_markdown(), "run: python -m tpugen.isa_doc > docs/isa.md"
    assert "| `tensor.dims[i].stride` | 175:144 + 80i | 32 | unsigned |" in doc.read_text()


def test_one_config_check_everywhere():
    """Components and devices refuse what is not a CoreConfig with the same ValueError."""
    from tpugen.config import check_config
    from tpugen.sim import SimDevice
    from tpugen.hdl.csr import ControlRegisters

    for make in (check_config, SimDevice, ControlRegisters):
        with pytest.raises(ValueError, match=r"config=\{'rows': 8\} is invalid: allowed a CoreConfig"):
            make({"rows": 8})
