"""The Files and Batches APIs through the openai SDK: the seed documents' flows, faults and bad input."""

import asyncio
import io
import json

import openai
import pytest
import ray

from testing.helpers import wait_until
from tests.conftest import MODEL_ID, another_app, app_args


def chat_line(custom_id: str, content: str, max_tokens: int = 16, **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/chat/completions",
            "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": content}],
                     "max_tokens": max_tokens, **extra}}


def story_line(i: int, max_tokens: int) -> dict:
    """The seed documents' status-check and cancel batches use this request, numbered."""
    return {"custom_id": f"request-{i}", "method": "POST", "url": "/chat/completions", "body": {
        "model": MODEL_ID, "max_tokens": max_tokens, "messages": [
            {"role": "system", "content": f"{i}: You are a helpful AI assistant"},
            {"role": "user", "content": "Write a detailed story about topic. Make it very long."}]}}


def jsonl(lines) -> bytes:
    return "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines).encode()


def finished(client, batch_id, statuses=("completed", "failed", "cancelled", "expired")):
    return wait_until(lambda: (b := client.batches.retrieve(batch_id)).status in statuses and b)


def read_jsonl(client, file_id) -> list[dict]:
    content = client.files.content(file_id).read().decode("utf-8")
    return [json.loads(line) for line in content.split("\n") if line.strip()]


def test_two_request_batch_completes_and_its_output_reads_back(client):
    requests = [chat_line("request-1", "Tell me a joke about programming", 50),
                chat_line("request-2", "What is Python?", 50)]
    file_response = client.files.create(file=("batch_requests.jsonl", jsonl(requests)), purpose="batch")
    assert file_response.purpose == "batch" and file_response.bytes == len(jsonl(requests))
    batch = client.batches.create(input_file_id=file_response.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert batch.status == "validating" and batch.input_file_id == file_response.id
    batch = finished(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (2, 2, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    results = read_jsonl(client, batch.output_file_id)
    assert [r["custom_id"] for r in results] == ["request-1", "request-2"]
    for i, r in enumerate(results):
        assert r["id"] == f"{batch.id}-req_{i}" and r["error"] is None
        assert r["response"]["status_code"] == 200 and r["response"]["request_id"] == r["id"]
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["id"] == r["id"] and body["model"] == MODEL_ID
        assert 1 <= body["usage"]["completion_tokens"] <= 50
    assert batch.output_file_uri.endswith(f"files/{batch.output_file_id}.jsonl")
    assert client.files.delete(batch.output_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch.output_file_id)


def test_twenty_requests_are_counted_live_and_complete(client):
    requests = [story_line(i, 64) for i in range(20)]
    uploaded = client.files.create(file=("batch_requests.jsonl", jsonl(requests)), purpose="batch")
    batch_job = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
    totals, completed = [], []

    def done():
        b = client.batches.retrieve(batch_job.id)
        totals.append(b.request_counts.total)
        completed.append(b.request_counts.completed)
        return b.status in ("completed", "failed", "cancelled", "expired") and b

    wait_until(done, every=0.05)
    assert completed == sorted(completed) and set(totals) <= {0, 20}  # counted up as requests finish
    seen = []
    for _ in range(5):
        details = client.batches.retrieve(batch_id=batch_job.id)
        seen.append((details.status, details.request_counts.total, details.request_counts.completed,
                     details.request_counts.failed))
    assert seen == [("completed", 20, 20, 0)] * 5
    assert details.created_at <= details.in_progress_at <= details.completed_at
    assert sorted(r["custom_id"] for r in read_jsonl(client, details.output_file_id)) == sorted(
        f"request-{i}" for i in range(20))


def test_5000_request_batch_cancelled_mid_run(client):
    requests = [story_line(i, 128) for i in range(5000)]
    uploaded = client.files.create(file=("batch_requests.jsonl", jsonl(requests)), purpose="batch")
    batch_job = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch_job.id).request_counts.completed > 0)
    cancelled_job = client.batches.cancel(batch_id=batch_job.id)
    assert cancelled_job.status == "cancelling" and cancelled_job.cancelling_at
    cancelled_job = finished(client, batch_job.id, ("failed", "cancelled"))
    assert cancelled_job.status == "cancelled" and cancelled_job.cancelled_at
    counts = cancelled_job.request_counts
    assert 0 < counts.completed < 5000 and counts.total == 5000
    results = read_jsonl(client, cancelled_job.output_file_id)
    assert len(results) == counts.completed == len({r["custom_id"] for r in results})
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch_id=batch_job.id)  # already cancelled


