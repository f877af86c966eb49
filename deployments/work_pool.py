"""A request's own CPU work (chat templates, tokenizing, validation) runs off the replica's event loop, in a
bounded pool of its own: a flood of heavy requests queues there, while the event loop, and the default
executor that Serve's health check and the engine's probes use, stay free."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="request-work")


async def off_loop(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
