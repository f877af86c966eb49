"""Scheduling policy: mixed prefill/decode batches within the token budget, priorities, arrival order."""

from runtime import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _engine(path, **kw):
    return LLM(str(path), dtype="float32", max_model_len=256, **kw).engine


def test_decode_and_chunked_prefill_share_a_step(qwen2_model):
    engine = _engine(qwen2_model, max_num_batched_tokens=16)
    engine.add_request("short", [5, 6, 7], PARAMS)
    engine.step()  # prefill of "short" (3 tokens) samples its first token
    engine.add_request("long", list(range(3, 53)), PARAMS)
    batch = engine.scheduler.schedule()
    assert batch.num_decodes == 1 and batch.seqs[0].request.request_id == "short"
    assert batch.num_new_tokens == [1, 15]  # the decode first, then a 15-token chunk of the 50-token prompt


def test_priority_admits_first_and_ties_go_by_arrival(qwen2_model):
    engine = _engine(qwen2_model, max_num_seqs=1)
    for request_id, priority in [("batch-a", 1), ("online-a", 0), ("batch-b", 1), ("online-b", 0)]:
        engine.add_request(request_id, [5, 6, 7], PARAMS, priority=priority)
    finished = []
    while engine.has_unfinished_requests():
        finished += [d.request_id for d in engine.step() if d.finished]
    assert finished == ["online-a", "online-b", "batch-a", "batch-b"]

