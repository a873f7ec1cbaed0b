"""The stubs in hwtimer/*.pyi match the extension module, checked by mypy's
stubtest against the installed package, so that they cannot drift."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_stubtest_finds_no_difference(tmp_path) -> None:
    pytest.importorskip("mypy.stubtest")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "hwtimer._hwtimer"],
        cwd=tmp_path,  # the installed package, as the suite tests it
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
