"""OpenMP's spin wait, bounded before torch loads libgomp (libgomp reads its environment once, as it loads).

After each parallel region libgomp's idle workers spin (300,000 iterations by default, about a millisecond)
before they sleep. Alone on its cores the engine gains little from that; beside a busy neighbour it loses much:
a spinning worker takes the time slice its neighbour needs, and every region then waits for whichever thread
was descheduled. Importing `runtime` first bounds it (unless GOMP_SPINCOUNT is set already), as the replicas'
environment does (deployments/builder.py); a process that imported torch before has libgomp's default.
"""

import os

SPINCOUNT = "10000"

os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
