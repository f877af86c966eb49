"""A batch's stored state: the public OpenAI object apart from the private progress, and the earlier flat format."""

import concurrent.futures
import json

import pytest

from deployments.batch.state import BatchState, Progress, new_batch

EARLIER_IN_PROGRESS = {  # a state.json as the earlier code wrote it: one flat dict, progress fields underscored
    "id": "batch_earlier", "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
    "input_file_id": "file-earlier", "completion_window": "24h", "status": "in_progress",
    "output_file_id": None, "error_file_id": None, "output_file_uri": None, "error_file_uri": None,
    "created_at": 1700000000, "in_progress_at": 1700000001, "expires_at": 4102444800, "finalizing_at": None,
    "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
    "request_counts": {"total": 5, "completed": 2, "failed": 0}, "metadata": {"job": "nightly"},
    "_input_uri": "files/file-earlier.jsonl", "_lines_done": 2, "_windows_done": 1, "_owner": None,
}
EARLIER_EXPIRED = {
    **EARLIER_IN_PROGRESS, "status": "expired", "expired_at": 1700090000, "output_file_id": "file-earlier-output",
    "output_file_uri": "file:///data/files/file-earlier-output.jsonl", "metadata": None, "_owner": "key-digest",
    "errors": {"object": "list", "data": [{"code": "x", "message": "y", "param": None, "line": None}]},
    "_expired": True,
}


def public(flat: dict) -> dict:
    """What the earlier code returned to clients: the flat dict less its underscored fields."""
    return {k: v for k, v in flat.items() if not k.startswith("_")}


@pytest.mark.parametrize("flat", [EARLIER_IN_PROGRESS, EARLIER_EXPIRED], ids=["in-progress", "expired"])
def test_the_earlier_flat_state_is_read_and_clients_get_the_same_json(flat):
    state = BatchState.model_validate(flat)
    assert json.dumps(state.batch.model_dump()) == json.dumps(public(flat))
    assert state.progress == Progress(input_uri="files/file-earlier.jsonl", owner=flat["_owner"], lines_done=2,
                                      windows_done=1, expired="_expired" in flat)


def test_a_new_batch_has_the_earlier_json_shape_and_its_state_round_trips():
    state = new_batch("file-1", "/v1/completions", 3600, "1h", {"a": "b"}, "s3://in/x.jsonl", None)
    batch = state.batch.model_dump()
    expected = {**public(EARLIER_IN_PROGRESS), "id": batch["id"], "endpoint": "/v1/completions",
                "input_file_id": "file-1", "completion_window": "1h", "status": "validating",
                "created_at": batch["created_at"],
                "in_progress_at": None, "expires_at": batch["created_at"] + 3600,
                "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": {"a": "b"}}
    assert json.dumps(batch) == json.dumps(expected)
    stored = json.loads(json.dumps(state.model_dump()))
    assert set(stored) == {"batch", "progress"} and BatchState.model_validate(stored) == state
    assert state.progress == Progress(input_uri="s3://in/x.jsonl")


def test_expires_at_stays_within_int64_for_every_window_a_batch_may_ask_for():
    """The longest window the body takes (999,999 days) ends in the year ~4,700; one digit more is refused."""
    from pydantic import ValidationError

    from deployments.api.batches.protocol import BatchCreateRequest, window_seconds

    longest = BatchCreateRequest(input_file_id="file-1", endpoint="/v1/completions", completion_window="999999d")
    seconds = window_seconds(longest.completion_window)
    state = new_batch("file-1", "/v1/completions", seconds, longest.completion_window, None, "x", None)
    assert state.batch.expires_at == state.batch.created_at + 999_999 * 86400 < 2**63 - 1
    assert json.loads(json.dumps(state.model_dump()))["batch"]["expires_at"] == state.batch.expires_at
    for refused in ("1000000d", "24h\n", "9" * 40 + "d", "-1d", "1w"):
        with pytest.raises(ValidationError):
            BatchCreateRequest(input_file_id="file-1", endpoint="/v1/completions", completion_window=refused)
        assert window_seconds(refused) is None


