"""The host side of a long-running cocotb simulation: a thread that runs it, a socket to it.

The cocotb module connects back with ``connect_to_host()`` and serves requests; `SimTransport`
is the `Transport` of a `tpu_core` simulated that way (``tb_device``).
"""
import json
import os
import secrets
import threading
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path

from ..firmware.transport import Transport, TransportError

__all__ = ["SimTransport", "SimulationThread", "connect_to_host"]


class SimulationThread:
    """Runs cocotb module ``module`` on ``model`` in a thread, with ``params`` (plus the socket
    address and key) in TPUGEN_TB; ``connect()`` waits for the simulation to call back."""

    def __init__(self, model, module, work_dir, params, *, waves=False):
        key = secrets.token_bytes(16)
        self._listener = Listener(str(Path(work_dir) / "host.sock"), authkey=key)
        params = {**params, "address": self._listener.address, "key": key.hex()}
        self.failure = []

        def simulate():
            try:
                model.run(module, Path(work_dir) / "sim", waves=waves,
                          env={"TPUGEN_TB": json.dumps(params)})
            except BaseException as error:  # reported by connect() or the transport
                self.failure.append(error)

        self._thread = threading.Thread(target=simulate, daemon=True)
        self._thread.start()

    def connect(self, timeout):
        """The connection from the simulation, once it has started."""
        accepted = []
        acceptor = threading.Thread(target=lambda: accepted.append(self._listener.accept()),
                                    daemon=True)
        acceptor.start()
        deadline = time.monotonic() + timeout
        while not accepted:
            if self.failure or not self._thread.is_alive() or time.monotonic() > deadline:
                self._listener.close()
                raise RuntimeError(f"the simulation did not start: {self.failure or 'timeout'}")
            acceptor.join(0.05)
        return accepted[0]

    def join(self, timeout=60):
        self._thread.join(timeout)
        self._listener.close()


def connect_to_host():
    """In the cocotb module: (parameters, connection to the host)."""
    params = json.loads(os.environ["TPUGEN_TB"])
    return params, Client(params["address"], authkey=bytes.fromhex(params["key"]))


class SimTransport(Transport):
    """Requests to ``tb_device``: writes are sent without waiting, reads wait for the reply."""

    def __init__(self, connection, simulation):
        self._connection = connection
        self._simulation = simulation

    def _send(self, *request):
        self._connection.send(request)

    def _ask(self, *request):
        self._send(*request)
        try:
            return self._connection.recv()
        except EOFError:
            raise TransportError(f"the simulation ended: {self._simulation.failure}") from None

    def write_memory(self, address, data):
        self._send("write_memory", address, bytes(data))

    def read_memory(self, address, size):
        return self._ask("read_memory", address, size)

    def write_register(self, offset, value):
        self._send("write_register", offset, value)

    def read_registers(self, offset, count):
        return self._ask("read_registers", offset, count)

    def wait_interrupt(self, timeout_cycles):
        return self._ask("wait_interrupt", timeout_cycles)

    def close(self):
        self._connection.send(None)
        self._connection.close()
