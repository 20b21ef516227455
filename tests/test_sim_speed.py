"""The fast simulation path: `SimSystem` (the memory inside the Verilator model) runs matmuls
bit-exactly in the cycles `SimDevice` counts, and serves the whole runtime API with
``SimDevice(memory="rtl")``; its read delay line keeps every beat."""
import ctypes
import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth.sim import Simulator

from tpugen import CoreConfig
from tpugen.cli import main
from tpugen.firmware.matmul import matmul_weights
from tpugen.sim import SimDevice
from tpugen.hdl.sim_system import AxiReadDelay, SimSystem
from tpugen.sim.attention_model import attention_int8_model
from tpugen.sim.golden import conv2d_int32, matmul_int32
from tpugen.sim.speed import measure_sim_speed

CONFIG = CoreConfig(rows=8, cols=8)
DRIVER = Path(__file__).parent.parent / "firmware" / "c"


def test_matmul_is_exact_in_the_cycles_of_sim_device():
    m, k, n = 9, 11, 6
    fast = measure_sim_speed(CONFIG, m, k, n, seed=4)  # the testbench checks C against numpy
    rng = np.random.default_rng(4)
    with SimDevice(CONFIG, memory="axiram") as dev:
        dev.matmul(rng.integers(-128, 128, (m, k), dtype=np.int8),
                   rng.integers(-128, 128, (k, n), dtype=np.int8))
    stats = dev.stats
    assert (fast["macs"], fast["bytes_read"], fast["bytes_written"]) == \
        (stats.issued_macs, stats.bytes_read, stats.bytes_written)
    # The two memories time bursts and responses differently (both take bursts back to back).
    assert abs(fast["cycles"] - stats.cycles) <= 0.2 * stats.cycles, (fast["cycles"], stats.cycles)
    assert fast["cycles"] <= fast["sim_cycles"] <= fast["cycles"] + 20


def _int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def test_sim_device_with_the_memory_in_the_model():
    rng = np.random.default_rng(8)
    with SimDevice(CONFIG, memory="rtl", memory_size=1 << 20) as dev:  # the model above
        for m, k, n in [(1, 1, 1), (67, 41, 3), (9, 130, 17)]:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            assert np.array_equal(dev.matmul(a, b), matmul_int32(a, b)), (m, k, n)
        for x_shape, w_shape, stride, padding in [((1, 3, 7, 6), (5, 3, 3, 3), 1, 1),
                                                  ((2, 5, 9, 8), (3, 5, 3, 3), 2, 0)]:
            x, w = _int8(rng, x_shape), _int8(rng, w_shape)
            assert np.array_equal(dev.conv2d(x, w, stride=stride, padding=padding),
                                  conv2d_int32(x, w, stride, padding, 1)), x_shape
        q, k, v = _int8(rng, (2, 9, 12)), _int8(rng, (2, 21, 12)), _int8(rng, (2, 21, 12))
        assert np.array_equal(dev.attention_int8(q, k, v, 12, causal=True),
                              attention_int8_model(CONFIG, q, k, v, 12, causal=True))
        # Byte writes inside words keep the words' other bytes.
        dev._transport.write_memory(0x1000, bytes(range(1, 33)))
        dev._transport.write_memory(0x1003, b"\xaa" * 13)
        expected = bytes(range(1, 4)) + b"\xaa" * 13 + bytes(range(17, 33))
        assert dev._transport.read_memory(0x1000, 32) == expected
        assert dev._transport.read_memory(0x1005, 3) == b"\xaa" * 3


@pytest.mark.parametrize("options,message", [
    ({"memory": "dram"}, "memory='dram' is invalid"),
    ({"memory": "rtl", "backpressure": True}, "backpressure needs"),
    ({"memory": "rtl", "memory_size": 3 << 20}, "power of two"),
])
def test_sim_device_memory_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        SimDevice(CONFIG, **options)


