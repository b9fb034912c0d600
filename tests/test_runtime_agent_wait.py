"""agent.result_within: the bridge from a device worker's future to the agent's event loop (result,
timeout, cancellation), on both event loops the agent may run on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from edgemux.runtime import process
from edgemux.runtime.dataplane.agent import result_within


def _loops() -> list[str]:
    import importlib.util

    return ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") is not None else [])


@pytest.fixture(params=_loops())
def run(request, monkeypatch):
    monkeypatch.setenv("EDGEMUX_EVENT_LOOP", request.param if request.param == "asyncio" else "")
    return process.run


def test_result_set_from_another_thread_is_returned(run) -> None:
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()

    async def main() -> str:
        threading.Timer(0.01, fut.set_result, ("done",)).start()
        return await result_within(fut, 10.0)

    assert run(main()) == "done"


def test_already_finished_future_returns_at_once(run) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    fut.set_result(3)
    assert run(result_within(fut, 10.0)) == 3


def test_worker_error_is_raised(run) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def main() -> int:
        threading.Timer(0.01, fut.set_exception, (RuntimeError("backend failed"),)).start()
        return await result_within(fut, 10.0)

    with pytest.raises(RuntimeError, match="backend failed"):
        run(main())


def test_timeout_raises_and_leaves_the_future_to_the_caller(run) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(TimeoutError):
        run(result_within(fut, 0.02))
    assert not fut.done()  # the handler cancels it, with its own message


def test_cancelled_wait_cancels_the_queued_request(run) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def main() -> None:
        task = asyncio.ensure_future(result_within(fut, 10.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert fut.cancelled()


def test_late_result_after_the_loop_closed_is_harmless(run) -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(TimeoutError):
        run(result_within(fut, 0.01))
    fut.set_result(1)  # the done callback finds the loop closed: no exception escapes into this thread
