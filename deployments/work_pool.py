"""A request's own CPU work (chat templates, tokenizing, validation) runs off the replica's event loop, in a
bounded pool of its own: a flood of heavy requests queues there, while the event loop, and the default
executor that Serve's health check and the engine's probes use, stay free. Work for requests of a lower
priority than online ones (batch lines) queues in a second pool, so an online request never waits behind a
batch's backlog for its turn. That second pool has one thread: it keeps up with a batch (a line's template and
tokens take a fraction of a millisecond), and every further thread is one more contender for the GIL that an online
request's own work needs."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="request-work")
_background_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background-work")


async def off_loop(fn, *args, priority: int = 0):
    """`fn(*args)` on a worker thread; `priority` above 0 (a batch line's) takes the background pool."""
    pool = _pool if priority <= 0 else _background_pool
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
