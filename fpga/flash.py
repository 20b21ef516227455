"""Programming a board with openFPGALoader."""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .boards import board_named
from .build import last_build

__all__ = ["FlashError", "flash", "flash_command"]


class FlashError(RuntimeError):
    """No bitstream to program, or no programmer to program it with."""


def _programmer():
    """openFPGALoader's path ($OPENFPGALOADER, as amaranth-boards honours it, else from PATH)."""
    return os.environ.get("OPENFPGALOADER", "openFPGALoader")


def flash_command(board, bitstream):
    """The openFPGALoader command that programs ``bitstream`` onto ``board`` (name or Board)."""
    board = board_named(board) if isinstance(board, str) else board
    bitstream = Path(bitstream)
    if bitstream.suffix != board.bitstream_suffix:
        raise ValueError(f"bitstream={str(bitstream)!r} is invalid: the {board.name} takes a "
                         f"{board.bitstream_suffix} file")
    return [_programmer(), "-b", board.programmer_board, str(bitstream)]


def flash(board, bitstream=None, *, config=None, dry_run=False):
    """Program ``board`` with ``bitstream`` (default: the last cached build for the board and,
    if given, ``config``). With ``dry_run`` only print the command. Returns the command."""
    board = board_named(board) if isinstance(board, str) else board
    if bitstream is None:
        bitstream = last_build(board, config)
        if bitstream is None:
            which = f"{config.rows}x{config.cols} core on the " if config else ""
            size = f" --rows {config.rows} --cols {config.cols}" if config else ""
            raise FlashError(f"no cached build of a {which}{board.name}: run `tpugen build "
                             f"--board {board.name}{size}` first, or name a bitstream")
    elif not Path(bitstream).is_file():
        raise FlashError(f"bitstream {bitstream} does not exist")
    command = flash_command(board, bitstream)
    print(shlex.join(command))
    if not dry_run:
        if shutil.which(command[0]) is None:
            raise FlashError(f"{command[0]} not found: install it with the Debian package "
                             "openfpgaloader (apt install openfpgaloader), or set OPENFPGALOADER")
        returncode = subprocess.run(command).returncode
        if returncode != 0:
            raise FlashError(f"{command[0]} failed (exit {returncode}): is the {board.name} "
                             "plugged in, and may you use its USB device?")
    return command
