"""The RTLIL emitter change (`hdl.emitter.memories_start_at_zero`) applies only where it is used."""
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import memory

from tpugen import CoreConfig
from tpugen.hdl.emitter import memories_start_at_zero
from tpugen.hdl.generate import generate_verilog

ORIGINAL = rtlil.ModuleEmitter.emit_memory


def _has_init(init):
    """Whether the RTLIL of a memory with ``init`` initializes it."""
    m = Module()
    m.submodules.ram = ram = memory.Memory(shape=8, depth=4, init=init)
    port = ram.read_port()
    return "$meminit" in rtlil.convert(m, ports=[port.addr, port.data])


def test_other_designs_in_the_process_keep_their_memory_init():
    generate_verilog(CoreConfig(rows=2, cols=2, scratchpad_kib=1, accumulator_kib=1,
                                axi_data_width=32), "systolic_array")
    assert rtlil.ModuleEmitter.emit_memory is ORIGINAL
    assert _has_init([0, 0, 0, 0])


def test_inside_the_block_zero_memories_have_no_init():
    with memories_start_at_zero():
        assert not _has_init([0, 0, 0, 0])
        assert _has_init([1, 2, 3, 4])
    assert rtlil.ModuleEmitter.emit_memory is ORIGINAL
    assert _has_init([0, 0, 0, 0])