def test_killed_batch_manager_resumes_without_loss_or_duplicates(client):
    total = 400
    requests = [chat_line(f"kill-{i}", f"question {i}", 24) for i in range(total)]
    uploaded = client.files.create(file=("kill.jsonl", jsonl(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 150)
    ray.kill(ray.get_actor("batch-manager-default", namespace="rayllm"))
    batch = finished(client, batch.id)  # the ingress re-creates the manager, which resumes the batch
    assert batch.status == "completed" and batch.request_counts.completed == total
    ids = [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)]
    assert sorted(ids) == sorted(f"kill-{i}" for i in range(total))


def test_bad_lines_go_to_the_error_file_and_the_batch_goes_on(client):
    lines = [
        chat_line("ok-1", "hello"),
        "{not json",
        json.dumps({"method": "POST", "url": "/chat/completions", "body": {"messages": []}}),
        chat_line("ok-1", "duplicate id"),
        {**chat_line("wrong-url", "hi"), "url": "/v1/embeddings"},
        chat_line("unknown-model", "hi") | {"body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}},
        chat_line("streaming", "hi", stream=True),
        chat_line("oversized", "x" * 5000),
        chat_line("bad-temperature", "hi", temperature=-1),
        "",
        chat_line("ok-2", "world"),
    ]
    uploaded = client.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
    batch = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                   completion_window="24h").id)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (10, 2, 8)
    assert [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)] == ["ok-1", "ok-2"]
    errors = read_jsonl(client, batch.error_file_id)
    by_line = {e["error"]["line"]: e for e in errors}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8, 9]
    expected = {2: "not valid JSON", 3: "custom_id", 4: "more than once", 5: "url", 6: "unknown model",
                7: "stream", 8: "byte limit", 9: "temperature"}
    for line, text in expected.items():
        assert text in by_line[line]["error"]["message"] and by_line[line]["response"] is None
    assert batch.error_file_uri.endswith(f"files/{batch.error_file_id}.jsonl")


