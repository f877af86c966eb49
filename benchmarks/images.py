"""Pictures through the offline engine against transformers' LLaVA, in one run, on one random-weight checkpoint:
time to first token of a one-picture chat (cold, and with the picture's prefix cached: transformers keeps no
cache across requests, so its figure is the cold one), and pictures per second through the vision encoder and
projector (batches of 8, the two encoders timed in turn).

    python -m benchmarks.images [--pictures 6]

The checkpoint: a CLIP tower of 6 layers, hidden 256, 224-pixel pictures in 14-pixel patches (256 tokens a
picture), read at its second-to-last layer; the CPU benchmark model's Qwen2 language model shape."""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from benchmarks.common import CPU_MODEL
from runtime import LLMEngine, SamplingParams
from runtime.config import EngineConfig
from testing.vision_checkpoints import build_llava_dir, random_picture

VISION = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=4)
TEXT = dict(hidden_size=CPU_MODEL["hidden_size"], intermediate_size=CPU_MODEL["intermediate_size"],
            num_hidden_layers=CPU_MODEL["num_layers"], num_attention_heads=CPU_MODEL["num_heads"],
            num_key_value_heads=CPU_MODEL["num_kv_heads"], initializer_range=0.02)
CONVERSATION = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture? "},
                                             {"type": "image"}]}]


def ours(path: Path, pictures: list, dtype: str):
    engine = LLMEngine(EngineConfig(model=str(path), dtype=dtype, max_model_len=1024))
    text = engine.tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    one = SamplingParams(max_tokens=1, temperature=0)

    def first_token(picture, request_id: str) -> float:
        start = time.perf_counter()
        ids, images = engine.validator.process_images(text, [picture], add_special_tokens=False)
        engine.add_request(request_id, ids, one, images=images)
        while engine.has_unfinished_requests():
            engine.step()
        return time.perf_counter() - start

    first_token(random_picture(999, (224, 224)), "warm")
    cold = [first_token(p, f"cold-{i}") for i, p in enumerate(pictures)]
    cached = [first_token(p, f"cached-{i}") for i, p in enumerate(pictures)]
    device = engine.runner.device
    tensors = [{name: t.to(device) for name, t in engine.validator.process_images(text, [p])[1][0].tensors.items()}
               for p in pictures]
    return {"ttft_cold_s": statistics.median(cold), "ttft_cached_s": statistics.median(cached)}, \
        lambda: pictures_per_second(engine.runner.model.encode_images, tensors)


def theirs(path: Path, pictures: list, device: str, dtype: str):
    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    text = processor.apply_chat_template(CONVERSATION, add_generation_prompt=True)

    def first_token(picture) -> float:
        start = time.perf_counter()
        inputs = processor(text=[text], images=[picture], return_tensors="pt").to(device)
        model.generate(**inputs, max_new_tokens=1, do_sample=False)
        return time.perf_counter() - start

    first_token(random_picture(999, (224, 224)))
    cold = [first_token(p) for p in pictures]
    tensors = [{"pixel_values": processor.image_processor(p, return_tensors="pt")["pixel_values"].to(device)}
               for p in pictures]
    return {"ttft_cold_s": statistics.median(cold)}, lambda: pictures_per_second(lambda batch: model.get_image_features(
        torch.cat([t["pixel_values"] for t in batch]), vision_feature_layer=-2,
        vision_feature_select_strategy="default"), tensors)


@torch.inference_mode()
def pictures_per_second(encode, tensors: list[dict], batch: int = 8) -> float:
    encode(tensors[:batch])  # warm
    synchronize = torch.cuda.synchronize if tensors[0]["pixel_values"].is_cuda else lambda: None
    synchronize()
    start = time.perf_counter()
    for i in range(0, len(tensors), batch):
        encode(tensors[i : i + batch])
    synchronize()
    return len(tensors) / (time.perf_counter() - start)


def build_checkpoint(path: Path) -> Path:
    return build_llava_dir(path, image_size=224, patch_size=14, vision=VISION, text=TEXT)


def compare(path: Path, pictures: list, device: str = "cpu", dtype: str = "float32") -> dict:
    """Both sides' figures on `path` (`build_checkpoint`'s), the two encoders timed in turn three times (so
    neither has the machine's quieter moments to itself)."""
    (our_ttft, our_encoder), (their_ttft, their_encoder) = ours(path, pictures, dtype), theirs(path, pictures,
                                                                                                   device, dtype)
    rates = {"ours": [], "transformers": []}
    for _ in range(3):
        rates["ours"].append(our_encoder())
        rates["transformers"].append(their_encoder())
    return {"ours": {**our_ttft, "encoder_pictures_per_s": statistics.median(rates["ours"])},
            "transformers": {**their_ttft, "encoder_pictures_per_s": statistics.median(rates["transformers"])}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pictures", type=int, default=8)
    args = parser.parse_args()
    path = build_checkpoint(Path(tempfile.mkdtemp(prefix="bench-llava-")))
    pictures = [random_picture(seed, (320, 240)) for seed in range(args.pictures)]
    print(json.dumps({**compare(path, pictures), "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
