"""A stand-in trainer for tests: it leads a weight-transfer group (runtime.worker.weight_transfer) and broadcasts a
checkpoint's tensors to the engines that joined, in `checkpoint_update`'s order.

Run: python -m testing.weight_trainer CHECKPOINT_DIR ADDRESS PORT WORLD_SIZE
"""

import sys
from pathlib import Path

from safetensors.torch import load_file

from runtime.worker.weight_transfer import WeightGroup


def checkpoint_update(path: Path) -> tuple[dict, list]:
    """The body of an update from `path`'s tensors (names, dtypes, shapes, in a fixed order) and the tensors."""
    tensors = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    names = sorted(tensors)
    body = {"names": names, "dtypes": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(tensors[n].shape) for n in names]}
    return body, [tensors[n] for n in names]


def main() -> None:
    path, address, port, world_size = sys.argv[1:5]
    _, tensors = checkpoint_update(Path(path))
    WeightGroup.lead(address, int(port), int(world_size)).send(tensors)


if __name__ == "__main__":
    main()
