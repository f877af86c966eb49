"""The store's batch index: an owner's batches paged newest first from keys alone, the unfinished ones found
without reading the finished, a store written before the index indexed once, cut-short writes repaired."""

import random

import pytest

from deployments.batch.index import BatchIndex, state_key
from deployments.batch.state import new_batch
from deployments.errors import OpenAIError
from deployments.storage import LocalStore


class CountingStore(LocalStore):
    """A local store that counts the objects read."""

    reads = 0

    def iter_chunks(self, key, chunk_size=1 << 20):
        self.reads += 1
        return super().iter_chunks(key, chunk_size)


def _stored(store, owner, created_at, status="completed"):
    state = new_batch("file-x", "/v1/chat/completions", 3600, "1h", None, "files/x", owner)
    state.batch.created_at = created_at
    state.batch.status = status
    store.put_json(state_key(state.batch.id), state.model_dump())
    return state


def test_an_owners_batches_page_newest_first_from_the_keys_alone(tmp_path):
    store = CountingStore(str(tmp_path))
    index = BatchIndex(store)
    rng = random.Random(0)
    states = [_stored(store, owner, 1_700_000_000 + rng.randrange(20)) for owner in ("a" * 32, None) * 150]
    for state in states:
        index.add(state)
    store.reads = 0
    for owner in ("a" * 32, None):
        expected = [s.batch.id for s in sorted(states, key=lambda s: (s.batch.created_at, s.batch.id), reverse=True)
                    if s.progress.owner == owner]  # the order the manager listed its in-memory batches in
        paged, after, more = [], None, True
        while more:
            ids, more = index.page(owner, after, 7)
            paged += ids
            after = ids[-1]
        assert paged == expected
    assert store.reads == 0
    with pytest.raises(OpenAIError) as e:
        index.page(None, states[0].batch.id, 7)  # another owner's batch is no cursor
    assert e.value.status == 400


def test_a_store_written_before_the_index_is_indexed_once_and_then_only_unfinished_batches_are_read(tmp_path):
    store = CountingStore(str(tmp_path))
    finished = [_stored(store, None, 1_700_000_000 + i) for i in range(50)]
    running = [_stored(store, None, 1_700_000_100 + i, "in_progress") for i in range(3)]
    assert sorted(s.batch.id for s in BatchIndex(store).unfinished()) == sorted(s.batch.id for s in running)
    ids, more = BatchIndex(store).page(None, None, 100)
    assert ids == [s.batch.id for s in running[::-1] + finished[::-1]] and not more
    store.reads = 0
    assert sorted(s.batch.id for s in BatchIndex(store).unfinished()) == sorted(s.batch.id for s in running)
    assert store.reads == len(running)  # the finished batches are not read again


def test_writes_cut_short_by_a_kill_are_repaired_on_start(tmp_path):
    store = LocalStore(str(tmp_path))
    index = BatchIndex(store)
    index.unfinished()  # a store of this code's
    before_state = new_batch("file-x", "/v1/chat/completions", 3600, "1h", None, "files/x", None)
    index.begin(before_state.batch.id)  # killed before its state was saved: it never was
    before_index = _stored(store, None, 1_700_000_000, "validating")
    index.begin(before_index.batch.id)  # killed before its index key
    before_unmark = _stored(store, None, 1_700_000_001)
    index.begin(before_unmark.batch.id)
    index.add(before_unmark)  # killed after its final state, before its marker went
    assert [s.batch.id for s in index.unfinished()] == [before_index.batch.id]
    assert store.list("batch-active/") == [f"batch-active/{before_index.batch.id}"]
    assert index.page(None, None, 10) == ([before_unmark.batch.id, before_index.batch.id], False)