@pytest.mark.parametrize("cancelling, final", [(False, "failed"), (True, "cancelled")])
def test_a_batch_whose_input_is_gone_ends_instead_of_retrying_forever(tmp_path, cancelling, final):
    """Its input deleted before it was read (a resume, or a delete between validation and processing): the
    job ends, failed with input_file_missing (or cancelled, if it was being cancelled), rather than retrying."""
    import asyncio

    from deployments.batch.files import FileLimits, FileStore
    from deployments.batch.job import BatchJob, BatchLimits
    from deployments.storage import open_store

    store = open_store(f"file://{tmp_path}")
    state = new_batch("file-gone", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-gone"), None)
    state.batch.status = "cancelling" if cancelling else "in_progress"

    async def never_called(request, request_id):
        raise AssertionError("no line can be sent: there is no input")

    job = BatchJob(state, store, FileStore(store, FileLimits(1 << 20, 100)), {"m"}, never_called, BatchLimits())
    asyncio.run(asyncio.wait_for(job.run(), timeout=30))
    assert job.batch.status == final
    if final == "failed":
        assert job.batch.errors.data[0].code == "input_file_missing"
    saved = BatchState.model_validate(store.get_json(job.state_key()))
    assert saved.batch.status == final


def _job(store, state, send, concurrency=4):
    from deployments.batch.files import FileLimits, FileStore
    from deployments.batch.job import BatchJob, BatchLimits

    return BatchJob(state, store, FileStore(store, FileLimits(1 << 20, 10_000)), {"m"}, send,
                    BatchLimits(concurrency=concurrency))


def _chat_lines(count: int) -> bytes:
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "max_tokens": 4,
                                                                      "messages": [{"role": "user", "content": "x"}]}}
    return "".join(json.dumps({"custom_id": f"c-{i}", **line}) + "\n" for i in range(count)).encode()


