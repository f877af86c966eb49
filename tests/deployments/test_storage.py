"""Both object stores behave the same: streamed writes (multipart on S3), reads, listing, deletion."""

import boto3
import pytest

from deployments.storage import MissingObjectError, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, s3_endpoint):
    if request.param == "local":
        return open_store(f"file://{tmp_path}/root")
    bucket = f"store-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return open_store(f"s3://{bucket}/prefix")


def test_round_trip_list_and_delete(store):
    store.put("a/one.json", b'{"x": 1}')
    store.put_json("a/two.json", {"y": [1, 2]})
    store.put("b/three.txt", b"line 1\nline 2\nlast")
    assert store.get_json("a/one.json") == {"x": 1} and store.get_json("a/two.json") == {"y": [1, 2]}
    assert store.list("a/") == ["a/one.json", "a/two.json"]
    assert list(store.iter_lines("b/three.txt")) == [b"line 1", b"line 2", b"last"]
    assert store.size("b/three.txt") == 18 and store.size("missing") is None
    store.delete("a/one.json")
    store.delete("a/one.json")  # deleting twice is fine
    assert store.list("a/") == ["a/two.json"]
    with pytest.raises(MissingObjectError):  # missing, not unreachable: callers answer 404 for it
        store.get("a/one.json")
    assert store.uri_of("x/y") == f"{store.uri}/x/y"


def test_lines_spanning_read_chunks_come_back_whole(store):
    long_line = b"x" * (3 << 20)  # three 1 MiB read chunks
    lines = [b"a", long_line, b"", b"b" * ((1 << 20) - 2), b"c" * (1 << 20), b"end"]
    store.put("lines.jsonl", b"\n".join(lines))
    assert list(store.iter_lines("lines.jsonl")) == lines
    store.put("trailing.jsonl", b"one\ntwo\n")
    assert list(store.iter_lines("trailing.jsonl")) == [b"one", b"two"]


def test_objects_read_ahead_come_back_concatenated_in_order(store):
    """More objects than are fetched at once, empty ones and ones of several read chunks among them."""
    from deployments.storage.base import READ_AHEAD

    sizes = [0, 5, 3 << 20, 0, 1, (1 << 20) + 7, *range(10, 10 + 2 * READ_AHEAD)]
    keys = [f"parts/{i:03d}" for i in range(len(sizes))]
    for i, (key, size) in enumerate(zip(keys, sizes)):
        store.put(key, bytes([65 + i % 26]) * size)
    assert b"".join(store.iter_concatenated(keys)) == b"".join(store.get(key) for key in keys)
    with pytest.raises(MissingObjectError):
        b"".join(store.iter_concatenated([*keys[:3], "parts/missing", keys[4]]))


def test_many_objects_are_deleted_at_once(store, monkeypatch):
    """Past S3's thousand keys a request, missing keys among them; nothing else under the prefix goes."""
    import deployments.storage.s3

    monkeypatch.setattr(deployments.storage.s3, "DELETES_PER_REQUEST", 3)  # seven keys: three requests on S3
    keys = [f"parts/{i}" for i in range(6)]
    for key in keys:
        store.put(key, b"x")
    store.put("kept/one", b"y")
    store.delete_many([*keys, "parts/missing"])
    assert store.list("parts/") == [] and store.list("kept/") == ["kept/one"]
    store.delete_many([])


def test_large_streamed_write_is_byte_exact(store):
    chunk = bytes(range(256)) * 4096  # 1 MiB
    chunks = [chunk] * 17 + [b"tail"]  # over two 8 MiB parts on S3
    assert store.put_stream("big.bin", iter(chunks)) == 17 * len(chunk) + 4
    assert store.get("big.bin") == b"".join(chunks)


def test_failed_stream_leaves_no_object(store):
    def broken():
        yield b"x" * (9 << 20)
        raise RuntimeError("upload interrupted")

    with pytest.raises(RuntimeError):
        store.put_stream("partial.bin", broken())
    assert store.size("partial.bin") is None
