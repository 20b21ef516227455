"""GTKWave save files from a trace's own signal list, and windows of cycles of a trace (no
simulator runs here)."""
import pytest

from tpugen.sim.gtkw import vcd_signals, write_gtkw
from tpugen.sim.vcd_window import window_vcd

VCD = """$timescale 1ps $end
 $scope module $rootio $end
  $var wire 1 ! m_axi_awvalid $end
 $upscope $end
 $scope module sim_system $end
  $scope module core $end
   $var wire 1 ! m_axi_awvalid $end
   $var wire 32 " m_axi_awaddr [31:0] $end
   $var wire 1 # irq $end
   $var wire 1 $ unrelated $end
   $scope module datapath $end
    $var wire 1 % load__busy $end
    $var wire 3 & load.fsm_state [2:0] $end
    $scope module controller $end
     $scope module load_queue $end
      $var wire 2 ' level [1:0] $end
     $upscope $end
    $upscope $end
   $upscope $end
  $upscope $end
 $upscope $end
$enddefinitions $end
#0
"""


def test_gtkw_groups_the_core_signals_wherever_the_core_sits(tmp_path):
    vcd = tmp_path / "dump.vcd"
    vcd.write_text(VCD)
    assert vcd_signals(vcd)["sim_system.core.m_axi_awaddr"] == 32
    assert write_gtkw(vcd, tmp_path / "dump.gtkw") == 6
    text = (tmp_path / "dump.gtkw").read_text()
    assert f'[dumpfile] "{vcd}"' in text
    assert "-AXI4 write address\n@22\nsim_system.core.m_axi_awaddr[31:0]\n@28\n" in text
    assert "sim_system.core.datapath.controller.load_queue.level[1:0]" in text
    assert "unrelated" not in text and "$rootio" not in text


def test_gtkw_refuses_a_trace_without_the_core(tmp_path):
    vcd = tmp_path / "other.vcd"
    vcd.write_text("$scope module x $end\n$var wire 1 ! y $end\n$upscope $end\n$enddefinitions $end\n")
    with pytest.raises(ValueError, match="holds no tpu_core"):
        write_gtkw(vcd, tmp_path / "x.gtkw")


def _counter_trace(cycles):
    """A Verilator-style VCD: clk (period 10 ns) and a counter that changes every third cycle."""
    lines = ["$timescale 1ps $end", " $scope module TOP $end", "  $var wire  1 # clk $end",
             '  $var wire  4 " count [3:0] $end', " $upscope $end", "$enddefinitions $end",
             "#0", "$dumpvars", "0#", 'b0000 "', "$end"]
    for cycle in range(cycles):
        lines += [f"#{cycle * 10000 + 5000}", "1#"]
        if cycle % 3 == 0:
            lines.append(f'b{cycle:04b} "')
        lines += [f"#{cycle * 10000 + 10000}", "0#"]
    return "\n".join(lines) + "\n"


def test_a_window_of_cycles_keeps_the_values_at_its_start(tmp_path):
    trace = tmp_path / "whole.vcd"
    trace.write_text(_counter_trace(12))
    assert window_vcd(trace, tmp_path / "window.vcd", 4, 6) == 2 + 6
    header, body = (tmp_path / "window.vcd").read_text().split("$enddefinitions $end\n")
    assert header + "$enddefinitions $end\n" == trace.read_text().split("#0\n")[0]
    # Cycle 4 begins at the fifth rising edge; the counter still holds 3 (set in cycle 3).
    assert body.split() == ["#45000", "$dumpvars", "1#", 'b0011', '"', "$end",
                            "#50000", "0#", "#55000", "1#", "#60000", "0#",
                            "#65000", "1#", 'b0110', '"', "#70000", "0#"]
    assert window_vcd(trace, tmp_path / "all.vcd") == 12 * 2 + 4 + 2
    assert (tmp_path / "all.vcd").read_text().split("$enddefinitions $end\n")[1].split() \
        == [word for word in trace.read_text().split("$enddefinitions $end\n")[1].split()
            if word[0] != "$"]
    assert window_vcd(trace, tmp_path / "tail.vcd", 11) == 2 + 1
    assert window_vcd(trace, tmp_path / "late.vcd", 20) == 0


@pytest.mark.parametrize("first, last, message", [
    (-1, None, "waves_from=-1 is invalid"), (None, 2.5, "waves_until=2.5 is invalid"),
    (5, 4, "waves_until=4 is before waves_from=5")])
def test_a_window_is_checked(tmp_path, first, last, message):
    with pytest.raises(ValueError, match=message):
        window_vcd(tmp_path / "none.vcd", tmp_path / "out.vcd", first, last)


def test_a_window_needs_a_clock_to_count(tmp_path):
    (tmp_path / "no_clock.vcd").write_text(VCD)
    with pytest.raises(ValueError, match="no top-level 1-bit clk"):
        window_vcd(tmp_path / "no_clock.vcd", tmp_path / "out.vcd", 0, 1)
