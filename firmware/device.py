"""`Device`: the Python API of a core (compile, lay out, run, read back); `SimDevice` (sim/) and
`BoardDevice` (board.py) open its transport."""
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..arch import SOFTMAX_OUT_FRAC, Engine
from ..config import CoreConfig, check_config
from ..isa import NUM_WINDOWS
from ..registers import counter_names, register
from ..run_protocol import drive, run_program
from .attention import (attention_macs, attention_operands, compile_attention, compile_softmax,
                        plan_attention, quantize_attention, quantize_softmax)
from .epilogue import Epilogue, output_dtype
from .conv2d import (compile_conv2d, conv2d_lowering, conv2d_macs, conv2d_output_shape,
                     conv2d_scratch_bytes, conv2d_weights)
from .matmul import compile_matmul, matmul_weights, transposed_is_faster

__all__ = ["Device", "DeviceError", "PreparedCall", "Resident", "RunImage", "Stats",
           "access_windows", "check_option", "fit_windows", "operand_layout",
           "program_placement", "program_windows"]

_PAGE = 4096


@dataclass(frozen=True)
class Stats:
    """Hardware performance counters of the last call, and the useful work it did."""
    cycles: int
    macs: int
    """The operation's own multiply-accumulates: M*K*N (matmul), N*K*P*Q*C*R*S (conv2d, before
    pooling), 2*d per unmasked query-key pair (attention), 0 (softmax)."""
    issued_macs: int
    """The array's counter: rows * cols per activation vector streamed, partial tiles in full."""
    array_macs: int
    """The array's MACs per cycle: rows * cols."""
    bytes_read: int
    bytes_written: int
    load_busy_cycles: int | None
    """None on a core without busy counters (`CoreConfig.counters="traffic"`), as the other
    two."""
    execute_busy_cycles: int | None
    store_busy_cycles: int | None
    host_epilogue: bool = False
    """Part of the epilogue ran on the host (`Epilogue.on_core`): the requantization on a core
    without the epilogue multiplier (the core stored int32), or the pooling on one without
    it (the core stored every pixel)."""

    @property
    def mac_utilization(self):
        """Useful work: macs / (cycles * rows * cols). A partial tile counts what it computes."""
        return self.macs / max(1, self.cycles * self.array_macs)

    @property
    def array_occupancy(self):
        """issued_macs / (cycles * rows * cols): how busy the array was, useful or not."""
        return self.issued_macs / max(1, self.cycles * self.array_macs)


@dataclass(frozen=True)
class RunImage:
    """One run as memory and registers: ``program`` (instruction bytes, ``program_length``
    instructions) at ``program_address``, the ``inputs`` [(address, bytes)], the ``outputs``
    [(address, size)] and the access ``windows`` [(base, size, readable, writable)]."""
    program: bytes
    program_address: int
    program_length: int
    inputs: list
    outputs: list
    windows: list


class Resident(NamedTuple):
    """A region of device memory that stays across calls: ``size`` bytes at ``address``."""
    address: int
    size: int


@dataclass(frozen=True)
class PreparedCall:
    """A matmul or conv2d resident on the device (`Device.prepare_matmul`,
    `Device.prepare_conv2d`): its program, weights (with the epilogue's parameters in the
    program) and output are written once; `Device.launch` runs it on what ``input`` holds.
    ``uploaded``: the bytes written to prepare it; ``shape``/``dtype``: the output's; ``macs``:
    the useful MACs of one launch; ``scratch``: the weights region ends in a scratch region the
    program writes and reads (`conv2d_scratch_bytes`)."""
    input: Resident
    weights: Resident
    output: Resident
    program: Resident
    program_length: int
    shape: tuple
    dtype: np.dtype
    uploaded: int
    macs: int
    scratch: bool = False

    @property
    def windows(self):
        """The program and the input and weights readable (the weights writable too with a
        ``scratch``), the output writable, nothing else: four windows, which `Device.launch`
        fits to the core's (`fit_windows`)."""
        if self.scratch:
            return program_windows(self.program, [self.input], [self.output],
                                   read_write=[self.weights])
        return program_windows(self.program, [self.input, self.weights], [self.output])


