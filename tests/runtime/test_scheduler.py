"""Scheduling policy: mixed prefill/decode batches within the token budget, priorities, arrival order."""

from runtime import LLM, SamplingParams
from runtime.core.block_manager import BlockManager
from runtime.core.scheduler import FOREGROUND_STEPS, Scheduler
from runtime.core.sequence import Request, SequenceStatus

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



# --- the scheduler alone: a synthetic block budget and requests, no model or tokenizer ---------------------

def _scheduler(num_blocks: int, max_num_batched_tokens: int, max_num_seqs: int = 8,
               max_num_seqs_background: int | None = None) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size=4, enable_prefix_caching=True), max_num_seqs,
                     max_num_batched_tokens, max_num_seqs_background=max_num_seqs_background)


def _add(scheduler: Scheduler, request_id: str, prompt_len: int, priority: int = 0, max_tokens: int = 8,
         n: int = 1, owner: str | None = None) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n)
    prompt = [hash((request_id, i)) % 1000 for i in range(prompt_len)]  # no two requests share a block
    request = Request(request_id, prompt, params, priority, owner=owner)
    scheduler.add(request)
    return request


def _step(scheduler: Scheduler) -> list[tuple[str, int]]:
    """Schedule a batch and play the engine's part: count the chunks computed, append a token to each
    sampled sequence, finish those at max_tokens. Returns (request id, new tokens) in batch order."""
    batch = scheduler.schedule()
    sampled = batch.sampled
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += n
    for seq in sampled:
        seq.token_ids.append(0)
        if seq.num_output_tokens >= seq.request.max_tokens:
            scheduler.finish(seq)
    return [(seq.request.request_id, n) for seq, n in zip(batch.seqs, batch.num_new_tokens)]


def test_decodes_go_first_and_prefills_are_chunked_within_the_token_budget():
    scheduler = _scheduler(num_blocks=64, max_num_batched_tokens=8)
    _add(scheduler, "short", 3)
    assert _step(scheduler) == [("short", 3)]
    _add(scheduler, "long", 19)
    _add(scheduler, "later", 2)
    assert _step(scheduler) == [("short", 1), ("long", 7)]  # the decode, then what the budget leaves
    assert _step(scheduler) == [("short", 1), ("long", 7)]  # a running prefill goes on before admissions
    assert _step(scheduler) == [("short", 1), ("long", 5), ("later", 2)]  # its last chunk; the rest admits
    assert _step(scheduler) == [("short", 1), ("long", 1), ("later", 1)]


def test_higher_priority_is_admitted_first_and_ties_go_by_arrival():
    scheduler = _scheduler(num_blocks=64, max_num_batched_tokens=64, max_num_seqs=1)
    for request_id, priority in [("batch-a", 1), ("online-a", 0), ("batch-b", 1), ("online-b", 0)]:
        _add(scheduler, request_id, 3, priority, max_tokens=2)
    order = []
    while scheduler.num_waiting or scheduler.running:
        order += [r for r, _ in _step(scheduler) if r not in order]
    assert order == ["online-a", "online-b", "batch-a", "batch-b"]


def test_out_of_blocks_preempts_the_lowest_priority_newest_sequence():
    scheduler = _scheduler(num_blocks=6, max_num_batched_tokens=64, max_num_seqs_background=8)  # blocks run out
    requests = {request_id: _add(scheduler, request_id, 4, priority, max_tokens=12)  # online arrives last
                for request_id, priority in [("batch-old", 1), ("batch-new", 1), ("online", 0)]}
    blocks = scheduler.blocks
    assert sorted(_step(scheduler)) == [("batch-new", 4), ("batch-old", 4), ("online", 4)]
    for _ in range(4):  # decodes until each has 8 tokens computed: two blocks each, all six in use
        assert len(_step(scheduler)) == 3
    assert blocks.num_free_blocks == 0 and scheduler.num_preemptions == 0
    # each needs a third block now: batch-new gives its two back, online and batch-old take one each
    assert _step(scheduler) == [("online", 1), ("batch-old", 1)]
    victim = requests["batch-new"].seqs[0]
    assert scheduler.waiting.peek(scheduler.running_per_owner, 8) is victim  # the next to run again
    assert scheduler.num_preemptions == 1 and victim.block_table == [] and victim.num_computed_tokens == 0
    assert victim.num_output_tokens == 5  # recomputed later from its prompt and the tokens it already has
    while scheduler.num_waiting or scheduler.running:
        _step(scheduler)
    assert blocks.num_free_blocks == blocks.num_blocks  # everyone finished, nothing leaked


