"""A window of clock cycles of a VCD trace: what ``--waves-from`` / ``--waves-until`` keep of a
long run.

cocotb's Verilator main traces every step of the run; `window_vcd` then reads the file once and
writes the header, every signal's value at the window's first cycle (as ``$dumpvars``) and
the changes up to its last, so that a viewer opens only the part asked for. Cycles are counted
by the times the top-level ``clk`` goes to 1 in the trace: cycle 0 starts at the first (under
cocotb, the clock's start at time 0).
"""
import re

__all__ = ["check_window", "window_vcd"]

_CLOCK = re.compile(r"\$var\s+\w+\s+1\s+(\S+)\s+clk\s+\$end")


def check_window(first_cycle, last_cycle):
    """ValueError unless the cycles (None: open) make a window."""
    for name, value in (("waves_from", first_cycle), ("waves_until", last_cycle)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"{name}={value!r} is invalid: allowed a clock cycle >= 0")
    if first_cycle is not None and last_cycle is not None and last_cycle < first_cycle:
        raise ValueError(f"waves_until={last_cycle} is before waves_from={first_cycle}")


def _signal(change):
    """The identifier code of a value change line (``1!``, ``b1010 #``, ``r0.5 $``)."""
    return change.split()[1] if change[0] in "bBrR" else change[1:]


def _blocks(lines):
    """(time, [value changes]) of each time step after the header."""
    time, changes = 0, []
    for line in lines:
        line = line.strip()
        if line.startswith("#"):
            yield time, changes
            time, changes = int(line[1:]), []
        elif line and not line.startswith("$"):  # not $dumpvars, $end, $comment ...
            changes.append(line)
    yield time, changes


def window_vcd(source, target, first_cycle=None, last_cycle=None):
    """Write to ``target`` the clock cycles ``first_cycle`` to ``last_cycle`` (None: from the
    start, to the end) of VCD ``source``; the number of value changes written."""
    check_window(first_cycle, last_cycle)
    with open(source) as vcd, open(target, "w") as out:
        header = []
        for line in vcd:
            header.append(line)
            if "$enddefinitions" in line:
                break
        clock = _CLOCK.search("".join(header))
        if clock is None:
            raise ValueError(f"{source} traces no top-level 1-bit clk to count cycles by")
        rising = f"1{clock[1]}"
        out.writelines(header)
        values, edges, inside, written = {}, -1, first_cycle is None, 0
        for time, changes in _blocks(vcd):
            edges += rising in changes  # a trace holds changes only: each 1 is a new cycle
            if last_cycle is not None and edges > last_cycle:
                break
            if inside:
                if changes:
                    out.write(f"#{time}\n" + "".join(f"{change}\n" for change in changes))
                    written += len(changes)
                continue
            values.update((_signal(change), change) for change in changes)
            if edges >= first_cycle:
                inside = True
                out.write(f"#{time}\n$dumpvars\n" + "".join(f"{v}\n" for v in values.values())
                          + "$end\n")
                written += len(values)
    return written
