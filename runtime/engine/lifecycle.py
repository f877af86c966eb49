"""What reinforcement-learning frameworks (verl, OpenRLHF, slime) drive a serving engine through between rollouts, as
vLLM and SGLang offer it: pause and resume generation, new weights from a checkpoint, a prefix-cache reset, and sleep
(weights and KV cache released, the process kept) and wake up; and a LoRA adapter unloaded.

Each runs on the engine's own thread between two steps (and while no other thread applies the text stage), and returns
the deltas it produced, with their text (the step still in flight under async scheduling, completed first; the requests
a pause with mode "abort" ended). New weights and sleep send every running sequence back to wait: it is recomputed from
its first token, its output so far kept, so no token after the change reads keys and values of the old weights; and the
weights' version changes (the trainer's name for them, or the new checkpoint's fingerprint), so no block computed before
is hit again, here or from the shared tier. A prefix-cache reset and sleep keep the version. While paused or asleep the
engine takes requests but runs no step."""

from pathlib import Path

from runtime.errors import InvalidInputError
from runtime.models.weights_identity import checkpoint_fingerprint, updated_version
from runtime.outputs import RequestDelta
from runtime.worker.weight_transfer import BACKENDS

PAUSE_MODES = ("keep", "abort")  # requests in flight wait for `resume`, or end with finish_reason "abort"
# the operations
LIFECYCLE = ("pause", "resume", "reset_prefix_cache", "update_weights", "init_weights_update_group",
             "update_weights_from_distributed", "sleep", "wake_up", "unload_adapter")


class EngineLifecycle:
    """Mixed into LLMEngine (its scheduler, block manager, runner, requests and step completion)."""

    paused = False
    asleep = False

    @property
    def runnable(self) -> bool:
        """Whether a step has work to do: requests in flight, and neither paused nor asleep."""
        return self.has_unfinished_requests() and not self.paused and not self.asleep

    def pause(self, mode: str = "keep") -> list[RequestDelta]:
        if mode not in PAUSE_MODES:
            raise InvalidInputError("mode", f"must be one of {PAUSE_MODES}, got {mode!r}")
        deltas = self._settle()
        if mode == "abort":
            deltas += self.text.apply([self._aborted(request) for request in list(self.requests.values())])
        self.paused = True
        return deltas

    def resume(self) -> list[RequestDelta]:
        self.paused = False
        return []

    def reset_prefix_cache(self) -> list[RequestDelta]:
        self.block_manager.reset_prefix_cache()
        return []

    def update_weights(self, model_path: str, weight_version: str | None = None) -> list[RequestDelta]:
        """Load a checkpoint of the served model's architecture and shapes (a trainer's new weights), named
        `weight_version` (else by its fingerprint)."""
        path, serving = Path(model_path), self.spec.serving
        return self._new_weights("model_path", lambda: self.runner.load_weights_from(path), lambda: (
            updated_version(serving, weight_version) if weight_version else checkpoint_fingerprint(path, serving)))

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  backend: str = "gloo") -> list[RequestDelta]:
        """Join a trainer's weight-transfer group (runtime.worker.weight_transfer), SGLang's way; returns once every
        member has joined (the trainer, rank 0, joins at the same time)."""
        if backend not in BACKENDS:
            raise InvalidInputError("backend", f"must be one of {BACKENDS}, got {backend!r}")
        self.runner.join_weight_group(master_address, master_port, rank_offset, world_size, backend)
        return []

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        weight_version: str | None = None) -> list[RequestDelta]:
        """Receive checkpoint tensors (by name, dtype and shape, in the order the trainer broadcasts them) and run
        on them, as `update_weights` runs on a checkpoint's; `weight_version`: what the trainer names the update."""
        if not len(names) == len(dtypes) == len(shapes):
            raise InvalidInputError("names", "names, dtypes and shapes must have one entry per tensor")
        return self._new_weights("names", lambda: self.runner.load_weights_from_group(names, dtypes, shapes),
                                 lambda: updated_version(self.block_manager.weights_version, weight_version))

    def sleep(self) -> list[RequestDelta]:
        self._changes_weights("sleep")
        deltas = self._settle()
        if not self.asleep:
            self._recompute_all()
            self.runner.sleep()
            self.block_manager.reset_prefix_cache()
            self.asleep = True
        return deltas

    def wake_up(self) -> list[RequestDelta]:
        if self.asleep:
            self.runner.wake_up()
            self.asleep = False
        return []

    def unload_adapter(self, name: str) -> list[RequestDelta]:
        """A LoRA adapter unloaded: later requests naming it load it afresh (its files may have changed)."""
        if self.adapter_slots is not None:
            self.adapter_slots.forget_adapter(name)
        return []

    def _new_weights(self, param: str, load, version) -> list[RequestDelta]:
        """Run on new weights, which `load` gives the runner and `version()` names: every running sequence
        recomputes on them, and no block of the old ones is hit again, here or (through the shared tier) by a
        replica holding the new ones. `param`: what a refusal names."""
        self._changes_weights("update weights")
        if self.asleep:
            raise InvalidInputError(param, "the engine is asleep: wake it up first")
        deltas = self._settle()
        self._recompute_all()
        load()
        self.block_manager.new_weights(version())
        for request in self.requests.values():
            for seq in request.seqs:
                seq.block_hashes = []  # chained from the old version
        return deltas

    def _changes_weights(self, what: str) -> None:
        method = self.config.speculative_config.method if self.config.speculative_config else None
        if method in ("mtp", "draft_model"):
            raise InvalidInputError("speculative_config", f"cannot {what} beside a {method} proposer, whose own "
                                    "weights and KV cache would be left as they are")

    def _settle(self) -> list[RequestDelta]:
        """Complete the step still in flight (async scheduling), so that no sequence has a token on the device."""
        launched, self._launched = self._launched, None
        return [] if launched is None else self.text.apply(self._complete(launched))

    def _recompute_all(self) -> None:
        self.scheduler.preempt_all()
        if self.adapter_slots is not None:
            self.adapter_slots.forget()

    def _aborted(self, request) -> RequestDelta:
        """Finish every unfinished completion of `request` with reason "abort"; its last delta (to which the text stage
        adds the text not yet released)."""
        delta = self.post.end_unfinished(request, "abort")
        delta.finished = True
        del self.requests[request.request_id]
        return delta