def test_expired_batch_keeps_partial_results(client):
    requests = [chat_line(f"exp-{i}", f"question {i}", 64) for i in range(1000)]
    uploaded = client.files.create(file=("expiring.jsonl", jsonl(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="1s")
    batch = finished(client, batch.id)
    assert batch.status == "expired" and batch.expired_at
    assert batch.request_counts.completed < 1000
    done = read_jsonl(client, batch.output_file_id) if batch.output_file_id else []
    assert len(done) == batch.request_counts.completed


@pytest.mark.parametrize("content, purpose, status, text", [
    (b"", "batch", 400, "empty"),
    (jsonl([chat_line(f"r{i}", "x") for i in range(6001)]), "batch", 400, "line limit"),
    (jsonl([chat_line("r", "x")]), "fine-tune", 400, "purpose"),
], ids=["empty", "over-line-limit", "wrong-purpose"])
def test_bad_uploads_are_refused(client, content, purpose, status, text):
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=("f.jsonl", content), purpose=purpose)
    assert e.value.status_code == status and text in e.value.body["message"]


def test_bad_batch_requests_are_4xx(client, server):
    uploaded = client.files.create(file=("one.jsonl", jsonl([chat_line("r", "x")])), purpose="batch")
    cases = [
        (dict(input_file_id="file-missing", endpoint="/v1/chat/completions"), openai.NotFoundError),
        (dict(input_file_id=uploaded.id, endpoint="/v1/audio/transcriptions"), openai.BadRequestError),
        (dict(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="soon"),
         openai.BadRequestError),
        (dict(input_file_id="s3://no-such-bucket/x.jsonl", endpoint="/v1/chat/completions"), openai.APIStatusError),
    ]
    for kwargs, error in cases:
        kwargs.setdefault("completion_window", "24h")
        with pytest.raises(error) as e:
            client.batches.create(**kwargs)
        assert 400 <= e.value.status_code < 500
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")
    done = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(done.id)
    output_as_input = client.batches.create  # an output file is not a batch input
    with pytest.raises(openai.BadRequestError):
        output_as_input(input_file_id=done.output_file_id, endpoint="/v1/chat/completions", completion_window="24h")


def test_files_and_batches_paginate(client):
    ids = [client.files.create(file=(f"p{i}.jsonl", jsonl([chat_line("r", "x")])), purpose="batch").id
           for i in range(3)]
    page = client.files.list(purpose="batch", limit=2)
    assert len(page.data) == 2 and page.has_more
    listed = [f.id for f in client.files.list(purpose="batch", limit=2)]  # the SDK follows `after`
    assert set(ids) <= set(listed) and len(listed) == len(set(listed))
    batches = [b.id for b in client.batches.list(limit=1)]
    assert len(batches) == len(set(batches)) >= 1


def test_s3_staged_batch_writes_results_to_s3(ray_cluster, s3_endpoint, tmp_path_factory, server):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="staging")
    s3.create_bucket(Bucket="results")
    lines = [chat_line(f"s3-{i}", f"question {i}") for i in range(5)]
    s3.put_object(Bucket="staging", Key="jobs/input.jsonl", Body=jsonl(lines))
    s3.put_object(Bucket="staging", Key="jobs/empty.jsonl", Body=b"")
    s3.put_object(Bucket="staging", Key="private/secrets.jsonl", Body=jsonl(lines))
    args = {**app_args(server.model_dir, "s3://results/rayllm"), "batch_input_prefixes": ["s3://staging/jobs/"]}
    with another_app(server, "s3", args) as url:
        s3_client = openai.Client(base_url=f"{url}/v1", api_key="None")
        for outside in ("s3://staging/private/secrets.jsonl", "s3://staging/jobs-other/x.jsonl", "s3://results/x"):
            with pytest.raises(openai.PermissionDeniedError):  # readable with the server's credentials, not allowed
                s3_client.batches.create(input_file_id=outside, endpoint="/v1/chat/completions",
                                         completion_window="24h")
        batch = s3_client.batches.create(input_file_id="s3://staging/jobs/input.jsonl",
                                         endpoint="/v1/chat/completions", completion_window="24h")
        assert batch.input_file_id == "s3://staging/jobs/input.jsonl"
        batch = finished(s3_client, batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == 5
        assert batch.output_file_uri.startswith("s3://results/rayllm/files/")
        key = batch.output_file_uri[len("s3://results/"):]
        body = s3.get_object(Bucket="results", Key=key)["Body"].read().decode()
        assert sorted(json.loads(line)["custom_id"] for line in body.splitlines()) == [f"s3-{i}" for i in range(5)]
        empty = finished(s3_client, s3_client.batches.create(
            input_file_id="s3://staging/jobs/empty.jsonl", endpoint="/v1/chat/completions",
            completion_window="24h").id)
        assert empty.status == "failed" and empty.errors.data[0].code == "empty_file"
        big = io.BytesIO(jsonl([chat_line(f"m{i}", "y" * 200) for i in range(2)]))
        uploaded = s3_client.files.create(file=("up.jsonl", big), purpose="batch")
        assert s3.head_object(Bucket="results", Key=f"rayllm/files/{uploaded.id}.jsonl")["ContentLength"] > 0


def test_a_manager_over_many_finished_batches_holds_none_and_pages_them_from_the_store(server, tmp_path_factory):
    """A manager starting over a store of earlier batches answers every concurrent call from the full set; it
    holds none of the finished ones (nor one it ran, once it ends), and gets and lists answer each batch's
    stored JSON, newest first, page after page."""
    import requests

    from deployments.batch.state import BatchState, new_batch
    from deployments.storage import open_store

    root = tmp_path_factory.mktemp("resume-storage")
    store = open_store(f"file://{root}")
    ids = []
    for i in range(200):  # finished batches of an earlier manager (the earlier code's store: no index)
        state = new_batch("file-x", "/v1/chat/completions", 3600, "1h", {"n": str(i)}, "files/x", None)
        state.batch.status, state.batch.created_at = "completed", 1_700_000_000 + i // 3  # ties broken by id
        store.put_json(f"batches/{state.batch.id}/state.json", state.model_dump())
        ids.append(state.batch.id)
    with another_app(server, "resume", app_args(server.model_dir, f"file://{root}")) as url:
        client = openai.AsyncClient(base_url=f"{url}/v1", api_key="None", max_retries=0)

        async def retrieve_all():
            return await asyncio.gather(*(client.batches.retrieve(i) for i in ids[::10]))

        assert [b.status for b in asyncio.run(retrieve_all())] == ["completed"] * 20
        sync = openai.Client(base_url=f"{url}/v1", api_key="None")
        uploaded = sync.files.create(file=("one.jsonl", jsonl([chat_line("r", "x")])), purpose="batch")
        ran = finished(sync, sync.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                 completion_window="24h").id)
        manager = ray.get_actor("batch-manager-resume", namespace="rayllm")
        held = lambda: ray.get(manager.__ray_call__.remote(lambda m: len(m.jobs)))  # noqa: E731
        assert wait_until(lambda: held() == 0, every=0.05) and ran.status == "completed"
        stored = [BatchState.model_validate(store.get_json(k)).batch.model_dump()
                  for k in store.list("batches/") if k.endswith("/state.json")]
        expected = sorted(stored, key=lambda b: (b["created_at"], b["id"]), reverse=True)
        assert expected[0]["id"] == ran.id and len(expected) == 201
        pages, after = [], None
        while not pages or pages[-1]["has_more"]:
            pages.append(requests.get(f"{url}/v1/batches", params={"limit": 30, "after": after}).json())
            after = pages[-1]["last_id"]
        assert [b for page in pages for b in page["data"]] == expected and len(pages) == 7
        assert all(requests.get(f"{url}/v1/batches/{b['id']}").json() == b for b in expected[::20])