@pytest.mark.parametrize("latency", [1, 7])
def test_read_delay_keeps_every_beat_in_order_and_delays_it_exactly(latency):
    dut = AxiReadDelay(64, latency)
    rng = random.Random(latency)
    sent, received = [], []

    async def bench(ctx):
        ctx.set(dut.s_axi_araddr, 0x1234)
        assert ctx.get(dut.m_axi_araddr) == 0x1234
        for cycle in range(600):
            stalls = cycle >= 300  # the master takes every beat at first, then some
            beat = len(sent)
            ctx.set(dut.m_axi_rvalid, rng.random() < 0.7)
            ctx.set(dut.m_axi_rdata, beat * 0x0101_0101_0101)
            ctx.set(dut.m_axi_rid, beat % 16)
            ctx.set(dut.m_axi_rlast, beat % 3 == 0)
            rready = not stalls or rng.random() < 0.5
            ctx.set(dut.s_axi_rready, rready)
            if ctx.get(dut.m_axi_rvalid) and ctx.get(dut.m_axi_rready):
                sent.append((cycle, beat * 0x0101_0101_0101, beat % 16, beat % 3 == 0))
            if ctx.get(dut.s_axi_rvalid) and rready:
                received.append((cycle, ctx.get(dut.s_axi_rdata), ctx.get(dut.s_axi_rid),
                                 bool(ctx.get(dut.s_axi_rlast))))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert [beat[1:] for beat in received] == [beat[1:] for beat in sent[:len(received)]]
    assert len(sent) - len(received) <= latency
    assert all(got[0] == put[0] + latency for put, got in zip(sent, received) if got[0] < 300)
    assert len(received) > 300


@pytest.mark.parametrize("build, message", [
    (lambda: SimSystem(CONFIG, read_latency=-1), "read_latency=-1 is invalid"),
    (lambda: AxiReadDelay(64, 0), "latency=0 is invalid"),
])
def test_read_latency_must_be_a_count(build, message, refuses):
    refuses(build, message)


JOB_SHIM = r"""
#include "tpu_job.h"

static struct tpu device;

int job_run(tpu_read_fn read, tpu_write_fn write, void (*irq_wait)(void *))
{
    struct tpu_wait wait;
    enum tpu_result result;

    wait.max_polls = 0;
    wait.irq_wait = irq_wait;
    wait.context = NULL;
    tpu_open_io(&device, read, write, NULL);
    result = tpu_init(&device);
    return result != TPU_OK ? -(int)result : (int)tpu_job_run(&device, &wait);
}
"""