class DeviceError(RuntimeError):
    """The core stopped with an error code (a bug in the firmware or the hardware)."""


def _check_int8(name, array, ndim):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(array).__name__}")
    if array.dtype != np.int8:
        raise TypeError(f"{name} must have dtype int8, not {array.dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, not {array.ndim} (shape {array.shape})")
    if 0 in array.shape:
        raise ValueError(f"{name} has an empty dimension: shape {array.shape}")


def _check_shape(name, shape, ndim):
    if (not isinstance(shape, tuple) or len(shape) != ndim
            or not all(isinstance(d, int) and d > 0 for d in shape)):
        raise ValueError(f"{name}={shape!r} is invalid: allowed a tuple of {ndim} positive ints")


def _check_float(name, array):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(array).__name__}")
    if array.dtype.kind != "f":
        raise TypeError(f"{name} must have a float dtype, not {array.dtype}")
    if 0 in array.shape:
        raise ValueError(f"{name} has an empty dimension: shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} has non-finite values")
    return array


def _check_causal(causal, seq, kv):
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, not {type(causal).__name__}")
    if causal and seq > kv:
        raise ValueError(f"causal attention needs L <= S, not L={seq}, S={kv}")


def _array(raw, dtype, shape):
    """Little-endian bytes read back from the core as a ``dtype`` array of ``shape``."""
    dtype = np.dtype(dtype)
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape).astype(dtype)


def _check_softmax_unit(config, operation):
    if not config.softmax:
        raise ValueError(f"{operation} needs the softmax unit, and the core was generated "
                         "without it (CoreConfig.softmax=False)")


def check_option(name, value, low, high):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} is invalid: allowed an integer in {low}..{high}")