def test_a_batch_stored_by_the_earlier_code_resumes(server, tmp_path_factory):
    """State in the earlier flat format (progress fields underscored) resumes after its saved window, once."""
    from deployments.storage import open_store
    from tests.deployments.batch.test_batch_state import EARLIER_IN_PROGRESS as earlier

    root = tmp_path_factory.mktemp("earlier-storage")
    store = open_store(f"file://{root}")
    batch_id = earlier["id"]
    store.put(earlier["_input_uri"], jsonl([chat_line(f"old-{i}", f"question {i}") for i in range(5)]))
    done = [{"id": f"{batch_id}-req_{i}", "custom_id": f"old-{i}", "error": None, "response": {
        "status_code": 200, "request_id": f"{batch_id}-req_{i}", "body": {"written": "before the restart"}}}
        for i in range(2)]
    store.put(f"batches/{batch_id}/parts/00000000-out.jsonl", jsonl(done))  # window 0 (lines 1-2) was saved
    store.put(f"batches/{batch_id}/parts/00000000-err.jsonl", b"")
    store.put_json(f"batches/{batch_id}/state.json", earlier)
    with another_app(server, "earlier", app_args(server.model_dir, f"file://{root}")) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        batch = finished(client, batch_id)
        assert batch.status == "completed" and batch.request_counts.completed == 5
        results = read_jsonl(client, batch.output_file_id)
    assert [r["custom_id"] for r in results] == [f"old-{i}" for i in range(5)]
    assert [r["response"]["body"] for r in results[:2]] == [d["response"]["body"] for d in done]
    assert set(store.get_json(f"batches/{batch_id}/state.json")) == {"batch", "progress"}  # saved anew


