"""Property test: random add / abort / step sequences never leak or double-free a block, also where a sliding
window frees blocks from running sequences."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import LLM, SamplingParams
from runtime.core.block_manager import FREED
from runtime.core.sequence import SequenceStatus
from testing.model_factory import build_model_dir, kv_cache_bytes

add = st.tuples(
    st.just("add"),
    st.integers(1, 60),  # prompt length
    st.integers(1, 8),  # max_tokens
    st.integers(1, 3),  # n
    st.integers(0, 2),  # priority
    st.integers(0, 3),  # which of a few shared prefixes
)
abort = st.tuples(st.just("abort"), st.integers(0, 50))
step = st.tuples(st.just("step"))
operations = st.lists(st.one_of(add, abort, step, step), min_size=1, max_size=25)


def _check_invariants(engine) -> None:
    bm = engine.block_manager
    holders = Counter(b for s in engine.scheduler.running for b in s.block_table)
    for block in bm.blocks:
        assert block.ref_count == holders[block.block_id], block.block_id
        assert (block.ref_count == 0) == (block.block_id in bm._free)
    for request in engine.requests.values():
        for seq in request.seqs:
            if seq.status is not SequenceStatus.RUNNING:
                assert seq.block_table == []


@pytest.mark.parametrize(("window", "num_blocks", "num_examples"), [(None, 40, 1000), (6, 24, 200)])
def test_random_operations_keep_block_accounting_exact(qwen2_model, tmp_path, window, num_blocks, num_examples):
    """`window`: a Mistral whose every layer slides over 6 positions (blocks of 4: windows straddle blocks), with
    the fewest blocks max_model_len allows, so sequences holding freed entries are preempted too."""
    model = qwen2_model if window is None else build_model_dir(tmp_path, "mistral", sliding_window=window)
    llm = LLM(str(model), dtype="float32", max_model_len=96, block_size=4, max_num_batched_tokens=40,
              kv_cache_bytes=kv_cache_bytes(model, num_blocks=num_blocks, block_size=4))
    engine = llm.engine
    freed = []
    counter = iter(range(10**9))
    examples = []
    prefixes = [[(p * 31 + i) % 400 + 3 for i in range(24)] for p in range(4)]

    @settings(max_examples=num_examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(operations)
    def run(ops):
        examples.append(len(ops))
        live = []
        for op in ops:
            if op[0] == "add":
                _, length, max_tokens, n, priority, prefix = op
                request_id = f"r{next(counter)}"
                prompt = (prefixes[prefix] + [5] * length)[: max(1, length)]
                params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, seed=1, ignore_eos=True)
                engine.add_request(request_id, prompt, params, priority)
                live.append(request_id)
            elif op[0] == "abort" and live:
                engine.abort(live[op[1] % len(live)])
            else:
                engine.step()
                freed.extend(b for s in engine.scheduler.running for b in s.block_table if b == FREED)
            _check_invariants(engine)
        while engine.has_unfinished_requests():
            engine.step()
            _check_invariants(engine)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        assert engine.scheduler.num_waiting == 0 and not engine.scheduler.running

    run()
    assert len(examples) == num_examples
    assert engine.stats()["num_preemptions"] > 0
    assert bool(freed) == (window is not None)