class Device:
    """The runtime of one core: checks arguments, compiles operations to programs, lays out
    memory, runs them through a `Transport` and reads the results back.

    Subclasses open the transport: `SimDevice` (Verilator), `BoardDevice` (a board over UART).
    """

    transposes_matmuls = True
    """`matmul` may run C^T = B^T A^T and transpose on the host where that is clearly faster
    (`transposed_is_faster`, a skinny M); False where the run's memory holds the product
    (`ProgramExport`: the C driver reads C as it is stored)."""

    def __init__(self, config, memory_size):
        check_config(config)
        check_option("memory_size", memory_size, 1 << 14, min(1 << 31, 1 << config.address_width))
        self.config = config
        self.memory_size = memory_size
        self.stats = None
        self._transport = None
        self._resident_floor = memory_size
        """Resident regions are allocated downwards from the top; per-call operands stay below."""

    def matmul(self, a, b, *, bias=None, requant=None, relu=False):
        """int8 (M, K) @ int8 (K, N) -> int32 (M, N), with int32 wrap-around.

        Fused epilogue per output column (see `Epilogue`): ``bias`` (int or (N,) values),
        ``requant=(multiplier, shift)`` (ints or (N,) values; the result is then int8),
        ``relu``. With a per-tensor epilogue a skinny M may run as C^T = B^T A^T
        (`transposes_matmuls`).
        """
        _check_int8("a", a, 2)
        _check_int8("b", b, 2)
        (m, k), n = a.shape, b.shape[1]
        options = (bias, *(requant if isinstance(requant, tuple) else ()))
        per_tensor = all(np.ndim(x) == 0 for x in options)
        if (self.transposes_matmuls and per_tensor and k == b.shape[0]
                and transposed_is_faster(self.config, m, k, n)):
            b_t, a_t = np.ascontiguousarray(b.T), np.ascontiguousarray(a.T)
            c_t = self._call(b_t, *self._matmul(b_t.shape, a_t, bias, requant, relu))
            return np.ascontiguousarray(c_t.T)
        return self._call(a, *self._matmul(a.shape, b, bias, requant, relu))

    def _call(self, x, weights, shape, dtype, compile_, host, macs, scratch=0):
        """Run a lowered matmul or conv2d (see `_matmul`) on input ``x``: its result, channels
        on axis 1. ``scratch``: bytes of a read-write region the program needs after the
        output (``compile_`` takes its address too)."""
        out_bytes = dtype.itemsize * int(np.prod(shape))
        sizes = [out_bytes] + ([scratch] if scratch else [])
        (x_addr, w_addr), (y_addr, *scratch_addr) = self._layout([x.nbytes, weights.nbytes],
                                                                 sizes)
        region = (scratch_addr[0], scratch) if scratch else None
        (y,) = self._run(compile_(x_addr, w_addr, y_addr, *scratch_addr),
                         [(x_addr, x), (w_addr, weights)], [(y_addr, out_bytes)], region)
        self._count(macs)
        return self._finish(_array(y, dtype, shape), host, channel_axis=1)

    def _finish(self, y, host, channel_axis):
        """The core's result ``y`` with the ``host`` part of the epilogue applied (`Stats`
        says so), or ``y`` without one."""
        if host is None:
            return y
        if self.stats is not None:  # None where nothing ran (`ProgramExport`)
            self.stats = replace(self.stats, host_epilogue=True)
        return host.apply(y, channel_axis)

    def _count(self, macs):
        """`stats` of the call that just ran with its useful ``macs``."""
        if self.stats is not None:  # None where nothing ran (`ProgramExport`)
            self.stats = replace(self.stats, macs=macs)

    def _epilogue(self, epilogue):
        """(the core's part of ``epilogue``, the host's): `Epilogue.on_core`."""
        return epilogue.on_core(self.config) if epilogue is not None else (None, None)

    def _matmul(self, a_shape, b, bias, requant, relu):
        """(b as it goes to memory, output shape, dtype, compile(a_addr, b_addr, c_addr), the
        host's part of the epilogue, useful MACs) of `matmul` for an ``a`` of ``a_shape``."""
        _check_int8("b", b, 2)
        if a_shape[1] != b.shape[0]:
            raise ValueError(f"a {a_shape} and b {b.shape}: inner dimensions differ")
        m, k = a_shape
        n = b.shape[1]
        epilogue, host = self._epilogue(Epilogue.from_options(n, bias=bias, requant=requant,
                                                              relu=relu))

        def compile_(a_addr, b_addr, c_addr):
            return compile_matmul(self.config, m, k, n, a_addr=a_addr, b_addr=b_addr,
                                  c_addr=c_addr, epilogue=epilogue, b_layout="tiles")
        return (matmul_weights(self.config, b), (m, n), output_dtype(epilogue), compile_, host,
                m * k * n)

    def conv2d(self, x, w, stride=1, padding=0, dilation=1, *, bias=None, requant=None,
               relu=False, pool=False):
        """int8 NCHW x (N, C, H, W) with int8 w (K, C, R, S) -> int32 (N, K, P, Q).

        Fused epilogue per output channel: ``bias``, ``requant`` and ``relu`` as in `matmul`,
        and ``pool``: 2x2 / stride-2 max pooling, giving (N, K, P // 2, Q // 2).
        """
        _check_int8("x", x, 4)
        return self._call(x, *self._conv2d(x.shape, w, stride, padding, dilation, bias, requant,
                                           relu, pool))

    def _conv2d(self, x_shape, w, stride, padding, dilation, bias, requant, relu, pool):
        """(w as it goes to memory, output shape, dtype, compile(x_addr, w_addr, y_addr[,
        scratch_addr]), the host's part of the epilogue, useful MACs, the bytes of the
        read-write scratch region the program needs (0: none)) of `conv2d` for an ``x`` of
        ``x_shape``. A scratch region is taken only where the operands and it fit the memory
        below the resident regions (else im2col, as before: a 128 KiB board memory keeps
        running what it ran)."""
        _check_int8("w", w, 4)
        check_option("stride", stride, 1, 255)
        check_option("padding", padding, 0, 255)
        check_option("dilation", dilation, 1, 255)
        epilogue, host = self._epilogue(Epilogue.from_options(
            w.shape[0], bias=bias, requant=requant, relu=relu, pool=pool))
        out_shape = conv2d_output_shape(x_shape, w.shape, stride, padding, dilation,
                                        epilogue is not None and epilogue.pool)
        conv = {"stride": stride, "padding": padding, "dilation": dilation}
        lowering = conv2d_lowering(self.config, x_shape, w.shape, epilogue, **conv,
                                   scratch=True)
        weights = conv2d_weights(w, lowering, self.config)
        scratch_bytes = conv2d_scratch_bytes(self.config, x_shape, w.shape, lowering, **conv)
        operands = [int(np.prod(x_shape)), weights.nbytes,
                    output_dtype(epilogue).itemsize * int(np.prod(out_shape)), scratch_bytes]
        if scratch_bytes and sum(_pages(size) for size in operands) > self._resident_floor:
            lowering = conv2d_lowering(self.config, x_shape, w.shape, epilogue, **conv)
            weights, scratch_bytes = conv2d_weights(w, lowering, self.config), 0

        def compile_(x_addr, w_addr, y_addr, scratch_addr=None):
            return compile_conv2d(self.config, x_shape, w.shape, **conv, x_addr=x_addr,
                                  w_addr=w_addr, y_addr=y_addr, epilogue=epilogue,
                                  lowering=lowering, scratch_addr=scratch_addr)
        macs = conv2d_macs(x_shape, w.shape, stride, padding, dilation)
        return weights, out_shape, output_dtype(epilogue), compile_, host, macs, scratch_bytes

    def prepare_matmul(self, a_shape, b, *, bias=None, requant=None, relu=False, input=None):
        """`matmul` of an int8 ``a_shape`` a with ``b`` made resident: b, the program and an
        output region are written once. ``input``: the `Resident` a is read from (another
        call's ``output``: the two chain in device memory), else a new region."""
        _check_shape("a_shape", a_shape, 2)
        return self._prepare(a_shape, input, *self._matmul(a_shape, b, bias, requant, relu))

    def prepare_conv2d(self, x_shape, w, stride=1, padding=0, dilation=1, *, bias=None,
                       requant=None, relu=False, pool=False, input=None):
        """`conv2d` of an int8 ``x_shape`` x made resident, as `prepare_matmul`."""
        _check_shape("x_shape", x_shape, 4)
        return self._prepare(x_shape, input, *self._conv2d(
            x_shape, w, stride, padding, dilation, bias, requant, relu, pool))

    def _prepare(self, input_shape, input, weights, shape, dtype, compile_, host, macs,
                 scratch=0):
        if host is not None and host.requant:
            raise ValueError(f"requant multipliers {host.multiplier} need the host epilogue on "
                             "this core (CoreConfig.epilogue_multiplier=False), which a "
                             "resident call cannot apply: use powers of two, or matmul / "
                             "conv2d")
        if host is not None:
            raise ValueError("pool needs the host on this core (CoreConfig.epilogue_pool=False), "
                             "which a resident call cannot apply: use conv2d")
        input_bytes = int(np.prod(input_shape))
        if input is None:
            input = self._allocate(input_bytes)
        elif not isinstance(input, Resident) or input.size != input_bytes:
            raise ValueError(f"input={input!r} is invalid: allowed None or a Resident of "
                             f"{input_bytes} bytes")
        # A scratch region goes after the weights, in their window (the four are taken).
        weights_bytes = _round_up(weights.nbytes, 64)
        stored = self._allocate(weights_bytes + scratch)
        self._link().write_memory(stored.address, np.ascontiguousarray(weights).tobytes())
        output = self._allocate(dtype.itemsize * int(np.prod(shape)))
        compiled = compile_(input.address, stored.address, output.address,
                            *([stored.address + weights_bytes] if scratch else []))
        code = compiled.to_bytes()
        program = self._allocate(len(code))
        self._write(program, code)
        return PreparedCall(input, stored, output, program, len(compiled), tuple(shape),
                            dtype, weights.nbytes + program.size, macs, scratch > 0)

    def upload(self, array):
        """``array``'s bytes written to a new `Resident` region (once, kept across calls)."""
        data = np.ascontiguousarray(array).tobytes()
        region = self._allocate(len(data))
        self._write(region, data)
        return region

    def download(self, region, dtype, shape):
        """What `Resident` ``region`` holds, as a ``dtype`` array of ``shape``."""
        return _array(self._link().read_memory(region.address, region.size), dtype, shape)

    def launch(self, call, x=None):
        """Run `PreparedCall` ``call``, first writing int8 ``x`` to its input when given; the
        output stays in ``call.output`` (`download` reads it)."""
        if x is not None:
            if x.dtype != np.int8 or x.nbytes != call.input.size:
                raise ValueError(f"x ({x.dtype}, {x.nbytes} bytes) does not fit the call's "
                                 f"int8 input of {call.input.size} bytes")
            self._write(call.input, np.ascontiguousarray(x).tobytes())
        self._start(fit_windows(call.windows, self.config.windows), call.program.address,
                    call.program_length)
        self._count(call.macs)

    def _allocate(self, size):
        """A new page-aligned `Resident` of ``size`` bytes below the others."""
        address = self._resident_floor - _pages(size)
        if address < 0:
            raise ValueError(f"resident regions need more than memory_size={self.memory_size} "
                             "bytes")
        self._resident_floor = address
        return Resident(address, size)

    def _write(self, region, data):
        assert len(data) == region.size
        self._link().write_memory(region.address, data)

    def attention(self, q, k, v, causal=False):
        """Fused attention ``softmax(q k^T / sqrt(d)) v``: float32 (L, d), (S, d), (S, d) ->
        float32 (L, d), or with a leading heads dimension on all four. q, k and v are
        quantized to int8 with one scale each; ``causal`` masks key j of query i when
        ``j > i + S - L`` (needs L <= S)."""
        _check_softmax_unit(self.config, "attention")
        q, k, v = (_check_float(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
        if not (q.ndim == k.ndim == v.ndim) or q.ndim not in (2, 3):
            raise ValueError(f"q, k, v must all be (L, d) or (heads, L, d): shapes {q.shape}, "
                             f"{k.shape}, {v.shape}")
        single = q.ndim == 2
        q, k, v = (x[None] if single else x for x in (q, k, v))
        if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: need q (L, d) and "
                             "k, v (S, d) with the same d (and heads)")
        _check_causal(causal, q.shape[1], k.shape[1])
        (qi, ki, vi), (_, _, sv), frac = quantize_attention(q, k, v)
        o = self.attention_int8(qi, ki, vi, frac, causal=causal)
        out = (o.astype(np.float64) * (sv / 2 ** SOFTMAX_OUT_FRAC)).astype(np.float32)
        return out[0] if single else out

    def attention_int8(self, q, k, v, frac, causal=False):
        """The core's part of `attention`: int8 (heads, L, d), (heads, S, d), (heads, S, d) ->
        int32 (heads, L, d), the output in units of v / 2**SOFTMAX_OUT_FRAC (see
        ``hdl/softmax.py``); ``q k^T / 2**frac`` are the scores in log2 units."""
        _check_softmax_unit(self.config, "attention")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_int8(name, x, 3)
        heads, seq, dim = q.shape
        kv = k.shape[1]
        if k.shape != (heads, kv, dim) or v.shape != k.shape:
            raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not match")
        check_option("frac", frac, 0, 31)
        _check_causal(causal, seq, kv)
        plan = plan_attention(self.config, seq, kv, dim, causal)
        q_mem, kt_mem, v_mem = attention_operands(plan, q, k, v)
        out_bytes = 4 * heads * seq * dim
        (q_addr, kt_addr, v_addr), (o_addr,) = self._layout(
            [q_mem.nbytes, kt_mem.nbytes, v_mem.nbytes], [out_bytes])
        program = compile_attention(self.config, plan, heads, q_addr=q_addr, kt_addr=kt_addr,
                                    v_addr=v_addr, o_addr=o_addr, causal=causal,
                                    frac=frac)
        (o,) = self._run(program, [(q_addr, q_mem), (kt_addr, kt_mem), (v_addr, v_mem)],
                         [(o_addr, out_bytes)])
        self._count(attention_macs(heads, seq, kv, dim, causal))
        return _array(o, np.int32, (heads, seq, dim))

    def softmax(self, x):
        """Softmax over the last axis of a float32 (rows, n) array on the softmax unit (x is
        quantized to int8 with one scale, a power of two in log2 units: `quantize_softmax`)."""
        _check_softmax_unit(self.config, "softmax")
        x = _check_float("x", x)
        if x.ndim != 2:
            raise ValueError(f"x must have 2 dimensions (rows, n), not {x.ndim}")
        xi, _, frac = quantize_softmax(x)
        n = self.config.cols
        eye = np.eye(n, dtype=np.int8)
        rows, width = x.shape
        (x_addr, eye_addr), (y_addr,) = self._layout([xi.nbytes, eye.nbytes], [4 * xi.size])
        program = compile_softmax(self.config, rows, width, x_addr=x_addr, eye_addr=eye_addr,
                                  y_addr=y_addr, frac=frac)
        (y,) = self._run(program, [(x_addr, xi), (eye_addr, eye)], [(y_addr, 4 * xi.size)])
        return (_array(y, np.int32, (rows, width)) / 2 ** SOFTMAX_OUT_FRAC).astype(np.float32)

    def _layout(self, input_sizes, output_sizes):
        """Page-aligned addresses from 0: inputs, then outputs (the program goes after them)."""
        addresses, end = operand_layout(input_sizes, output_sizes)
        if end > self._resident_floor:
            raise ValueError(f"the operands need {end} bytes of memory: more than "
                             f"{self._free_memory()}")
        return addresses

    def _free_memory(self):
        """The memory per-call operands may use, in words."""
        if self._resident_floor == self.memory_size:
            return f"memory_size={self.memory_size}"
        return (f"the {self._resident_floor} bytes below the resident regions "
                f"(memory_size={self.memory_size})")

    def _run(self, program, inputs, outputs, scratch=None):
        """Write ``inputs`` [(address, array)], run ``program`` in windows that admit exactly
        them, the outputs [(address, size)], the ``scratch`` region (address, size) after them
        (read and written) and the program; return the outputs' bytes."""
        return self._execute(self._image(program, inputs, outputs, scratch))

    def _image(self, program, inputs, outputs, scratch=None):
        """The `RunImage` of ``program`` with ``inputs`` and ``outputs`` (as in `_run`)."""
        code = program.to_bytes()
        written = outputs + ([scratch] if scratch else [])
        program_address = program_placement(written)
        if program_address + len(code) > self._resident_floor:
            raise ValueError(f"the program ({len(program)} instructions) and its operands need "
                             f"{program_address + len(code)} bytes of memory: more than "
                             f"{self._free_memory()}")
        windows = access_windows([(address, array.nbytes) for address, array in inputs], written,
                                 program_address, len(code), readback=scratch is not None,
                                 count=self.config.windows)
        return RunImage(code, program_address, len(program),
                        [(address, np.ascontiguousarray(array).tobytes())
                         for address, array in inputs], list(outputs), windows)

    def _execute(self, image, timeout_cycles=200_000_000):
        """Run ``image`` through the transport; the outputs' bytes."""
        link = self._link()
        for address, data in image.inputs:
            link.write_memory(address, data)
        link.write_memory(image.program_address, image.program)
        self._start(image.windows, image.program_address, image.program_length, timeout_cycles)
        return [link.read_memory(address, size) for address, size in image.outputs]

    def _link(self):
        if self._transport is None:
            raise RuntimeError(f"{type(self).__name__} is not open: use it in a `with` block")
        return self._transport

    def _start(self, windows, program_address, program_length, timeout_cycles=200_000_000):
        """Run the program in memory in ``windows``; set `stats`; `DeviceError` if it fails."""
        run = drive(self._link(), run_program(windows, program_address, program_length,
                                              timeout_cycles))
        counters, present = run.counters, counter_names(self.config)
        self.stats = Stats(
            cycles=counters["cycles"], macs=0, issued_macs=counters["macs"],
            array_macs=self.config.macs,
            bytes_read=counters["bytes_read"], bytes_written=counters["bytes_written"],
            **{name: counters[name] if name in present else None
               for name in (f"{engine.name.lower()}_busy_cycles" for engine in Engine)})
        if not run.done:
            self._soft_reset()
            if not run.finished:
                raise DeviceError(f"the core did not finish within {timeout_cycles} cycles")
            raise DeviceError(f"the core stopped with {run.error.name} at "
                              f"instruction {run.error_index}")

    def _soft_reset(self):
        self._transport.write_register(register("CONTROL").offset,
                                       register("CONTROL").value(soft_reset=1))


def _round_up(size, unit):
    return -(-size // unit) * unit


def _pages(size):
    return _round_up(size, _PAGE)


def operand_layout(input_sizes, output_sizes):
    """([input addresses], [output addresses]) page-aligned from 0, inputs first, and the end."""
    addresses, cursor = [], 0
    for sizes in (input_sizes, output_sizes):
        group = []
        for size in sizes:
            group.append(cursor)
            cursor += _pages(size)
        addresses.append(group)
    return addresses, cursor


def program_placement(outputs):
    """Where the program goes: the page after the outputs [(address, size)]."""
    return max(address + _pages(size) for address, size in outputs)


def program_windows(program, readable, writable, readback=False, read_write=()):
    """The windows [(base, size, readable, writable)] of a program: ``program`` (address,
    bytes) and the ``readable`` regions [(address, size)] readable, the ``writable`` regions
    writable (and with ``readback`` readable: the program reads what it wrote), the
    ``read_write`` ones both, nothing else; a region's window is rounded up to whole 64
    bytes."""
    return ([(*program, True, False)]
            + [(address, _round_up(size, 64), True, False) for address, size in readable]
            + [(address, _round_up(size, 64), True, True) for address, size in read_write]
            + [(address, _round_up(size, 64), readback, True) for address, size in writable])


def access_windows(inputs, outputs, program_address, program_bytes, readback=False, *,
                   count=NUM_WINDOWS):
    """The `program_windows` of a run: one window from 0 over the inputs [(address, size)], one
    over the outputs (``readback`` as there), fitted to ``count`` windows (`fit_windows`)."""
    inputs_end = max(address + size for address, size in inputs)
    outputs_start = min(address for address, _ in outputs)
    outputs_end = max(address + size for address, size in outputs)
    return fit_windows(program_windows((program_address, program_bytes), [(0, inputs_end)],
                                       [(outputs_start, outputs_end - outputs_start)], readback),
                       count)


def fit_windows(windows, count):
    """``windows`` [(base, size, readable, writable)] as at most ``count`` (a core's
    `CoreConfig.windows`). They are kept if they fit; else the read-only ones become the one
    window that covers them, the writable ones kept exact; if that is still too many, the
    writable ones become one as well (readable if one of them is); with one window, it covers
    all of them with every permission asked for. A merged window grants its permissions on the
    bytes between its parts too: the protection lost (docs/DESIGN.md, `CoreConfig.windows`)."""
    if not 1 <= count <= NUM_WINDOWS:
        raise ValueError(f"count={count!r} is invalid: allowed an integer in 1..{NUM_WINDOWS}")
    read_only = [w for w in windows if not w[3]]
    writable = [w for w in windows if w[3]]
    for fitted in (windows, [*_cover(read_only), *writable],
                   [*_cover(read_only), *_cover(writable)]):
        if len(fitted) <= count:
            return list(fitted)
    return _cover(windows)


def _cover(windows):
    """[the window over all of ``windows``, with each permission one of them has], or []."""
    if not windows:
        return []
    base = min(b for b, _, _, _ in windows)
    end = max(b + s for b, s, _, _ in windows)
    return [(base, end - base, any(r for _, _, r, _ in windows), any(w for *_, w in windows))]
