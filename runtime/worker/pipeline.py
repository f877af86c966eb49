"""A step through the pipeline's stages (`pipeline_parallel_size`), in micro-batches so the stages overlap.

Each rank splits the step's sequences into the same micro-batches (contiguous, of about equal tokens). The first
stage runs its layers on each micro-batch and sends its hidden states and residuals on as soon as it has them,
so the second stage works on the first micro-batch while the first stage runs the next; the last stage applies
the final norm and sends the hidden states back to the first stage, whose LM head and sampler (rank 0's) finish
the step. With S stages and M micro-batches a step takes about (M + S - 1) / (M x S) of one device's time for
the whole model: the rest of the stages' time is the bubble.
"""

from collections.abc import Callable

import torch

from runtime.distributed import PipelineStage, receive_from_stage, send_to_stage
from runtime.worker.step import StepInputs

# a micro-batch's forward pass: its inputs and the (hidden, residual) carried from the previous stage (None on the
# first); the final hidden states on the last stage, else the (hidden, residual) to hand on
StageForward = Callable[[StepInputs, tuple | None], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]


# micro-batches per step for each stage: more shrink the bubble, fewer keep each forward pass's matmuls large
MICROBATCHES_PER_STAGE = 2


class Pipeline:
    def __init__(self, stage: PipelineStage, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.stage, self.microbatches = stage, MICROBATCHES_PER_STAGE * stage.count
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device

    def run(self, inputs: StepInputs, forward: StageForward) -> torch.Tensor | None:
        """The step's final hidden states on the first stage; None on the others."""
        parts = split_microbatches(inputs, self.microbatches)
        stage, sends = self.stage, []
        for tag, part in enumerate(parts):
            carried = None
            if not stage.first:
                both = receive_from_stage(self._empty(2, len(part.input_ids)), stage.index - 1, tag)
                carried = (both[0], both[1])
            out = forward(part, carried)
            if stage.last:
                sends.append(send_to_stage(out, 0, tag))
            else:
                sends.append(send_to_stage(torch.stack(out), stage.index + 1, tag))
        final = None
        if stage.first:
            final = torch.cat([receive_from_stage(self._empty(len(part.input_ids)), stage.count - 1, tag)
                               for tag, part in enumerate(parts)])
        for work in sends:
            work.wait()
        return final

    def _empty(self, *rows: int) -> torch.Tensor:
        return torch.empty((*rows, self.hidden_size), dtype=self.dtype, device=self.device)


def split_microbatches(inputs: StepInputs, count: int) -> list[StepInputs]:
    """The step's sequences in at most `count` contiguous groups of about equal tokens, each as the inputs of a
    forward pass of its own (decodes stay first within each)."""
    total = len(inputs.input_ids)
    bounds, tokens, first = [], 0, 0
    for i, n in enumerate(inputs.query_lens):
        tokens += n
        if tokens * count >= total * (len(bounds) + 1) or i == len(inputs.query_lens) - 1:
            bounds.append((first, i + 1))
            first = i + 1
    parts, row = [], 0
    for start, end in bounds:
        rows = slice(row, row + sum(inputs.query_lens[start:end]))
        row = rows.stop
        parts.append(StepInputs(
            inputs.input_ids[rows], inputs.positions[rows], inputs.query_lens[start:end],
            inputs.context_lens[start:end], inputs.block_tables[start:end],
            max(0, min(end, inputs.num_decodes) - start), [], [],
            lora_slots=inputs.lora_slots[start:end], state_slots=inputs.state_slots[start:end],
            rope_rows=inputs.rope_rows[rows]))
    return parts
