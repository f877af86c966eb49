"""Run the GPU suite: python -m benchmarks.gpu_suite --out DIR [--dry-run] [--only NAME ...] [--deadline S]

Each check runs in a process of its own (`--check NAME`), within its own time limit and the suite's
deadline; whatever it leaves running (Ray's processes, say) is ended before the next starts.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path

import psutil

from benchmarks.gpu_suite import checks
from benchmarks.gpu_suite.served import served_path
from benchmarks.gpu_suite.sizes import DRY, GPU

# in the order they run (the most telling first, so a short lease still gets them): (check, seconds allowed)
CHECKS = {
    "environment": (checks.environment, 60),
    "engine_tests": (checks.engine_tests, 240),
    "throughput_sync": (partial(checks.throughput, async_scheduling=False), 120),
    "throughput_async": (partial(checks.throughput, async_scheduling=True), 120),
    "served": (served_path, 180),
    "structured": (checks.structured, 90),
    "sampler": (checks.sampler, 60),
    "lora": (checks.lora, 120),
    "quantized": (checks.quantized, 150),
    "speculative": (checks.speculative, 90),
    "transformers_generate": (checks.transformers_generate, 90),
    "decode_profile": (checks.decode_profile, 90),
    "vision": (checks.vision, 90),
}
RESULT = "result.json"


def run_check(name: str, work: Path, dry_run: bool) -> None:
    """In the check's own process: run it, write (figures, failures) to work/<name>.result.json."""
    check, _ = CHECKS[name]
    try:
        figures, failures = check(DRY if dry_run else GPU, work)
    except Exception:  # noqa: BLE001 - the suite reports it; the parent goes on to the next check
        traceback.print_exc()
        figures, failures = {}, [traceback.format_exc(limit=3).strip().splitlines()[-1]]
    (work / f"{name}.{RESULT}").write_text(json.dumps({"figures": figures, "failures": failures}, default=str))


def end_leftovers(pid: int) -> None:
    """The check's process group, and Ray's processes, which start sessions of their own."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for proc in psutil.process_iter(["name", "cmdline"]):
        command = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"].startswith("ray::") or "ray/core/src" in command or "ray/_private" in command:
            proc.kill()


def supervise(name: str, seconds: float, work: Path, dry_run: bool, log) -> dict:
    log.write(f"\n===== {name} (at most {seconds:.0f} s) =====\n")
    log.flush()
    command = [sys.executable, "-m", "benchmarks.gpu_suite", "--check", name, "--work", str(work)]
    start = time.perf_counter()
    proc = subprocess.Popen(command + ["--dry-run"] * dry_run, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        proc.wait(timeout=seconds)
        status = None
    except subprocess.TimeoutExpired:
        status = "timeout"
    end_leftovers(proc.pid)
    elapsed = round(time.perf_counter() - start, 1)
    result_file = work / f"{name}.{RESULT}"
    if status is None and not result_file.exists():
        status = f"crashed (exit {proc.returncode})"
    result = json.loads(result_file.read_text()) if result_file.exists() else {"figures": {}, "failures": []}
    status = status or ("failed" if result["failures"] else "passed")
    return {"name": name, "status": status, "seconds": elapsed, **result}


def summary_line(check: dict) -> str:
    figures = {k: v for k, v in check["figures"].items() if not isinstance(v, (dict, list))}
    nested = {k: v for k, v in check["figures"].items() if isinstance(v, dict)}
    text = " ".join(f"{k}={v}" for k, v in figures.items())
    text += "".join(f" {k}={json.dumps(v, separators=(',', ':'))}" for k, v in nested.items())
    line = f"{check['status'].upper():8} {check['name']:22} {check['seconds']:6.1f}s  {text}"
    return line + "".join(f"\n         ! {failure}" for failure in check["failures"][:8])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="where report.json, summary.txt and suite.log go")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny sizes")
    parser.add_argument("--only", nargs="*", choices=list(CHECKS), help="these checks, not all")
    parser.add_argument("--deadline", type=float, default=480, help="seconds for the whole suite")
    parser.add_argument("--check", choices=list(CHECKS), help=argparse.SUPPRESS)  # one check, in its process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check:
        return run_check(args.check, args.work, args.dry_run)
    if args.dry_run:  # Triton runs in its interpreter on the CPU (read when triton is first imported)
        os.environ["TRITON_INTERPRET"] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-suite-"))  # the model and adapters, built once for every check
    started, report = time.perf_counter(), {"command": " ".join(sys.argv), "dry_run": args.dry_run, "checks": []}
    with open(args.out / "suite.log", "w") as log:
        for name in args.only or CHECKS:
            left = args.deadline - (time.perf_counter() - started)
            if left < 10:
                check = {"name": name, "status": "not run", "seconds": 0.0, "figures": {},
                         "failures": ["the suite's deadline came first"]}
            else:
                check = supervise(name, min(CHECKS[name][1], left), work, args.dry_run, log)
            report["checks"].append(check)
            print(summary_line(check), flush=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["device"] = next((c["figures"].get("device") for c in report["checks"] if c["name"] == "environment"),
                            None) or ("cpu (dry run)" if args.dry_run else "a GPU (its environment check not run)")
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"GPU suite on {report['device']}, {report['seconds']} s: {args.out / 'report.json'}"]
    lines += [summary_line(c) for c in report["checks"]]
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(c["status"] == "passed" for c in report["checks"]) else 1)


if __name__ == "__main__":
    main()