def test_beside_online_requests_batch_lines_run_on_their_background_seats_until_the_online_ones_lapse():
    """Batch lines fill an idle engine; an online request takes a seat at once (the newest batch line gives
    its seat back), and while it runs, and FOREGROUND_STEPS steps after, batch lines run on their background
    seats only: the others pause, keeping their blocks (none is recomputed), and go on oldest first as those
    ahead of them finish (not starved); then the batch fills the engine again."""
    scheduler = _scheduler(num_blocks=1024, max_num_batched_tokens=256, max_num_seqs=8, max_num_seqs_background=2)
    batch = [_add(scheduler, f"batch-{i}", 4, priority=1, max_tokens=3) for i in range(100)]
    _step(scheduler)
    assert scheduler.running_per_priority == {1: 8}  # alone, batch lines take every seat
    online = _add(scheduler, "online", 4, priority=0, max_tokens=20)
    assert _step(scheduler) == [("batch-0", 1), ("batch-1", 1), ("online", 4)]  # the two oldest; five pause
    assert scheduler.num_preemptions == 1 and scheduler.running_per_priority == {0: 1, 1: 7}
    ran = []
    while not online.seqs[0].is_finished:
        lines = [request_id for request_id, _ in _step(scheduler) if request_id != "online"]
        assert len(lines) <= 2
        ran += [line for line in lines if line not in ran]
    assert ran[:6] == [f"batch-{i}" for i in range(6)]  # the paused ones went on, oldest first
    assert len(ran) > 7 and scheduler.num_preemptions == 1  # not starved: others started; none recomputed
    for _ in range(FOREGROUND_STEPS - 1):
        assert len(_step(scheduler)) <= 2
    assert len(_step(scheduler)) == 8  # the online request lapsed: the batch fills the engine
    while scheduler.num_waiting or scheduler.running:
        _step(scheduler)
    assert all(s.num_output_tokens == 3 for r in batch for s in r.seqs) and online.seqs[0].num_output_tokens == 20
    assert scheduler.blocks.num_free_blocks == scheduler.blocks.num_blocks


def test_a_batch_after_an_online_request_on_an_idle_engine_takes_every_seat():
    """The window after an online request ends when the engine goes idle: a batch that comes after a lone chat
    (however soon, in steps) fills the engine, as it would have before the chat."""
    scheduler = _scheduler(num_blocks=1024, max_num_batched_tokens=256, max_num_seqs=8, max_num_seqs_background=2)
    online = _add(scheduler, "online", 4, priority=0, max_tokens=3)
    while not online.seqs[0].is_finished:
        _step(scheduler)
    for i in range(20):
        _add(scheduler, f"batch-{i}", 4, priority=1, max_tokens=3)
    assert len(_step(scheduler)) == 8


def test_an_online_request_short_of_blocks_takes_a_paused_batch_lines_blocks():
    """Paused batch lines hold their blocks; an online request that finds none free preempts the newest of them
    (not one running this step) and is admitted at once, rather than wait for them to finish."""
    scheduler = _scheduler(num_blocks=16, max_num_batched_tokens=256, max_num_seqs=16, max_num_seqs_background=2)
    for i in range(8):
        _add(scheduler, f"batch-{i}", 4, priority=1, max_tokens=20)
    _step(scheduler)
    _step(scheduler)  # each has 5 tokens now: two blocks each, all sixteen in use
    assert scheduler.blocks.num_free_blocks == 0
    _add(scheduler, "online", 4, priority=0)
    assert _step(scheduler) == [("batch-0", 1), ("batch-1", 1), ("online", 4)]
    assert scheduler.num_preemptions == 1
    assert scheduler.waiting.peek(scheduler.running_per_owner, 16).request.request_id == "batch-7"


# --- fair admission: owners in turn, each owner's requests in turn ------------------------------------------

def test_owners_take_turns_and_so_do_each_owners_requests():
    scheduler = _scheduler(num_blocks=64, max_num_batched_tokens=64, max_num_seqs=1)
    _add(scheduler, "a1", 3, max_tokens=2, n=4, owner="a")
    _add(scheduler, "a2", 3, max_tokens=2, n=4, owner="a")
    _add(scheduler, "b1", 3, max_tokens=2, n=4, owner="b")
    order = []
    while scheduler.num_waiting or scheduler.running:
        order += [r for r, n in _step(scheduler) if n > 1]  # a prefill: a sequence admitted
    assert order == ["a1", "b1", "a2", "b1", "a1", "b1", "a2", "b1", "a1", "a2", "a1", "a2"]


