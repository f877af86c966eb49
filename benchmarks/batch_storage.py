"""Batch throughput with the batch storage on S3: lines/s with `storage_uri` on local disk, then on S3 reached
with a cluster's round trip, then on local disk again (a shared machine drifts within a run).

A batch stores its results as it goes: each commit writes the output (and error) lines of the windows done so
far as part objects, then the batch's state; at the end the parts are concatenated into the output file. On
S3 each of those is a round trip (10-30 ms from a cluster in the bucket's region). The S3 here is moto's
S3-compatible server on this machine, behind benchmarks/slow_link.py with RTT_MS of round trip (measured and
reported). The server and the batch are batch_throughput.py's: configs/local.yaml's application on the tiny
Qwen2 model, LINES chat lines of max_tokens 16, timed from `batches.create` to `completed`, ROUNDS batches on
each server after a warm-up batch.

Run: python -m benchmarks.batch_storage [--rtt-ms 20] [--lines 10000] [--device cpu|cuda]
"""

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import boto3
import openai
import torch
from moto.server import ThreadedMotoServer

from benchmarks.batch_throughput import WARMUP_LINES, run_batch, serving
from benchmarks.common import report
from benchmarks.slow_link import SlowLink
from testing.helpers import free_port
from testing.model_factory import build_model_dir

ROUNDS = 3
BUCKET = "batch-storage-bench"


def s3_behind_a_slow_link(rtt_ms: float) -> tuple[ThreadedMotoServer, float]:
    """moto's S3 server, reached by boto3 here and in Ray's workers (started after) through a link of `rtt_ms`
    round trip; returns the server and the median time of a HEAD request through the link, in ms."""
    server_port, link_port = free_port(), free_port()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=server_port, verbose=False)
    server.start()
    SlowLink(server_port, link_port, rtt_ms / 2000)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{link_port}"})
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        s3.head_bucket(Bucket=BUCKET)
        times.append(time.perf_counter() - start)
    return server, round(1000 * statistics.median(times), 1)


def batches_lines_s(path: Path, device: str, storage_uri: str, lines: int) -> list[float]:
    with serving(path, device, storage_uri=storage_uri) as url:
        client = openai.Client(base_url=url, api_key="none", max_retries=0)
        run_batch(client, WARMUP_LINES)
        return [run_batch(client, lines)["lines_s"] for _ in range(ROUNDS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    server, head_ms = s3_behind_a_slow_link(args.rtt_ms)
    path = build_model_dir(Path(tempfile.mkdtemp(prefix="batch-storage-")), "qwen2")
    local_before = batches_lines_s(path, args.device, f"file://{tempfile.mkdtemp(prefix='bench-storage-')}",
                                   args.lines)
    s3 = batches_lines_s(path, args.device, f"s3://{BUCKET}/run", args.lines)
    local_after = batches_lines_s(path, args.device, f"file://{tempfile.mkdtemp(prefix='bench-storage-')}",
                                  args.lines)
    server.stop()
    local = statistics.median(local_before + local_after)
    report("batch_storage", device=args.device, cpus=os.cpu_count(), lines=args.lines, rtt_ms=args.rtt_ms,
           s3_head_request_ms=head_ms, local_lines_s_before_after=[local_before, local_after], s3_lines_s=s3,
           s3_over_local=round(statistics.median(s3) / local, 3))


if __name__ == "__main__":
    main()
