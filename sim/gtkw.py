"""GTKWave save files for traces of the core: the signals a user looks at first, in groups."""
import re
from pathlib import Path

__all__ = ["GROUPS", "vcd_signals", "write_gtkw"]

GROUPS = (
    ("interrupt and registers", r"irq|csr\.(busy|status\.\w+|program_base|program_length|"
                                r"error_code|error_index)"),
    ("AXI4 write address", r"m_axi_aw(valid|ready|id|addr|len|size|burst)"),
    ("AXI4 write data", r"m_axi_w(valid|ready|data|strb|last)"),
    ("AXI4 write response", r"m_axi_b(valid|ready|id|resp)"),
    ("AXI4 read address", r"m_axi_ar(valid|ready|id|addr|len|size|burst)"),
    ("AXI4 read data", r"m_axi_r(valid|ready|id|data|resp|last)"),
    ("AXI4-Lite registers", r"s_axil_(aw|w|b|ar|r)(valid|ready|addr|data|resp)"),
    ("engine states", r"datapath\.(controller|load|store|load\.walker|store\.walker)\.fsm_state|"
                      r"datapath\.(load|execute|store)__busy"),
    ("queue occupancy", r"datapath\.controller\.\w+_(queue|pending)\.level|"
                        r"datapath\.(load\.plan|store\.beats)\.level|w_owed\.level"),
)
"""(group, pattern of the signal's name below the core's scope)."""


def vcd_signals(vcd):
    """{hierarchical name: width} of every signal a VCD file declares."""
    scopes, signals = [], {}
    with open(vcd) as file:
        for line in file:
            words = line.split()
            if not words:
                continue
            if words[0] == "$scope":
                scopes.append(words[2])
            elif words[0] == "$upscope":
                scopes.pop()
            elif words[0] == "$var":
                signals.setdefault(".".join([*scopes, words[4]]), int(words[2]))
            elif words[0] == "$enddefinitions":
                break
    return signals


def write_gtkw(vcd, path):
    """Write a GTKWave save file for ``vcd`` (a trace of `tpu_core`, alone or inside a system)
    to ``path``; returns the number of signals it shows. The core is the scope that holds
    ``m_axi_awvalid`` and the ``datapath``."""
    signals = vcd_signals(vcd)
    scopes = [name[:-len("m_axi_awvalid")] for name in signals if name.endswith(".m_axi_awvalid")]
    core = next((scope for scope in scopes if f"{scope}datapath.load__busy" in signals), None)
    if core is None:
        raise ValueError(f"{vcd} holds no tpu_core (no m_axi_awvalid)")
    lines = [f'[dumpfile] "{Path(vcd).resolve()}"', "[timestart] 0"]
    shown = 0
    for group, pattern in GROUPS:
        matched = sorted(name for name in signals if name.startswith(core)
                         and re.fullmatch(pattern, name[len(core):]))
        if not matched:
            continue
        lines += ["@200", f"-{group}"]
        for name in matched:
            width = signals[name]
            lines += ["@28" if width == 1 else "@22",
                      name if width == 1 else f"{name}[{width - 1}:0]"]
        shown += len(matched)
    Path(path).write_text("\n".join(lines) + "\n")
    return shown
