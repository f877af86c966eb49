"""transformers' processors that need torchvision, run as oracles where the CPU torch build cannot import it (the
registry's torchvision is built against CUDA torch: its compiled extension does not load here). The torchvision
release paired with this torch is installed apart (`pip install --target`, no dependencies) and imported in a
subprocess once the schemas of the two compiled operators its import registers fakes for are declared; only its
pure-torch transforms run. Run as a script: `python -m testing.torchvision_oracle CHECKPOINT REQUEST OUT`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def install_torchvision(target: Path) -> Path:
    """torchvision for this torch (torch 2.x pairs with torchvision 0.(x + 15)), installed into `target`."""
    minor = int(torch.__version__.split(".")[1])
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    f"torchvision==0.{minor + 15}.*"], check=True)
    return target


def run_processor(torchvision: Path, checkpoint: Path, text: str, pictures: list[Path], out: Path) -> dict:
    """The checkpoint's own processor (`AutoProcessor`) on `text` and the pictures' files, and its image processor
    alone (for what the processor leaves out of its output): {"input_ids", "pixel_values", "aspect_ratios", ...}."""
    request = out.with_suffix(".json")
    request.write_text(json.dumps({"text": text, "pictures": [str(p) for p in pictures]}))
    env = {**os.environ, "PYTHONPATH": f"{torchvision}:{Path(__file__).resolve().parent.parent}"}
    subprocess.run([sys.executable, "-m", "testing.torchvision_oracle", str(checkpoint), str(request), str(out)],
                   check=True, env=env)
    return torch.load(out)


def _main(checkpoint: str, request: str, out: str) -> None:
    for op in ("nms", "qnms"):
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    from PIL import Image
    from transformers import AutoProcessor

    asked = json.loads(Path(request).read_text())
    processor = AutoProcessor.from_pretrained(checkpoint)
    pictures = [Image.open(p) for p in asked["pictures"]]
    batch = processor(text=[asked["text"]], images=pictures, return_tensors="pt")
    alone = processor.image_processor(images=pictures, return_tensors="pt")
    torch.save({**alone, **batch}, out)


if __name__ == "__main__":
    _main(*sys.argv[1:])
