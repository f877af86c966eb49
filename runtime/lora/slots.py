"""Which adapter each device slot holds: pinned while a running sequence uses it, else replaceable, least
recently used first. Loads decided here are carried by the step to every rank's model runner."""

from runtime.lora.adapter import LoRAAdapter


class AdapterSlots:
    def __init__(self, num_slots: int):
        self.names: list[str | None] = [None] * num_slots
        self.pins = [0] * num_slots  # running sequences using each slot
        self.last_used = [0] * num_slots
        self._clock = 0
        self.pending: list[tuple[int, LoRAAdapter]] = []  # loads the next step must apply before its forward
        self.num_loads = 0

    def acquire(self, adapter: LoRAAdapter) -> int | None:
        """Pin a slot holding `adapter`, loading it into an idle slot if needed; None when every slot is busy."""
        self._clock += 1
        if adapter.name in self.names:
            slot = self.names.index(adapter.name)
        else:
            idle = [s for s, pins in enumerate(self.pins) if pins == 0]
            if not idle:
                return None
            slot = min(idle, key=lambda s: (self.names[s] is not None, self.last_used[s]))
            self.names[slot] = adapter.name
            self.pending = [(s, a) for s, a in self.pending if s != slot] + [(slot, adapter)]
            self.num_loads += 1
        self.pins[slot] += 1
        self.last_used[slot] = self._clock
        return slot

    def release(self, slot: int) -> None:
        self.pins[slot] -= 1

    def forget_adapter(self, name: str) -> None:
        """The adapter `name` was unloaded: no new sequence finds it in a slot (sequences running with it keep
        theirs until they end), so a later adapter of that name is loaded afresh."""
        if name in self.names:
            self.names[self.names.index(name)] = None

    def forget(self) -> None:
        """Every slot is empty again (the model was built anew); none may be pinned."""
        assert not any(self.pins), "adapter slots still pinned"
        self.names = [None] * len(self.names)
        self.pending = []

    def take_pending(self) -> list[tuple[int, LoRAAdapter]]:
        pending, self.pending = self.pending, []
        return pending
