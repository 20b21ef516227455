"""amaranth.sim proof of `hdl.pipeline.SRAM_ATTRS` (``no_rw_check``): while the whole core runs
token-ordered programs, no read port of an SRAM that is not transparent reads the row written
in the same cycle (on an FPGA that read would return an undefined value)."""
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.hdl import Fragment, Module
from amaranth.hdl._mem import MemoryInstance
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.firmware.device import Device
from tpugen.hdl.axi import axi_lite_signature, axi_read_signature, axi_write_signature, \
    connect_by_name
from tpugen.hdl.axi_memory import AxiMemory
from tpugen.hdl.core import TpuCore
from tpugen.hdl.pipeline import SRAM_ATTRS
from tpugen.registers import ADDR_WIDTH
from tpugen.run_protocol import drive_async, run_program
from tpugen.firmware.epilogue import apply_epilogue
from tpugen.sim.attention_model import attention_float
from tpugen.sim.golden import conv2d_int32, matmul_int32
from tpugen.sim.pysim_axil import AxiLiteMaster
from tpugen.sim.testbench import ForFamily, ReadWriteWatch

MICRO = CoreConfig(rows=4, cols=4, scratchpad_kib=1, accumulator_kib=1, axi_data_width=32,
                   softmax=False, im2col=False, counters="basic", windows=2, queue_depth=1,
                   descriptor_dims=3, counters_in_ram=True)
FULL = CoreConfig(rows=4, cols=4, scratchpad_kib=2, accumulator_kib=2, axi_data_width=32)
"""Every port of the full core: the softmax unit's on the accumulator and the probability
buffer, the im2col loads, the pooled and accumulating paths."""
MEMORY_SIZE = 1 << 15


def _srams(fragment):
    """The `MemoryInstance` of every SRAM (``SRAM_ATTRS``) under ``fragment``."""
    found = [fragment] if (isinstance(fragment, MemoryInstance)
                           and SRAM_ATTRS.items() <= fragment._attrs.items()) else []
    for sub, _, _ in fragment.subfragments:
        found += _srams(sub)
    return found


def _storage(fragment, depth):
    """The `MemoryInstance` of ``depth`` words under ``fragment``: the system memory."""
    if isinstance(fragment, MemoryInstance) and fragment._data.depth == depth:
        return fragment
    for sub, _, _ in fragment.subfragments:
        if (found := _storage(sub, depth)) is not None:
            return found
    return None


