"""The simulator side of a simulated board: `BoardSystem` with a bit-level UART model.

The host (`sim.board_sim.SimSerial`) sends bytes to transmit on ``uart_rx`` and asks for bytes
received from ``uart_tx``; a read waits at most the given number of simulated cycles.
"""
import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, FallingEdge, First, Timer

from ..wire import FRAME_TIMEOUT_BITS
from .session import connect_to_host

PERIOD_NS = 10


@cocotb.test()
async def serve(dut):
    params, connection = connect_to_host()
    clocks_per_bit = params["clocks_per_bit"]
    cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
    dut.uart_rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    received = bytearray()
    arrived = Event()

    async def receive():
        while True:
            await FallingEdge(dut.uart_tx)
            await ClockCycles(dut.clk, clocks_per_bit + clocks_per_bit // 2)
            byte = 0
            for bit in range(8):
                byte |= int(dut.uart_tx.value) << bit
                await ClockCycles(dut.clk, clocks_per_bit)
            received.append(byte)
            arrived.set()

    async def transmit(data):
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                dut.uart_rx.value = bit
                await ClockCycles(dut.clk, clocks_per_bit)

    cocotb.start_soon(receive())
    with connection:
        while (request := connection.recv()) is not None:
            kind, *args = request
            if kind == "write":
                await transmit(args[0])
            elif kind == "flush":  # the host waits out the bridge's quiet period: so does the line
                await ClockCycles(dut.clk, 2 * FRAME_TIMEOUT_BITS * clocks_per_bit)
                received.clear()
            else:
                size, timeout_cycles = args
                deadline = Timer(timeout_cycles * PERIOD_NS, "ns")
                while len(received) < size:
                    arrived.clear()
                    if await First(arrived.wait(), deadline) is deadline:
                        break
                connection.send(bytes(received[:size]))
                del received[:size]
