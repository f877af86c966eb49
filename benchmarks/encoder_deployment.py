"""Text streams beside pictures, served: the same app with a vision-language model's tower in its replica's
steps, and in an encoder deployment of its own (`encoder_config`), in one run, alternating.

Eight text chats stream 128 tokens each (the online benchmark's prompts) while picture chats arrive two at a
time (a fresh 320 x 240 picture each, one output token); reported: the text streams' inter-token latency (p50,
p99) and output tokens/s, and the picture chats' latency (p50). The checkpoint is `benchmarks.images`'s (a CLIP
tower of 6 layers, 256 tokens a picture, the CPU benchmark model's language model), served as
configs/local.yaml serves its model (direct streaming), but with every step's tokens sent, so the gaps are the
steps'. The encoder deployment asks for no CPU of its own here, so on a small machine it shares the replica's
cores: what is measured is the steps no longer waiting for the tower, not more compute.

    python -m benchmarks.encoder_deployment [--rounds 2]
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import openai
from transformers import AutoTokenizer

from benchmarks.images import build_checkpoint
from benchmarks.online_serving import MODEL_ID, drive, local_config_args, serving, workload
from testing.vision_checkpoints import data_url, random_picture

TEXT_STREAMS, TEXT_OUTPUT, PICTURES, PICTURE_CONCURRENCY = 8, 128, 16, 2


def app_args(path: Path, encoder: bool) -> dict:
    args = local_config_args(path, direct_streaming=True, stream_interval_ms=0)  # every step's tokens sent
    if encoder:
        args["llm_configs"][0]["encoder_config"] = {"deployment_config": {"ray_actor_options": {"num_cpus": 0}}}
    return args


async def pictures_beside(url: str, seed: int) -> list[float]:
    """Each picture chat's latency, PICTURE_CONCURRENCY at a time."""
    limit, latencies = asyncio.Semaphore(PICTURE_CONCURRENCY), []

    async def one(client, i: int):
        content = [{"type": "text", "text": "What is in this picture? "},
                   {"type": "image_url", "image_url": {"url": data_url(random_picture(seed * 1000 + i, (320, 240)))}}]
        async with limit:
            start = time.perf_counter()
            await client.chat.completions.create(model=MODEL_ID, max_tokens=1, temperature=0,
                                                 messages=[{"role": "user", "content": content}])
            latencies.append(time.perf_counter() - start)

    async with openai.AsyncClient(base_url=url, api_key="none", max_retries=0, timeout=600) as client:
        await asyncio.gather(*(one(client, i) for i in range(PICTURES)))
    return latencies


async def measure(url: str, tokenizer, seed: int) -> dict:
    text = workload(tokenizer, seed)[:TEXT_STREAMS]
    streams, latencies = await asyncio.gather(
        drive(url, MODEL_ID, text, {"ignore_eos": True}, concurrency=TEXT_STREAMS, output=TEXT_OUTPUT),
        pictures_beside(url, seed))
    return {"text_itl_p50_ms": streams["itl_p50_ms"], "text_itl_p99_ms": streams["itl_p99_ms"],
            "text_output_tok_s": streams["output_tok_s"],
            "picture_chat_p50_ms": round(1000 * statistics.median(latencies), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    path = build_checkpoint(Path(tempfile.mkdtemp(prefix="bench-llava-")))
    tokenizer = AutoTokenizer.from_pretrained(path)
    results = {"in_replica_steps": [], "encoder_deployment": []}
    for _ in range(rounds):
        for mode in results:
            with serving(path, False, True, args=app_args(path, mode == "encoder_deployment")) as url:
                asyncio.run(measure(url, tokenizer, 0))  # warm-up
                results[mode].append(asyncio.run(measure(url, tokenizer, 1)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
