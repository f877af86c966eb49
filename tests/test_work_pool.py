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
