"""Where the CPU goes while our server streams: core-seconds per process (and per thread of the replica) over
one pass of the online benchmark's workload, in one serving mode.

Run: python -m benchmarks.online_profile [ingress_python_proxy | direct_python_proxy | ingress_haproxy |
direct_haproxy]   (default: direct_python_proxy, what `serve run configs/local.yaml` runs)
"""

import sys
import time

import psutil
import uvloop
from transformers import AutoTokenizer

from benchmarks.common import build_cpu_model, report
from benchmarks.online_serving import DEFAULT_MODE, MODEL_ID, MODES, drive, serving, workload


def cpu_seconds() -> dict[tuple[int, str], float]:
    """Every process's (and every replica thread's) user + system CPU seconds so far."""
    times = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            name = proc.info["name"] or ""
            cpu = proc.cpu_times()
            times[(proc.pid, name)] = cpu.user + cpu.system
            if "ServeReplica" in name or "DirectLLMServer" in name or "LLMServer" in name:
                for thread in proc.threads():
                    times[(proc.pid, f"{name} thread {thread.id}")] = thread.user_time + thread.system_time
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return times


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODE
    path = build_cpu_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with serving(path, *MODES[mode]) as url:
        uvloop.run(drive(url, MODEL_ID, workload(tokenizer, 0), {"ignore_eos": True}))  # warm-up pass
        before, start = cpu_seconds(), time.perf_counter()
        result = uvloop.run(drive(url, MODEL_ID, workload(tokenizer, 1), {"ignore_eos": True}))
        after, wall = cpu_seconds(), time.perf_counter() - start
    spent = {f"{name} [{pid}]": round(after[key] - before.get(key, 0.0), 2)
             for key in after if (pid := key[0]) and (name := key[1]) and after[key] - before.get(key, 0.0) >= 0.05}
    report("online_profile", mode=mode, wall_s=round(wall, 2), core_seconds_available=round(wall * psutil.cpu_count(),
           2), output_tok_s=result["output_tok_s"], ttft_p50_ms=result["ttft_p50_ms"],
           core_seconds=dict(sorted(spent.items(), key=lambda item: -item[1])))


if __name__ == "__main__":
    main()
