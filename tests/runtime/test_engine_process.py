"""The engine in a process of its own (engine_process): what crosses the process boundary (pictures, encoded rows
and adapters by value), and what happens when that process fails or dies. Its deltas equal the in-thread engine's
in test_async_engine.py, which runs every test on both."""

import asyncio
import json
import os
import signal

import psutil
import pytest
import torch

from runtime import LLM, AsyncLLMEngine, EngineDeadError, InvalidInputError, SamplingParams
from runtime.config import EngineConfig
from runtime.engine.engine_process import engine_threads
from runtime.engine.image_encoder import ImageEncoder
from runtime.lora import LoRARequest
from runtime.text.grammar import Constraint
from testing.lora_adapters import make_adapter
from testing.vision_checkpoints import build_llava_dir, random_picture
from tests.runtime.test_vision_models import conversation, conversation_with


def start(model, **options) -> AsyncLLMEngine:
    return AsyncLLMEngine.from_options(str(model), dtype="float32", max_model_len=128, engine_process=True, **options)


def generate(engine: AsyncLLMEngine, prompt: list[int], params: SamplingParams, request_id: str | None = None):
    async def run():
        return [d async for d in engine.generate(engine.validate(prompt, params), request_id)]
    return asyncio.run(run())


def test_the_engine_steps_in_a_child_process_which_ends_with_shutdown(qwen2_model):
    engine = start(qwen2_model)
    child = psutil.Process(engine.engine.process.pid)
    assert child.ppid() == os.getpid() and child.is_running()
    assert child.environ()["OMP_NUM_THREADS"] == str(engine_threads(torch.get_num_threads()))
    deltas = generate(engine, [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert deltas[-1].finished and deltas[-1].seqs[0].num_output_tokens == 4
    assert engine.stats()["num_requests"] == 0
    engine.shutdown()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_on_cpu_the_child_leaves_a_quarter_of_the_cores_rounded_down_to_the_server():
    assert [engine_threads(cpus) for cpus in (1, 2, 3, 4, 8, 16, 64)] == [1, 2, 3, 3, 6, 12, 48]


def test_a_build_that_fails_in_the_child_raises_its_error_in_the_server(qwen2_model):
    """The KV budget is checked when the child allocates the cache: its InvalidInputError, field and all."""
    with pytest.raises(InvalidInputError, match="fewer than max_model_len") as e:
        start(qwen2_model, kv_cache_bytes=1024)
    assert e.value.param == "kv_cache_bytes"


def test_a_structured_output_grammar_is_compiled_by_the_child(qwen2_model):
    """A compiled grammar stays in the server; the child compiles its own, without compile processes of its own
    (the server's showed it compiles in time), and the output keeps to it."""
    engine = start(qwen2_model)
    child = psutil.Process(engine.engine.process.pid)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    params = SamplingParams(temperature=0, max_tokens=40, structured_output=Constraint("json_schema",
                                                                                      json.dumps(schema)))
    try:
        deltas = generate(engine, [5, 6, 7], params)
        assert child.children() == []
    finally:
        engine.shutdown()
    text = "".join(s.text for d in deltas for s in d.seqs)
    assert deltas[-1].seqs[-1].finish_reason == "stop" and set(json.loads(text)) == {"a"}


def test_a_killed_engine_process_fails_the_requests_in_flight_and_marks_the_engine_dead(qwen2_model):
    engine = start(qwen2_model)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)

    async def main():
        stream = engine.generate(engine.validate([5, 6, 7], params))
        await anext(stream)
        os.kill(engine.engine.process.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass

    try:
        asyncio.run(main())
        assert not engine.healthy and not engine.check_health()
        with pytest.raises(EngineDeadError):
            generate(engine, [5], SamplingParams(max_tokens=1))
    finally:
        engine.shutdown()


def test_pictures_and_encoded_rows_cross_to_the_child_by_value(tmp_path):
    """A picture's pixel tensors, and the rows an encoder deployment computed for it, reach the child whole (not as
    shared-memory handles, which a process that multiprocessing did not start cannot open): both answer as the
    in-process engine does."""
    llava, options = build_llava_dir(tmp_path / "llava"), {"dtype": "float32", "max_model_len": 512}
    picture, greedy = random_picture(3), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = LLM(str(llava), **options).chat(conversation_with([picture]), greedy)[0].outputs[0].token_ids
    engine = AsyncLLMEngine.from_options(str(llava), engine_process=True, enable_prefix_caching=False, **options)
    try:
        text = engine.tokenizer.apply_chat_template(conversation(1), tokenize=False, add_generation_prompt=True)
        ids, images = engine.validator.process_images(text, [picture])
        rows = ImageEncoder(EngineConfig(model=str(llava), **options)).encode([images[0].tensors])[0]
        for pictures in (images, (images[0].replaced_by(rows),)):
            deltas = asyncio.run(_collect(engine.generate(engine.validate(ids, greedy, images=pictures))))
            assert [t for d in deltas for s in d.seqs for t in s.token_ids] == expected
        assert (engine.stats()["images_encoded"], engine.stats()["images_received"]) == (1, 1)
    finally:
        engine.shutdown()


def test_the_child_says_how_much_of_a_prompt_with_a_picture_its_cache_holds(tmp_path):
    """What the chat handler asks before it sends pictures to an encoder deployment: nothing before the prompt
    ran, its whole blocks after, and nothing for the same text with another picture (its content hash differs),
    as the in-process engine answers."""
    llava, options = build_llava_dir(tmp_path / "llava"), {"dtype": "float32", "max_model_len": 512}
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine = AsyncLLMEngine.from_options(str(llava), engine_process=True, **options)
    try:
        text = engine.tokenizer.apply_chat_template(conversation(1), tokenize=False, add_generation_prompt=True)
        ids, images = engine.validator.process_images(text, [random_picture(3)])
        _, other = engine.validator.process_images(text, [random_picture(4)])
        valid, valid_other = engine.validate(ids, greedy, images=images), engine.validate(ids, greedy, images=other)
        assert engine.engine.cached_prompt_tokens(valid) == 0
        asyncio.run(_collect(engine.generate(valid)))
        held = (len(ids) - 1) // 16 * 16
        assert held > images[0].end and engine.engine.cached_prompt_tokens(valid) == held
        assert engine.engine.cached_prompt_tokens(valid_other) < images[0].end
    finally:
        engine.shutdown()


def test_an_adapter_crosses_to_the_child_by_value(qwen2_model, tmp_path):
    """A LoRA request's adapter, read on the server's side, reaches the child whole: its tokens are the in-process
    engine's."""
    make_adapter(qwen2_model, tmp_path / "adapter", 8, 16, ["q_proj", "v_proj"], False, seed=1)
    lora, greedy = LoRARequest("adapter", str(tmp_path / "adapter")), SamplingParams(temperature=0, max_tokens=6,
                                                                                    ignore_eos=True)
    expected = LLM(str(qwen2_model), dtype="float32", max_model_len=128, enable_lora=True).generate(
        [[5, 6, 7]], greedy, lora_request=lora)[0].outputs[0].token_ids
    engine = start(qwen2_model, enable_lora=True)
    try:
        deltas = asyncio.run(_collect(engine.generate(engine.validate([5, 6, 7], greedy, lora))))
    finally:
        engine.shutdown()
    assert deltas[-1].error is None and [t for d in deltas for s in d.seqs for t in s.token_ids] == expected


async def _collect(stream) -> list:
    return [delta async for delta in stream]
