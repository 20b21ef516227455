"""A cocotb testbench of a generated `tpu_core`, as a user would write one: cocotbext-axi's
AxiRam as the core's memory and AxiLiteMaster on its registers, one int8 matmul compiled by
tpugen's runtime, run through the registers and checked against numpy.

Run it with ``pytest examples/matmul_tb`` (see test_matmul_tb.py), or for a core of your own
configuration: ``tpugen sim --preset tiny --test-module matmul_tb`` from this folder.
"""
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from tpugen import CoreConfig
from tpugen.firmware.device import fit_windows
from tpugen.firmware.matmul import compile_matmul
from tpugen.registers import register, window_writes
from tpugen.isa import INSTRUCTION_BYTES, ErrorCode

PROGRAM, A, B, C = 0x0000, 0x1000, 0x2000, 0x3000
"""Where the program and the operands live in the core's memory."""


async def write_register(lite, name, value):
    await lite.write_dword(register(name).offset, value)


async def read_register(lite, name):
    return await lite.read_dword(register(name).offset)


@cocotb.test()
async def matmul_through_the_registers(dut):
    config = CoreConfig.from_json(os.environ["TPUGEN_CONFIG"])
    memory = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=1 << 16)
    lite = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0

    # The registers identify the core that was generated.
    config0 = register("CONFIG0").fields_of(await read_register(lite, "CONFIG0"))
    assert (config0.rows, config0.cols) == (config.rows, config.cols)

    # Operands and program in memory: C (int32, 13 x 7) = A (int8, 13 x 11) @ B (int8, 11 x 7).
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (13, 11), dtype=np.int8)
    b = rng.integers(-128, 128, (11, 7), dtype=np.int8)
    memory.write(A, a.tobytes())
    memory.write(B, b.tobytes())
    program = compile_matmul(config, 13, 11, 7, a_addr=A, b_addr=B, c_addr=C).to_bytes()
    memory.write(PROGRAM, program)

    # The windows the core may touch (merged into as many as the core has, as the runtime
    # does), the program, then START with the interrupt enabled.
    windows = fit_windows([(PROGRAM, 0x3000, True, False), (C, 4 * 13 * 7, False, True)],
                          config.windows)
    for name, value in window_writes(windows):
        await write_register(lite, name, value)
    await write_register(lite, "PROGRAM_BASE", PROGRAM)
    await write_register(lite, "PROGRAM_LENGTH", len(program) // INSTRUCTION_BYTES)
    await write_register(lite, "IRQ_ENABLE", 1)
    await write_register(lite, "CONTROL", register("CONTROL").value(start=1))

    await with_timeout(RisingEdge(dut.irq), 1, "ms")
    assert ErrorCode(await read_register(lite, "ERROR_CODE")) == ErrorCode.NONE
    cycles = await read_register(lite, "CYCLES_LO")
    got = np.frombuffer(memory.read(C, 4 * 13 * 7), dtype="<i4").reshape(13, 7)
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    dut._log.info(f"13x11x7 matmul exact in {cycles} cycles")
