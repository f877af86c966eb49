"""Matmul against a fixed weight, `y = x @ weight.T + bias`.

On CPU the float32 weight is packed once, after loading: into the tiles of our
C++ grouped product (`kernels.cpu.grouped_matmul`, as a single expert) where it
serves the shape, else into oneDNN's blocked layout: both beat the MKL path
behind `F.linear` (docs/performance.md has the figures;
`python -m benchmarks.offline_throughput` reports all three). Elsewhere the
plain weight goes to `F.linear`.
"""

import torch
import torch.nn.functional as F

from kernels.cpu import grouped_matmul as cpu_grouped

_PACKED_DTYPES = (torch.float32,)
_BATCH_HINT = 64  # rows oneDNN tunes its blocking for (its speed barely depends on it)


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A packed copy of an `[out, in]` weight (the C++ tiles, else oneDNN's), or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype not in _PACKED_DTYPES:
        return None
    tiles = cpu_grouped.pack(weight.detach().T.unsqueeze(0))
    return tiles if tiles is not None else pack_onednn(weight)


def pack_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-packed copy of an `[out, in]` weight, or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype not in _PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)
    except RuntimeError:  # a oneDNN build without this CPU's packed sgemm: stay on F.linear
        return None


def linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None,
           packed: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, through the packed weight when there is one (then `weight` may be None, and `x` is 2-d)."""
    if packed is None:
        return F.linear(x, weight, bias)
    if packed.dim() == 4:  # the grouped product's tiles, [1, out / tile, in, tile]
        return cpu_grouped.grouped_matmul(x, packed, torch.tensor([x.shape[0]]),
                                          bias=None if bias is None else bias.unsqueeze(0))
    rows = x.shape[0]
    padded = _padded_rows(rows)
    if padded != rows:
        x = F.pad(x, (0, 0, 0, padded - rows))
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")[:rows]


def _padded_rows(rows: int) -> int:
    """`rows` rounded up to one of eight sizes per power of two (so at most 1/8 more rows).

    oneDNN builds a kernel for every input shape it sees, and the memory that
    takes is not given back. A step's token count takes thousands of values, so
    unpadded shapes grew a server's memory without bound.
    """
    step = 1 << max(0, rows.bit_length() - 4)
    return -(-rows // step) * step
