"""`BoardDevice`: the runtime on a `tpugen build` bitstream, over the board's USB serial port."""
from ..arch import QUEUE_DEPTH
from ..config import CoreConfig, check_config
from ..isa import DIMS
from ..registers import CSR_VERSION, ID_MAGIC, register
from .device import Device, DeviceError

__all__ = ["BoardDevice", "config_from_registers"]


def config_from_registers(read_register):
    """The CoreConfig a core reports in its identification registers (``read_register(name)``
    returns a register's value); DeviceError if it is not a tpugen core of this major version."""
    ident = read_register("ID")
    if ident != ID_MAGIC:
        raise DeviceError(f"no tpugen core answers: ID reads {ident:#010x}, not {ID_MAGIC:#010x}")
    version = register("VERSION").fields_of(read_register("VERSION"))
    if version.major != CSR_VERSION[0]:
        raise DeviceError(f"the core's register map is version {version.major}.{version.minor}; "
                          f"this runtime speaks {CSR_VERSION[0]}.x")
    geometry = register("CONFIG0").fields_of(read_register("CONFIG0"))
    memory = register("CONFIG1").fields_of(read_register("CONFIG1"))
    # CONFIG2 is unmapped before map 1.3 (its cores all prefetch).
    handling = register("CONFIG2").fields_of(read_register("CONFIG2") if version.minor >= 3 else 0)
    lanes = max(geometry.rows, geometry.cols)

    def kib(rows, row_bytes):  # rows = kib * 1024 // row_bytes, so this rounds back up
        return -(-rows * row_bytes // 1024)

    return CoreConfig(
        rows=geometry.rows, cols=geometry.cols, axi_data_width=memory.axi_data_width,
        scratchpad_kib=kib(read_register("SCRATCHPAD_ROWS"), lanes),
        accumulator_kib=kib(read_register("ACCUMULATOR_ROWS"), 4 * geometry.cols),
        softmax=bool(memory.softmax), im2col=bool(memory.im2col),
        counter_width=64 if memory.wide_counters else 32,
        epilogue_multiplier=not memory.shift_only_epilogue,
        counters=("full" if not memory.basic_counters else
                  "traffic" if handling.no_busy_counters else "basic"), windows=memory.windows,
        queue_depth=memory.queue_depth or QUEUE_DEPTH, descriptor_dims=DIMS - memory.missing_dims,
        store_prefetch=not handling.no_store_prefetch,
        load_prefetch=not handling.no_load_prefetch, shared_dma=bool(handling.shared_dma),
        weight_prefetch=not handling.no_weight_prefetch,
        address_width=32 - handling.address_bits_missing,
        registered_accumulate=not handling.unregistered_accumulate,
        buffered_feeders=not handling.unbuffered_feeders,
        broadcast_activations=bool(handling.broadcast_activations),
        adder_tree_columns=bool(handling.adder_tree_columns),
        counters_in_ram=bool(handling.counters_in_ram), epilogue_pool=not handling.no_pool,
        weight_chain=not handling.no_weight_chain,
        execute_prefetch=not handling.no_execute_prefetch)


class BoardDevice(Device):
    """A core on ``board`` (a name from ``tpugen.fpga.boards.BOARDS``) at serial ``port``;
    ``memory_size`` and ``clock_hz`` default to the board's.

    ``with BoardDevice("/dev/ttyUSB0", board="ulx3s-85f") as dev:`` opens the port, checks the
    core's identification registers and reads its configuration from them (``config``, when
    given, must match). The methods are `SimDevice`'s. ``serial``: an open pyserial-like
    object to use instead of ``port`` (the simulated board passes one, with ``board=None``). Link timeouts and
    corrupted frames raise `TransportError`; a program that does not finish within
    ``timeout_cycles`` raises `DeviceError` after a soft reset.
    """

    def __init__(self, port=None, *, board="ulx3s-85f", config=None, serial=None,
                 timeout=1.0, memory_size=None, clock_hz=None):
        from ..fpga.boards import board_named

        if (port is None) == (serial is None):
            raise ValueError("give exactly one of port (a serial port name) and serial")
        if config is not None:
            check_config(config)
        self.board = board_named(board) if board is not None else None
        if self.board is None and (port is not None or memory_size is None or clock_hz is None):
            raise ValueError("board=None needs serial, memory_size and clock_hz")
        super().__init__(config or CoreConfig(), memory_size or self.board.memory_kib * 1024)
        self._expected_config = config
        self.port = port
        self.timeout = timeout
        self.clock_hz = clock_hz or self.board.default_mhz * 1e6
        self._serial = serial

    def __enter__(self):
        from .link import SerialLink

        if self._serial is None:
            import serial

            self._serial = serial.Serial(self.port, self.board.baud, timeout=self.timeout)
        self._transport = SerialLink(self._serial, timeout=self.timeout, clock_hz=self.clock_hz)
        try:
            found = config_from_registers(
                lambda name: self._transport.read_registers(register(name).offset, 1)[0])
            expected = self._expected_config
            if expected is not None and any(
                    getattr(found, name) != getattr(expected, name)
                    for name in ("rows", "cols", "axi_data_width", "scratchpad_kib",
                                 "accumulator_kib")):
                raise DeviceError(f"the board's core is {found}, not the expected {expected}")
            self.config = expected or found
            self._soft_reset()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info):
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self.port is not None and self._serial is not None:
            self._serial.close()
            self._serial = None
        return False
