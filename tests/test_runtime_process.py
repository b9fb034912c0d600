"""runtime.process: the allocator setting applies where the C library is glibc and is a no-op elsewhere."""

from __future__ import annotations

import ctypes.util
import platform

from edgemux.runtime import process


def test_tune_allocator_reports_whether_it_applied() -> None:
    applied = process.tune_allocator()
    assert isinstance(applied, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert applied


def test_no_c_library_means_no_change(monkeypatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert process.tune_allocator() is False
