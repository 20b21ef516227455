"""What every engine shows the controller."""
from amaranth.hdl import Mux
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from ..isa import ErrorCode, window_layout

__all__ = ["check_state", "dma_engine_members", "engine_members"]


def engine_members(instruction_layout, shifting=False):
    """Signature members of an engine that runs instructions of ``instruction_layout``.

    ``instr``: ready only when the engine can take one; ``done``: a pulse per completed
    instruction, in order; ``error``: non-zero once the engine stopped on an error (held until
    reset); ``progress``: a pulse on any bus handshake or SRAM access (feeds the watchdog);
    ``holding``: the engine still reads the instruction it took on ``instr``, which must not
    change meanwhile (an engine that copies what it takes leaves it 0). With ``shifting``,
    ``shift``: the instruction on offer is to move down by one entry of its array for the next
    cycle (`InstructionQueue`'s ``shift``: the store engine's PARAMS entries, read from the
    first one).
    """
    return {
        "instr": In(stream.Signature(instruction_layout)),
        "done": Out(1),
        "busy": Out(1),
        "holding": Out(1),
        "error": Out(ErrorCode),
        "progress": Out(1),
        **({"shift": Out(1)} if shifting else {}),
    }


def dma_engine_members(instruction_layout, axi_signature, config, shifting=False):
    """`engine_members` plus what a DMA engine of the core ``config`` needs: its access windows
    (`CoreConfig.windows`, of `CoreConfig.address_width`) and its AXI channels."""
    return {
        **engine_members(instruction_layout, shifting),
        "windows": In(data.ArrayLayout(window_layout(config.address_width), config.windows)),
        "axi": Out(axi_signature),
    }


def check_state(m, engine, check, stopped, also=ErrorCode.NONE, then="RUN"):
    """A DMA engine's CHECK state (call it inside ``with m.State(...)``): busy, waiting for the
    `TileCheck`'s verdict, then state ``then`` (RUN, or with a shared DMA front ACQUIRE), or
    ERROR with its code (``stopped`` asserted). ``also``: an error the engine finds beside the
    check (from registers, settled before the check's verdict, which comes two cycles after it
    takes the descriptor at the earliest), reported if the check passes. Returns whether it
    goes to ``then`` in this cycle."""
    m.d.comb += [engine.busy.eq(1), check.result.ready.eq(1)]
    verdict = Mux(check.result.payload == ErrorCode.NONE, also, check.result.payload)
    passed = check.result.valid & (verdict == ErrorCode.NONE)
    with m.If(passed):
        m.next = then
    with m.Elif(check.result.valid):
        m.d.comb += stopped.eq(1)
        m.d.sync += engine.error.eq(verdict)
        m.next = "ERROR"
    return passed
