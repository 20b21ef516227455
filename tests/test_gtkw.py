"""GTKWave save files from a trace's own signal list (no simulator runs here)."""
import pytest

from tpugen.sim.gtkw import vcd_signals, write_gtkw

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