def test_a_request_of_1024_sequences_lets_another_owner_in_and_still_completes():
    scheduler = _scheduler(num_blocks=2048, max_num_batched_tokens=4096, max_num_seqs=256)
    big = _add(scheduler, "big", 4, max_tokens=6, n=1024, owner="a")
    _step(scheduler)
    assert len(scheduler.running) == 256  # alone, one owner fills the engine
    chat = _add(scheduler, "chat", 4, max_tokens=4, owner="b")
    steps = 0
    while chat.seqs[0].status is SequenceStatus.WAITING:
        _step(scheduler)
        steps += 1
    assert steps == 1  # a, over its cap, gave b a seat at once (before, b waited for all of a's to start)
    while scheduler.num_waiting or scheduler.running:
        _step(scheduler)
    assert all(s.is_finished and s.num_output_tokens == 6 for s in big.seqs) and chat.seqs[0].num_output_tokens == 4
    assert scheduler.blocks.num_free_blocks == scheduler.blocks.num_blocks


def test_an_owner_over_its_cap_gives_a_seat_back_to_a_newcomer_one_a_step():
    scheduler = _scheduler(num_blocks=256, max_num_batched_tokens=256, max_num_seqs=4)  # cap: 2 an owner
    long = _add(scheduler, "long", 4, max_tokens=30, n=3, owner="a")
    later = _add(scheduler, "later", 4, max_tokens=30, owner="a")
    _step(scheduler)
    assert scheduler.running_per_owner == {"a": 4}  # alone, an owner fills the engine
    other = _add(scheduler, "other", 4, max_tokens=30, n=2, owner="b")
    more = _add(scheduler, "more", 4, max_tokens=30, owner="a")
    assert _step(scheduler)[-1] == ("other", 4)  # a's newest sequence gave its seat back: b starts at once
    assert later.seqs[0].status is SequenceStatus.WAITING and later.seqs[0].num_computed_tokens == 0
    _step(scheduler)  # a still runs 3, over its cap: its newest gives b's second sequence a seat
    assert long.seqs[2].status is SequenceStatus.WAITING and other.seqs[1].status is SequenceStatus.RUNNING
    for _ in range(3):
        _step(scheduler)
    assert scheduler.running_per_owner == {"a": 2, "b": 2} and scheduler.num_preemptions == 2  # both at the cap
    assert more.seqs[0].status is SequenceStatus.WAITING
    while scheduler.num_waiting or scheduler.running:
        _step(scheduler)
    assert all(s.num_output_tokens == 30 for r in (long, later, other, more) for s in r.seqs)
    assert scheduler.blocks.num_free_blocks == scheduler.blocks.num_blocks


def test_fair_admission_keeps_greedy_tokens(qwen2_model):
    """Two owners on the real engine: b's request starts at once although a's has many more sequences than
    seats, and every sequence's greedy tokens (one of a's preempted and recomputed) are those it has alone."""
    engine = _engine(qwen2_model, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, n=12)
    engine.add_request("a", [5, 6, 7, 8], params, owner="key-a")
    tokens: dict[tuple[str, int], list[int]] = {}
    steps_to_b = None
    for step in range(1000):
        if step == 1:
            engine.add_request("b", [9, 10, 11], PARAMS, owner="key-b")
        for delta in engine.step():
            if delta.request_id == "b" and steps_to_b is None:
                steps_to_b = step
                assert engine.requests["a"].seqs[-1].num_output_tokens == 0  # a has sequences still to start
            for s in delta.seqs:
                tokens.setdefault((delta.request_id, s.index), []).extend(s.token_ids)
        if not engine.has_unfinished_requests():
            break
    assert steps_to_b == 1  # a's newest gave b its seat (recomputed later); before, b waited for all twelve
    assert sorted(tokens) == [("a", i) for i in range(12)] + [("b", 0)]
    alone = {}
    for request_id, prompt, p in [("a", [5, 6, 7, 8], params), ("b", [9, 10, 11], PARAMS)]:
        engine.add_request(request_id, prompt, p)
        while engine.has_unfinished_requests():
            for delta in engine.step():
                for s in delta.seqs:
                    alone.setdefault((request_id, s.index), []).extend(s.token_ids)
    assert tokens == alone
