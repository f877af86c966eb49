"""A request's own CPU work (chat templates, tokenizing, validation) runs off the replica's event loop, in a
bounded pool of its own: a flood of heavy requests queues there, while the event loop, and the default
executor that Serve's health check and the engine's probes use, stay free. Work for requests of a lower
priority than online ones (batch lines) queues in a second pool, so an online request never waits behind a
batch's backlog for its turn. That second pool has one thread: it keeps up with a batch (a line's template and
tokens take a fraction of a millisecond), and every further thread is one more contender for the GIL that an online
request's own work needs.

Batch lines come to a replica 64 to a call and all start in one turn of its event loop, so the background work
queued in one turn goes to that thread as one job, and its results come back in one wake-up of the loop: a
hand-off each way costs tens of microseconds of the loop's and the thread's time, more than a line's template."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="request-work")
_background_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-work")
_queued: dict[asyncio.AbstractEventLoop, list] = {}  # loop -> background work queued in its current turn


async def off_loop(fn, *args, priority: int = 0):
    """`fn(*args)` on a worker thread; `priority` above 0 (a batch line's) takes the background pool."""
    loop = asyncio.get_running_loop()
    if priority <= 0:
        return await loop.run_in_executor(_pool, fn, *args)
    done = loop.create_future()
    if loop not in _queued:
        _queued[loop] = []
        loop.call_soon(_hand_over, loop)
    _queued[loop].append((fn, args, done))
    return await done


def _hand_over(loop: asyncio.AbstractEventLoop) -> None:
    _background_pool.submit(_run_all, loop, _queued.pop(loop))


def _run_all(loop: asyncio.AbstractEventLoop, work: list) -> None:
    """On the background thread: each piece of work, its result or its exception handed back to the loop."""
    outcomes = []
    for fn, args, done in work:
        try:
            outcomes.append((done, fn(*args), None))
        except BaseException as e:  # as run_in_executor: whatever it raised is the caller's
            outcomes.append((done, None, e))
    loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list) -> None:
    for done, result, error in outcomes:
        if done.cancelled():  # its caller left; the work ran all the same, as an executor's would
            continue
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)