class _Segment(ctypes.Structure):
    _fields_ = [("address", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("data", ctypes.POINTER(ctypes.c_uint8))]


def _segments(lib, name, count):
    return [(s.address, bytes(s.data[:s.size]))
            for s in (_Segment * count).in_dll(lib, name)]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found")
def test_a_compiled_job_runs_through_the_c_driver(tmp_path):
    """`tpugen compile` output built with firmware/c/tpu.c runs on the model above, bit-exact:
    the C driver's register accesses go through SimDevice's transport."""
    job = tmp_path / "job"
    assert main(["compile", "matmul", "--m", "37", "--k", "29", "--n", "11", "--seed", "3",
                 "--memory-size", str(1 << 20), "-o", str(job)]) == 0
    (job / "shim.c").write_text(JOB_SHIM)
    library = tmp_path / "libjob.so"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-shared",
                    "-fPIC", "-I", str(job), "-I", str(DRIVER), "-o", str(library),
                    str(DRIVER / "tpu.c"), str(job / "tpu_job.c"), str(job / "shim.c")],
                   check=True)
    lib = ctypes.CDLL(str(library))
    layout = json.loads((job / "job.json").read_text())
    inputs = _segments(lib, "tpu_job_inputs", 1 + len(layout["inputs"]))
    (out_address, expected), = _segments(lib, "tpu_job_outputs", 1)
    files = [layout["program"]["file"]] + [entry["file"] for entry in layout["inputs"]]
    assert [data for _, data in inputs] == [(job / name).read_bytes() for name in files]
    a = np.frombuffer(inputs[1][1], np.int8).reshape(37, 29)
    packed = np.frombuffer(inputs[2][1], np.int8)  # B tile-packed: 29 x 8, then 29 x 3
    b = np.hstack([packed[:29 * 8].reshape(29, 8), packed[29 * 8:].reshape(29, 3)])
    assert np.array_equal(matmul_weights(CONFIG, b), packed)
    assert expected == matmul_int32(a, b).astype("<i4").tobytes()

    memory = (ctypes.c_uint8 * (1 << 20))()
    lib.tpu_job_copy_in(memory)
    assert all(bytes(memory[address:address + len(data)]) == data for address, data in inputs)
    memory[out_address:out_address + len(expected)] = expected
    assert lib.tpu_job_check(memory) == 0
    memory[out_address + 5] ^= 1
    assert lib.tpu_job_check(memory) == 1

    read_fn = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32)
    write_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32)
    irq_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    lib.job_run.argtypes = [read_fn, write_fn, irq_fn]
    with SimDevice(CONFIG, memory="rtl", memory_size=1 << 20) as dev:  # the model above
        link = dev._transport
        for address, data in inputs:
            link.write_memory(address, data)
        result = lib.job_run(read_fn(lambda _, offset: link.read_registers(offset, 1)[0]),
                             write_fn(lambda _, offset, value: link.write_register(offset, value)),
                             irq_fn(lambda _: link.wait_interrupt(1_000_000)))
        got = link.read_memory(out_address, len(expected))
    assert result == 0, f"tpu_job_run: enum tpu_result {result}"
    assert got == expected


def test_packed_weights_split_ends_and_transposed_matmuls_are_exact():
    """Device.matmul writes B tile-packed, splits the first and last panels where the cost model
    says so and runs a skinny M transposed: all bit-exact, on awkward shapes (1 wide, K = 1,
    N = 1, not multiples of the array), with per-tensor and per-channel epilogues, and resident."""
    from tpugen.firmware.gemm_plan import plan_gemm
    from tpugen.firmware.matmul import transposed_is_faster
    from tpugen.sim.golden import apply_epilogue

    def plan(m, k, n):
        return plan_gemm(CONFIG, m, k, n, b_contiguous=True, split_ends=True)

    rng = np.random.default_rng(20)
    shapes = [(1, 1, 1), (1, 29, 1), (13, 1, 9), (5, 9, 1), (67, 41, 3), (96, 40, 33),
              (150, 96, 33), (77, 17, 20), (16, 96, 70), (8, 200, 50)]
    # (77, 17, 20): one K chunk, so the first output tile is stored by its row pieces too.
    assert [s for s in shapes if plan(*s).split_ends] == [(150, 96, 33), (77, 17, 20)]
    assert [s for s in shapes if transposed_is_faster(CONFIG, *s)] == [
        (13, 1, 9), (5, 9, 1), (16, 96, 70), (8, 200, 50)]
    with SimDevice(CONFIG, memory="rtl", memory_size=1 << 20) as dev:  # the model above
        for m, k, n in shapes:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            c = dev.matmul(a, b)
            assert c.flags.c_contiguous and np.array_equal(c, matmul_int32(a, b)), (m, k, n)
            assert dev.stats.bytes_written == 4 * m * n
        a, b = _int8(rng, (16, 96)), _int8(rng, (96, 70))
        for options in ({"bias": -1000, "requant": (3, 9), "relu": True},  # transposed
                        {"bias": rng.integers(-2000, 2000, 70), "requant": (3, 9)}):  # not
            expected = apply_epilogue(matmul_int32(a, b), channel_axis=1, **options)
            assert np.array_equal(dev.matmul(a, b, **options), expected), options
        a, b = _int8(rng, (7, 45)), _int8(rng, (45, 19))
        call = dev.prepare_matmul(a.shape, b)
        dev.launch(call, a)
        assert np.array_equal(dev.download(call.output, np.int32, (7, 19)), matmul_int32(a, b))