def test_a_manager_restarted_by_ray_resumes_its_batches_with_no_api_call(server, tmp_path_factory):
    """Killed with a restart allowed, the manager comes back and finishes the batch while nobody polls: the
    store's state is read directly, never through the Batches API."""
    from deployments.batch.state import BatchState
    from deployments.storage import open_store

    root = tmp_path_factory.mktemp("unpolled")
    with another_app(server, "unpolled", app_args(server.model_dir, f"file://{root}")) as url:
        client = openai.Client(base_url=f"{url}/v1", api_key="None")
        lines = jsonl([chat_line(f"u-{i}", f"q {i}", 24) for i in range(200)])
        uploaded = client.files.create(file=("u.jsonl", lines), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        store = open_store(f"file://{root}")
        state = lambda: BatchState.model_validate(store.get_json(f"batches/{batch.id}/state.json"))  # noqa: E731
        wait_until(lambda: state().batch.request_counts.completed >= 20)
        ray.kill(ray.get_actor("batch-manager-unpolled", namespace="rayllm"), no_restart=False)
        done = wait_until(lambda: (s := state()).batch.status == "completed" and s, timeout=120)
        assert done.batch.request_counts.completed == 200


def test_batch_capacity_follows_the_running_replicas_serve_reports(server):
    """The manager sizes each model's batch fan-out from Serve's count of its RUNNING replicas."""
    from deployments.app_config import replica_name
    from deployments.batch.capacity import running_replicas

    models = {MODEL_ID: replica_name(MODEL_ID), "gone": "no-such-deployment"}
    assert running_replicas("default", models) == {MODEL_ID: 1, "gone": 0}
    assert running_replicas("no-such-app", models) == {MODEL_ID: 0, "gone": 0}


def test_batch_lines_in_flight_default_to_twice_each_models_engine_seats():
    """Per running replica: every seat of the model's engine, and as many again on their way in or out;
    batch_concurrency, when set, is every model's figure."""
    from deployments.app_config import parse_app_config

    one = {"model_loading_config": {"model_id": "m"}}
    two = {"model_loading_config": {"model_id": "n"}, "engine_kwargs": {"max_num_seqs": 8}}
    assert parse_app_config({"llm_configs": [one, two]}).batch_seats() == {"m": 512, "n": 16}
    assert parse_app_config({"llm_configs": [one, two], "batch_concurrency": 3}).batch_seats() == {"m": 3, "n": 3}


def test_a_key_at_its_unfinished_batches_gets_a_429_until_one_ends(server, tmp_path):
    """(The app's batch manager starts with it, as by default, before any Files or Batches call.)"""
    args = {**app_args(server.model_dir, f"file://{tmp_path}"), "max_active_batches_per_key": 1,
            "start_batch_manager": True}
    with another_app(server, "batch-quota", args) as url:
        assert ray.get_actor("batch-manager-batch-quota", namespace="rayllm")
        client = openai.Client(base_url=f"{url}/v1", api_key="None", max_retries=0)
        uploaded = client.files.create(file=("in.jsonl", jsonl([story_line(i, 64) for i in range(300)])),
                                       purpose="batch")

        def create():
            return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")

        first = create()
        with pytest.raises(openai.RateLimitError) as refused:
            create()
        assert refused.value.code == "rate_limit_exceeded" and "1 unfinished batches" in refused.value.message
        client.batches.cancel(first.id)
        assert finished(client, first.id).status == "cancelled"
        second = create()
        client.batches.cancel(second.id)
        finished(client, second.id)
