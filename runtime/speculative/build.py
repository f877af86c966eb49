"""The engine's speculator for its `speculative_config`, or None when it has none."""

from transformers import PreTrainedTokenizerBase

from runtime.config import EngineConfig
from runtime.errors import InvalidInputError
from runtime.layers.sliding_window import kv_window
from runtime.models.spec import ModelSpec
from runtime.speculative.ngram import NgramProposer
from runtime.speculative.speculator import Speculator
from runtime.worker.model_runner import ModelRunner


def build_speculator(config: EngineConfig, spec: ModelSpec, tokenizer: PreTrainedTokenizerBase,
                     eos_token_ids: set[int], runner: ModelRunner) -> Speculator | None:
    sc = config.speculative_config
    if sc is None:
        return None
    if sc.method == "ngram":
        proposer = NgramProposer(sc.prompt_lookup_min, sc.prompt_lookup_max)
    elif sc.method == "mtp":
        from runtime.speculative.mtp import MtpProposer

        proposer = MtpProposer(runner, spec)
    else:
        from runtime.speculative.draft_model import DraftModelProposer

        if kv_window(spec.hf_config, spec.max_model_len) is not None:  # the draft's layers would read freed blocks
            raise InvalidInputError("speculative_config", "a draft model cannot run beside a target whose every "
                                    "layer slides (its KV blocks before the window are freed); use method ngram")

        proposer = DraftModelProposer(config, spec, tokenizer, eos_token_ids, runner.num_blocks)
    return Speculator(sc, proposer, spec.max_model_len)
