"""A simulated board: `BoardSystem` on Verilator behind a serial-port object, so that
`BoardDevice` runs on it exactly as on hardware (UART bridge, link protocol, on-chip memory)."""
import tempfile
from pathlib import Path

from ..firmware.board import BoardDevice
from ..hdl.board import SIMULATED_BOARD
from .session import SimulationThread
from .verilator import build_model

__all__ = ["SimSerial", "simulated_board"]


class SimSerial:
    """pyserial's ``write``, ``read`` and ``reset_input_buffer`` on the simulated UART.

    ``timeout`` is in simulated seconds: a read returns what arrived within it."""

    def __init__(self, connection, clock_hz, baud, timeout):
        self._connection = connection
        self.baudrate = baud
        self._cycles = int(timeout * clock_hz)

    def write(self, data):
        self._connection.send(("write", bytes(data)))
        return len(data)

    def read(self, size=1):
        self._connection.send(("read", size, self._cycles))
        return self._connection.recv()

    def reset_input_buffer(self):
        self._connection.send(("flush",))

    def close(self):
        if not self._connection.closed:
            self._connection.send(None)
            self._connection.close()


class simulated_board:
    """``with simulated_board(config) as dev:`` a `BoardDevice` on the simulated board with a
    core for ``config``; ``expect``: the config the device is told to expect (default: that)."""

    def __init__(self, config, *, expect=None, timeout=0.05, start_timeout=600.0):
        self.config = config
        self.expect = expect or config
        self.timeout = timeout
        self.start_timeout = start_timeout

    def __enter__(self):
        model = build_model(self.config, "board_system")
        self._tmp = tempfile.TemporaryDirectory(prefix="tpugen-board-")
        clock_hz, baud = SIMULATED_BOARD["clk_freq"], SIMULATED_BOARD["baud"]
        self._simulation = SimulationThread(model, "tpugen.sim.tb_board", Path(self._tmp.name),
                                            {"clocks_per_bit": clock_hz // baud})
        self._serial = SimSerial(self._simulation.connect(self.start_timeout), clock_hz, baud,
                                 self.timeout)
        self.device = BoardDevice(serial=self._serial, board=None, config=self.expect,
                                  timeout=self.timeout, clock_hz=clock_hz,
                                  memory_size=SIMULATED_BOARD["memory_bytes"])
        try:
            return self.device.__enter__()
        except BaseException:
            self._stop()
            raise

    def __exit__(self, *exc_info):
        self.device.__exit__(*exc_info)
        self._stop()
        return False

    def _stop(self):
        self._serial.close()
        self._simulation.join()
        self._tmp.cleanup()
