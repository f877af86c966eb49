"""Where the batch manager finds batches in the store without holding them all or reading them all.

- `batches/<id>/state.json`: a batch's state (state.py), the one copy of a finished batch;
- `batch-index/<owner>/<created_at>-<id>`: an empty object per batch, so an owner's batches are paged newest
  first from their keys, and only the page's states are read;
- `batch-active/<id>`: an empty object while the batch is unfinished, so a starting manager reads exactly those.

A batch is written marker, state, index key, and finished state, then marker deleted: a manager killed
between any two writes leaves what `unfinished()` repairs. A store written before the index (states alone) is
indexed once, on the first start that finds no `batch-index.json`.
"""

from deployments.api.pagination import cursor_window
from deployments.batch.state import TERMINAL, BatchState
from deployments.storage import MissingObjectError, ObjectStore

_INDEXED = "batch-index.json"


def state_key(batch_id: str) -> str:
    return f"batches/{batch_id}/state.json"


class BatchIndex:
    def __init__(self, store: ObjectStore):
        self.store = store

    @staticmethod
    def _owner_prefix(owner: str | None) -> str:
        return f"batch-index/{owner or 'anyone'}/"  # an owner is an API key's hex digest

    @staticmethod
    def _active_key(batch_id: str) -> str:
        return f"batch-active/{batch_id}"

    def _index_key(self, state: BatchState) -> str:
        return f"{self._owner_prefix(state.progress.owner)}{state.batch.created_at:012d}-{state.batch.id}"

    def begin(self, batch_id: str) -> None:
        """Mark a new batch unfinished, before its state is first saved."""
        self.store.put(self._active_key(batch_id), b"")

    def add(self, state: BatchState) -> None:
        """List a batch under its owner, once its state is saved."""
        self.store.put(self._index_key(state), b"")

    def finish(self, batch_id: str) -> None:
        """Unmark a batch, once its final state is saved."""
        self.store.delete(self._active_key(batch_id))

    def read(self, batch_id: str) -> BatchState | None:
        try:
            return BatchState.model_validate(self.store.get_json(state_key(batch_id)))
        except MissingObjectError:
            return None

    def unfinished(self) -> list[BatchState]:
        """The unfinished batches' states, the index repaired where a write was cut short."""
        if self.store.size(_INDEXED) is None:
            self._index_earlier_store()
        states = []
        for key in self.store.list("batch-active/"):
            batch_id = key.removeprefix("batch-active/")
            state = self.read(batch_id)
            if state is None or state.batch.status in TERMINAL:  # killed before its state, or after its end
                self.finish(batch_id)
                continue
            self.add(state)  # killed before its index key
            states.append(state)
        return states

    def _index_earlier_store(self) -> None:
        for key in self.store.list("batches/"):
            if key.endswith("/state.json"):
                state = BatchState.model_validate(self.store.get_json(key))
                if state.batch.status not in TERMINAL:
                    self.begin(state.batch.id)
                self.add(state)
        self.store.put_json(_INDEXED, {"version": 1})

    def page(self, owner: str | None, after: str | None, limit: int) -> tuple[list[str], bool]:
        """An owner's batch ids after `after`, newest first (ties: larger id first), at most `limit`, and whether
        more follow; from the index's keys alone."""
        prefix = self._owner_prefix(owner)
        entries = []
        for key in self.store.list(prefix):
            created_at, _, batch_id = key.removeprefix(prefix).partition("-")
            entries.append((int(created_at), batch_id))
        newest_first = [batch_id for _, batch_id in sorted(entries, reverse=True)]
        return cursor_window(newest_first, after, limit, id_of=lambda batch_id: batch_id)
