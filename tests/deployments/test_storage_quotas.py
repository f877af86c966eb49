"""Each API key keeps at most its quota in storage: uploaded files (in number and bytes, batch outputs counted),
and stored responses (in number and bytes). The HTTP app in-process over a local store; the S3 store's listing
of sizes is what tests/deployments/batch's S3 tests list through."""

import asyncio

import pytest

from deployments.batch.files import FileLimits, FileStore
from deployments.errors import OpenAIError
from deployments.http.responses.store import ResponseStore
from deployments.storage import LocalStore
from deployments.storage.usage import Quota
from tests.deployments.http.test_http_app import ScriptedModel, serve_in_process

LINE = b'{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def _upload(app, key: str, content: bytes = LINE):
    return app.post("/v1/files", headers={"Authorization": f"Bearer {key}"}, data={"purpose": "batch"},
                    files={"file": ("in.jsonl", content)})


def test_a_key_past_its_files_or_bytes_is_refused_another_key_is_not_and_deleting_makes_room(tmp_path):
    app = serve_in_process(ScriptedModel([]), tmp_path, api_key=["sk-a", "sk-b"], max_files_per_key=2,
                           max_file_bytes_per_key=3 * len(LINE))
    first, second = _upload(app, "sk-a").json(), _upload(app, "sk-a").json()
    refused = _upload(app, "sk-a")
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded" and refused.json()["error"]["param"] == "file"
    assert _upload(app, "sk-b").status_code == 200
    assert app.delete(f"/v1/files/{first['id']}", headers={"Authorization": "Bearer sk-a"}).status_code == 200
    too_big = _upload(app, "sk-a", LINE * 3)  # one file's room left, but only two lines' bytes
    assert too_big.status_code == 400 and "bytes left" in too_big.json()["error"]["message"]
    listed = app.get("/v1/files", headers={"Authorization": "Bearer sk-a"}).json()["data"]
    assert [f["id"] for f in listed] == [second["id"]]  # the refused upload left nothing behind
    assert _upload(app, "sk-a", LINE * 2).status_code == 200


def test_usage_counts_batch_outputs_and_files_stored_before_the_owner_index(tmp_path):
    store = LocalStore(str(tmp_path))
    files = FileStore(store, FileLimits(1 << 20, 100, Quota(objects=3, bytes=1 << 20)))
    files.create("in.jsonl", "batch", [LINE], owner="a", within_quota=True)
    files.create("out.jsonl", "batch_output", [LINE * 5], owner="a")  # a batch's output: written whatever the quota
    store.delete_many([*store.list("file-owners/"), "file-owners.json"])  # as a store written before the index
    assert FileStore(store, files.limits).usage.current("a") == (2, 6 * len(LINE))
    files.create("out.jsonl", "batch_output", [LINE], owner="a")
    with pytest.raises(OpenAIError) as e:
        FileStore(store, files.limits).create("in.jsonl", "batch", [LINE], owner="a", within_quota=True)
    assert e.value.code == "quota_exceeded"


def test_a_key_past_its_stored_responses_is_refused_before_running_and_deleting_makes_room(tmp_path):
    responses = ResponseStore(LocalStore(str(tmp_path)), Quota(objects=2, bytes=1 << 20))
    ids = [f"resp_{i:032x}" for i in range(2)]

    async def scenario():
        for response_id in ids:
            await responses.check_room("a")
            await responses.save("a", {"id": response_id}, [], [])
        with pytest.raises(OpenAIError) as e:
            await responses.check_room("a")
        await responses.check_room("b")
        await responses.delete("a", ids[0])
        await responses.check_room("a")
        return e.value

    error = asyncio.run(scenario())
    assert error.status == 400 and error.code == "quota_exceeded" and error.param == "store"
    assert "2 stored responses" in error.message
