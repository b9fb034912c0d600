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


def test_event_loop_is_uvloop_when_installed_unless_turned_off(monkeypatch) -> None:
    monkeypatch.delenv("EDGEMUX_EVENT_LOOP", raising=False)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    loop = process.new_event_loop()
    try:
        if uvloop is not None:
            assert isinstance(loop, uvloop.Loop)
            assert process.event_loop_name().startswith("uvloop ")
        else:
            assert process.event_loop_name() == "asyncio"
    finally:
        loop.close()
    monkeypatch.setenv("EDGEMUX_EVENT_LOOP", "asyncio")
    assert process.event_loop_name() == "asyncio"
    loop = process.new_event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_run_returns_the_coroutine_result_and_propagates_errors() -> None:
    import asyncio

    import pytest

    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    async def bad() -> None:
        raise ValueError("boom")

    assert process.run(ok()) == 7
    with pytest.raises(ValueError, match="boom"):
        process.run(bad())


def test_a_bad_event_loop_setting_is_a_clear_error(monkeypatch) -> None:
    import pytest

    from edgemux.errors import InputError

    monkeypatch.setenv("EDGEMUX_EVENT_LOOP", "uvlop")
    with pytest.raises(InputError, match="EDGEMUX_EVENT_LOOP: expected 'uvloop', 'asyncio' or unset, got 'uvlop'"):
        process.new_event_loop()


def test_the_cli_says_a_bad_event_loop_setting_in_one_line(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, EDGEMUX_EVENT_LOOP="nope")
    done = subprocess.run([sys.executable, "-m", "edgemux", "gateway", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "EDGEMUX_EVENT_LOOP" in done.stderr and "Traceback" not in done.stderr