def test_windows_run_ahead_of_a_slow_tail_commit_in_order_and_a_killed_run_resumes_exactly_once(tmp_path):
    """A slow line holds its window's commit but not the lines after it; the job killed mid-run and resumed
    from its stored state writes every line once, in input order, with counts of the committed windows."""
    import asyncio

    from deployments.batch.files import FileStore
    from deployments.storage import open_store

    store = open_store(f"file://{tmp_path}")
    total = 300
    store.put(FileStore.content_key("file-in"), _chat_lines(total))
    sent: list[str] = []
    in_flight = peak = 0
    sent_during_tail = 0

    async def send(request, request_id):
        nonlocal in_flight, peak, sent_during_tail
        sent.append(request.custom_id)
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.5 if request.custom_id == "c-3" else 0.001)  # the first window's tail
        finally:
            in_flight -= 1
        if request.custom_id == "c-3":
            sent_during_tail = len(sent)
        return 200, {"echo": request.custom_id}

    async def killed_then_resumed():
        loop = asyncio.get_running_loop()
        killed_threads = concurrent.futures.ThreadPoolExecutor()
        loop.set_default_executor(killed_threads)
        state = new_batch("file-in", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-in"), None)
        job = _job(store, state, send)
        run = asyncio.get_running_loop().create_task(job.run())
        while len(sent) < 150:
            await asyncio.sleep(0.01)
        run.cancel()  # the manager is killed
        await asyncio.gather(run, return_exceptions=True)
        # ... and with it the store writes its threads had under way, which a cancel alone lets finish later
        killed_threads.shutdown(wait=True)
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
        saved = BatchState.model_validate(store.get_json(job.state_key()))
        assert saved.batch.request_counts.completed == saved.progress.lines_done  # no line counted uncommitted
        resumed = _job(store, saved, send)
        await resumed.run()
        return resumed

    job = asyncio.run(asyncio.wait_for(killed_then_resumed(), timeout=60))
    assert sent_during_tail > 4 * job.limits.window and peak <= 4  # later windows ran, within the capacity
    assert job.batch.status == "completed" and job.batch.request_counts.completed == total
    out = [json.loads(line) for line in store.iter_lines(FileStore.content_key(job.batch.output_file_id))]
    assert [r["custom_id"] for r in out] == [f"c-{i}" for i in range(total)]
    assert [r["response"]["body"]["echo"] for r in out] == [f"c-{i}" for i in range(total)]


def test_windows_done_while_an_earlier_one_waits_are_committed_with_it_as_one_part_and_one_save(tmp_path):
    """A slow first line holds the commit of its window while the look-ahead's windows finish; then they are
    written as one output part and saved once (S3 charges a round trip per write), and the output is whole."""
    import asyncio

    from deployments.batch.files import FileStore
    from deployments.storage.local import LocalStore

    class CountingStore(LocalStore):
        writes: list[tuple[str, int]] = []  # (key, lines) of each part or state written while the lines run

        def put_stream(self, key, chunks):
            data = b"".join(chunks)
            if "/parts/" in key or key.endswith("state.json"):
                self.writes.append((key.rsplit("/", 1)[1], data.count(b"\n")))
            return super().put_stream(key, [data])

    store = CountingStore(str(tmp_path))
    total = 40  # ten windows of 4 (concurrency 2); the look-ahead is 8 windows
    store.put(FileStore.content_key("file-in"), _chat_lines(total))
    others_done = asyncio.Event()

    async def send(request, request_id):
        if request.custom_id == "c-0":
            await others_done.wait()
        elif request.custom_id == "c-31":  # the last line the look-ahead lets start before c-0 is in
            others_done.set()
        return 200, {"echo": request.custom_id}

    state = new_batch("file-in", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-in"), None)
    job = _job(store, state, send, concurrency=2)
    asyncio.run(asyncio.wait_for(job.run(), timeout=60))
    assert job.batch.status == "completed" and job.batch.request_counts.completed == total
    parts = [(key, lines) for key, lines in store.writes if key.endswith("-out.jsonl")]
    assert parts[0] == ("00000000-out.jsonl", 32)  # windows 0-7 in one part
    assert sum(lines for _, lines in parts) == total and len(parts) <= 3
    assert not [key for key, _ in store.writes if key.endswith("-err.jsonl")]  # no error line, no error part
    first_save = next(i for i, (key, _) in enumerate(store.writes) if key == "state.json" and i > 0
                      and store.writes[i - 1][0] == "00000000-out.jsonl")
    assert first_save == 1 + store.writes.index(("00000000-out.jsonl", 32))
    out = [json.loads(line) for line in store.iter_lines(FileStore.content_key(job.batch.output_file_id))]
    assert [r["custom_id"] for r in out] == [f"c-{i}" for i in range(total)]
    assert not store.list(f"batches/{job.id}/parts/")


def test_a_resumed_batch_deletes_the_parts_a_killed_run_wrote_past_its_saved_windows(tmp_path):
    """A run killed between writing a group's parts and saving it leaves parts past the saved windows; the
    resumed run deletes them, so an error part that the new run's group does not rewrite is not concatenated
    into the error file."""
    import asyncio

    from deployments.batch.files import FileStore
    from deployments.storage import open_store

    store = open_store(f"file://{tmp_path}")
    total = 12
    store.put(FileStore.content_key("file-in"), _chat_lines(total))
    state = new_batch("file-in", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-in"), None)
    state.batch.status = "in_progress"
    state.batch.request_counts.total = total
    state.batch.request_counts.completed = 4
    state.progress.windows_done, state.progress.lines_done = 1, 4  # window 0 (lines 1-4) was saved
    saved = "".join(json.dumps({"custom_id": f"c-{i}", "response": {"body": {"echo": f"c-{i}"}}}) + "\n"
                    for i in range(4))
    store.put(f"batches/{state.batch.id}/parts/00000000-out.jsonl", saved.encode())
    # the killed run's unsaved group, windows 1-2: its output part, and an error part for a line that failed then
    store.put(f"batches/{state.batch.id}/parts/00000001-out.jsonl", b'{"custom_id": "c-4"}\n')
    store.put(f"batches/{state.batch.id}/parts/00000001-err.jsonl", b'{"custom_id": "c-5", "error": "lost"}\n')

    async def send(request, request_id):
        return (400, {"error": "refused"}) if request.custom_id == "c-10" else (200, {"echo": request.custom_id})

    job = _job(store, state, send, concurrency=2)
    asyncio.run(asyncio.wait_for(job.run(), timeout=60))
    assert job.batch.status == "completed"
    assert (job.batch.request_counts.completed, job.batch.request_counts.failed) == (total - 1, 1)
    out = [json.loads(line) for line in store.iter_lines(FileStore.content_key(job.batch.output_file_id))]
    assert [r["custom_id"] for r in out] == [f"c-{i}" for i in range(total) if i != 10]
    assert [r["response"]["body"]["echo"] for r in out] == [r["custom_id"] for r in out]
    errors = [json.loads(line) for line in store.iter_lines(FileStore.content_key(job.batch.error_file_id))]
    assert [r["custom_id"] for r in errors] == ["c-10"]


def test_batches_share_their_model_capacity_in_turn_and_it_follows_a_resize(tmp_path):
    """Two batches on one model's capacity get its slots alternately; a larger limit (more replicas) lets
    more lines run at once."""
    import asyncio

    from deployments.batch.capacity import Capacity
    from deployments.batch.files import FileStore
    from deployments.storage import open_store

    store = open_store(f"file://{tmp_path}")
    store.put(FileStore.content_key("file-in"), _chat_lines(60))
    capacity = Capacity(2)
    order: list[str] = []
    in_flight = peak_after_resize = 0

    forty_sent = asyncio.Event()

    async def send(request, request_id):
        nonlocal in_flight, peak_after_resize
        order.append(request_id.split("-req_")[0])
        if len(order) == 40:
            forty_sent.set()
        in_flight += 1
        if capacity.limit == 6:
            peak_after_resize = max(peak_after_resize, in_flight)
        await asyncio.sleep(0.002)
        in_flight -= 1
        return 200, {}

    async def two_batches():
        jobs = []
        for _ in range(2):
            state = new_batch("file-in", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-in"),
                              None)
            state.batch.status = "in_progress"
            jobs.append(_job(store, state, send))
            jobs[-1].slots = lambda model: capacity
        runs = [asyncio.get_running_loop().create_task(job.run()) for job in jobs]
        await forty_sent.wait()
        capacity.resize(6)
        await asyncio.gather(*runs)
        return [job.id for job in jobs]

    first, second = asyncio.run(asyncio.wait_for(two_batches(), timeout=60))
    assert sorted(order) == sorted([first] * 60 + [second] * 60)
    # once both are sending (a batch reads its input in a thread first), they take turns
    both = max(order.index(first), order.index(second))
    window = order[both:both + 30]
    assert abs(window.count(first) - window.count(second)) <= 2
    assert 2 < peak_after_resize <= 6 and capacity.used == 0


def test_a_keys_share_of_batch_slots_does_not_grow_with_its_batches():
    """Slots go to the owners in turn, then to each owner's batches in turn: with key A's 20 batches and key B's
    one waiting, B gets every other slot until it has all it asked for, and A's batches share the rest evenly."""
    import asyncio

    from deployments.batch.capacity import Capacity

    async def scenario() -> list[tuple[str, str]]:
        capacity = Capacity(1)
        await capacity.acquire("A", "a0")
        granted: list[tuple[str, str]] = []

        async def line(owner: str, batch: str) -> None:
            await capacity.acquire(owner, batch)
            granted.append((owner, batch))
            capacity.release()

        waiting = [line("A", f"a{i}") for i in range(20) for _ in range(5)] + [line("B", "b") for _ in range(10)]
        tasks = [asyncio.get_running_loop().create_task(w) for w in waiting]
        await asyncio.sleep(0)  # every line queues its waiter
        capacity.release()
        await asyncio.gather(*tasks)
        return granted

    granted = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    owners = [owner for owner, _ in granted]
    assert owners[:20] == ["A", "B"] * 10  # B's ten lines within A's next ten, not after A's hundred
    a_batches = [batch for owner, batch in granted if owner == "A"]
    assert a_batches[:20] == [f"a{i}" for i in range(20)]  # A's own batches in turn
    assert sorted(granted) == sorted([("A", f"a{i}") for i in range(20) for _ in range(5)] + [("B", "b")] * 10)


def test_a_waiter_cancelled_after_a_grant_passed_over_it_leaves_quietly():
    """A slot's waiter cancelled, then skipped by a release before its task resumes: no error, no slot lost."""
    import asyncio

    from deployments.batch.capacity import Capacity

    async def scenario():
        capacity = Capacity(1)
        await capacity.acquire()
        waiting = asyncio.get_running_loop().create_task(capacity.acquire())
        await asyncio.sleep(0)  # it queues its waiter
        waiting.cancel()  # its waiter is cancelled; the task has not run its handler yet
        (waiter,) = capacity._waiters[None][None]
        waiter.cancel()
        capacity.release()  # the grant passes over the cancelled waiter
        results = await asyncio.gather(waiting, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert capacity.used == 0 and not capacity._waiters
        await capacity.acquire()  # the slot is still there
        assert capacity.used == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("owner, salt_by_key, expected", [("k1", True, ["key k1", "key k1|own"]),
                                                         ("k1", False, [None, "own"]), (None, True, [None, "own"])])
def test_a_batchs_lines_are_salted_by_its_key(tmp_path, owner, salt_by_key, expected):
    """As the ingress salts a key's requests (`cache_salt_by_key`), the batch job salts its key's lines."""
    import asyncio

    from deployments.batch.files import FileLimits, FileStore
    from deployments.batch.job import BatchJob, BatchLimits
    from deployments.storage import open_store

    store = open_store(f"file://{tmp_path}")
    lines = [json.loads(line) for line in _chat_lines(2).decode().splitlines()]
    lines[1]["body"]["cache_salt"] = "own"
    store.put(FileStore.content_key("file-in"), "".join(json.dumps(line) + "\n" for line in lines).encode())
    state = new_batch("file-in", "/v1/chat/completions", 3600, "1h", None, FileStore.content_key("file-in"), owner)
    state.batch.status = "in_progress"
    salts = {}

    async def send(request, request_id):
        salts[request.custom_id] = request.body.cache_salt
        return {"id": request_id, "choices": [], "usage": {}}

    job = BatchJob(state, store, FileStore(store, FileLimits(1 << 20, 100)), {"m"}, send,
                   BatchLimits(salt_by_key=salt_by_key))
    asyncio.run(asyncio.wait_for(job.run(), timeout=30))
    assert [salts["c-0"], salts["c-1"]] == expected
