"""Requests' CPU work off the event loop: a batch's backlog never holds up an online request's turn."""

import asyncio
import threading

from deployments.work_pool import off_loop


def test_online_work_runs_while_batch_work_fills_its_own_pool():
    release = threading.Event()

    async def main():
        blocked = [asyncio.ensure_future(off_loop(release.wait, priority=1)) for _ in range(8)]  # a batch backlog
        online = await asyncio.wait_for(off_loop(threading.current_thread), timeout=10)
        assert online.name.startswith("request-work")
        assert not any(task.done() for task in blocked)  # the batch's work is still queued or running
        release.set()
        assert all(await asyncio.gather(*blocked))

    asyncio.run(main())


def test_batch_work_queued_in_one_turn_goes_to_its_thread_as_one_job(monkeypatch):
    """64 lines start in one turn of the loop: one hand-off to the background thread, each caller gets its own
    result or exception, and work queued in a later turn is a job of its own."""
    from deployments import work_pool

    jobs = []
    submit = work_pool._background_pool.submit
    monkeypatch.setattr(work_pool._background_pool, "submit", lambda fn, *a: jobs.append(len(a[1])) or submit(fn, *a))

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("line 3 is bad")
        return i * i

    async def main():
        first = await asyncio.gather(*(off_loop(work, i, priority=1) for i in range(64)), return_exceptions=True)
        later = await off_loop(work, 9, priority=1)
        return first, later

    first, later = asyncio.run(main())
    assert jobs == [64, 1]
    assert [r for i, r in enumerate(first) if i != 3] == [i * i for i in range(64) if i != 3]
    assert isinstance(first[3], ValueError) and str(first[3]) == "line 3 is bad"
    assert later == 81