class _PysimDevice(Device):
    """The core with its memory in amaranth.sim, one simulation per run; every run checks
    each SRAM's ports each cycle (``collisions``)."""

    def __init__(self, config, family=None):
        super().__init__(config, MEMORY_SIZE)
        self.family = family  # elaborated as for that FPGA (on an iCE40: block RAM lane params)
        self._transport = self  # only `_execute` runs programs
        self.collisions = []
        self.overlaps = 0  # cycles with a read beside a write

    def _execute(self, image, timeout_cycles=200_000):
        core = TpuCore(self.config)
        width = self.config.axi_data_width
        memory = AxiMemory(width, MEMORY_SIZE, dual_port=True)
        top = Module()
        top.submodules.core, top.submodules.memory = core, memory
        for signature in (axi_read_signature(width), axi_write_signature(width)):
            connect_by_name(top, core, "m_axi_", memory, "s_axi_", signature)
        fragment = Fragment.get(top if self.family is None else ForFamily(top, self.family), None)
        beat = width // 8
        srams, storage = _srams(fragment), _storage(fragment, MEMORY_SIZE // beat)
        # The scratchpad, the accumulator; the probabilities and the row scales; the W beats'
        # and the load plan's FIFOs; the counters' words; on an iCE40 the lane parameters' bank.
        config = self.config
        assert len(srams) == (2 + 2 * config.softmax + 2 + config.counters_in_ram
                              + (self.family == "ice40")), len(srams)
        image_bytes = bytearray(MEMORY_SIZE)
        for address, data in [*image.inputs, (image.program_address, image.program)]:
            image_bytes[address:address + len(data)] = data
        words = np.frombuffer(bytes(image_bytes), dtype=f"<u{beat}")
        bus = SimpleNamespace(**{name: getattr(core, f"s_axil_{name}")
                                 for name in axi_lite_signature(ADDR_WIDTH).members})
        master = AxiLiteMaster(bus)
        outputs, run = [], {}

        class Link:
            async def write_register(self, offset, value):
                await master.write(ctx, offset, value)

            async def read_registers(self, offset, count):
                return [(await master.read(ctx, offset + 4 * i))[0] for i in range(count)]

            async def wait_interrupt(self, timeout):
                for _ in range(timeout):
                    if ctx.get(core.irq):
                        return True
                    await ctx.tick()
                return False

        async def host(context):
            nonlocal ctx
            ctx = context
            for i in np.flatnonzero(words):
                ctx.set(storage._data[int(i)], int(words[i]))
            run["outcome"] = await drive_async(Link(), run_program(
                image.windows, image.program_address, image.program_length, timeout_cycles))
            got = b"".join(int(ctx.get(storage._data[i])).to_bytes(beat, "little")
                           for i in range(MEMORY_SIZE // beat))
            outputs.extend(got[address:address + size] for address, size in image.outputs)

        watch = ReadWriteWatch((sram._data.depth, read._en, read._addr, write._en, write._addr)
                               for sram in srams for read in sram._read_ports
                               for w, write in enumerate(sram._write_ports)
                               if w not in read._transparent_for)

        ctx = None
        sim = Simulator(fragment)
        sim.add_clock(1e-6)
        sim.add_testbench(host)
        sim.add_process(watch.watch)
        sim.run()  # until `host` returns (the watch runs in the background)
        self.overlaps += watch.overlaps
        self.collisions += watch.collisions
        assert run["outcome"].done, run["outcome"]
        return outputs


def _run(device, workload, rng):
    """Run ``workload`` on ``device`` and check its result (bit-exact, attention within the
    2e-2 error budget)."""
    if workload == "matmul":
        a = rng.integers(-128, 128, (12, 20), dtype=np.int8)
        b = rng.integers(-128, 128, (20, 10), dtype=np.int8)
        np.testing.assert_array_equal(device.matmul(a, b), matmul_int32(a, b))
    elif workload == "matmul_bias":  # PARAMS into the lane parameters, then the epilogue
        a = rng.integers(-128, 128, (9, 6), dtype=np.int8)
        b = rng.integers(-128, 128, (6, 7), dtype=np.int8)
        bias = rng.integers(-1000, 1000, 7, dtype=np.int32)
        np.testing.assert_array_equal(device.matmul(a, b, bias=bias, relu=True),
                                      apply_epilogue(matmul_int32(a, b), 1, bias=bias, relu=True))
    elif workload == "conv2d":
        x = rng.integers(-128, 128, (1, 8, 5, 5), dtype=np.int8)
        w = rng.integers(-128, 128, (6, 8, 1, 1), dtype=np.int8)
        np.testing.assert_array_equal(device.conv2d(x, w), conv2d_int32(x, w))
    elif workload == "conv2d_pool":  # im2col, accumulation over K tiles, bias, ReLU, 2x2 pool
        x = rng.integers(-128, 128, (1, 3, 6, 6), dtype=np.int8)
        w = rng.integers(-128, 128, (5, 3, 3, 3), dtype=np.int8)
        bias = rng.integers(-1000, 1000, 5, dtype=np.int32)
        expected = apply_epilogue(conv2d_int32(x, w, padding=1), 1, bias=bias, relu=True)
        expected = expected.reshape(1, 5, 3, 2, 3, 2).max(axis=(3, 5))
        np.testing.assert_array_equal(
            device.conv2d(x, w, padding=1, bias=bias, relu=True, pool=True), expected)
    else:  # causal attention: the softmax unit's reads and rescales of S, O and its state
        q, k, v = (rng.standard_normal((9, 8)).astype(np.float32) for _ in range(3))
        got = device.attention(q, k, v, causal=True)
        want = attention_float(q[None], k[None], v[None], causal=True)[0]
        assert np.linalg.norm(got - want) <= 2e-2 * np.linalg.norm(want)


@pytest.mark.parametrize("config,workload,family", [
    (MICRO, "matmul", None), (MICRO, "conv2d", None), (MICRO, "matmul_bias", "ice40"),
    (FULL, "matmul", None), (FULL, "conv2d_pool", None), (FULL, "attention", None)])
def test_no_sram_port_reads_the_row_written_in_the_same_cycle(config, workload, family):
    device = _PysimDevice(config, family)
    _run(device, workload, np.random.default_rng(16))
    assert device.overlaps > 0
    assert device.collisions == []
