"""The image encoder on its own (`runtime.engine.image_encoder`, what an encoder deployment runs): pictures it
encodes, handed to an engine as `ImageInput.encoded`, answer as the engine's own encoding does, with prefill
chunks cutting through them and the engine's tower left idle; rows of the wrong shape fail their request only; a
text-only model has no encoder to serve; the encoder builds and reads no language model."""

import pytest
import torch

from runtime import LLM, InvalidInputError, LLMEngine, SamplingParams
from runtime.config import EngineConfig
from runtime.engine.image_encoder import ImageEncoder
from testing.model_factory import build_model_dir
from testing.vision_checkpoints import build_llava_dir, random_picture
from tests.runtime.test_vision_models import FAMILIES, OPTIONS, conversation, conversation_with

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return build_llava_dir(tmp_path_factory.mktemp("encoder-llava"))


def run(engine: LLMEngine) -> dict[str, list]:
    """Step the engine until it is idle: each request's deltas."""
    out: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            out.setdefault(delta.request_id, []).append(delta)
    return out


def prompt_with(engine: LLMEngine, pictures: list):
    text = engine.tokenizer.apply_chat_template(conversation(len(pictures)), tokenize=False,
                                                add_generation_prompt=True)
    return engine.validator.process_images(text, pictures)


def test_pictures_encoded_apart_answer_as_the_engine_encoding_them(llava):
    pictures = [random_picture(3), random_picture(4)]
    reference = LLM(str(llava), **OPTIONS).chat(conversation_with(pictures), GREEDY)[0].outputs[0].token_ids
    encoder = ImageEncoder(EngineConfig(model=str(llava), **OPTIONS))
    engine = LLMEngine(EngineConfig(model=str(llava), **OPTIONS, max_num_batched_tokens=8))  # chunks cut through
    ids, images = prompt_with(engine, pictures)
    rows = encoder.encode([image.tensors for image in images])
    assert [r.shape[0] for r in rows] == [image.num_rows for image in images] and encoder.images_encoded == 2
    engine.add_request("apart", ids, GREEDY, images=tuple(map(lambda i, r: i.replaced_by(r), images, rows)))
    deltas = run(engine)["apart"]
    assert [t for d in deltas for s in d.seqs for t in s.token_ids] == reference
    stats = engine.stats()
    assert (stats["images_encoded"], stats["images_received"]) == (0, 2)


def test_rows_of_the_wrong_shape_fail_their_request_only(llava):
    engine = LLMEngine(EngineConfig(model=str(llava), **OPTIONS))
    ids, images = prompt_with(engine, [random_picture(5)])
    rows = ImageEncoder(EngineConfig(model=str(llava), **OPTIONS)).encode([images[0].tensors])[0]
    engine.add_request("short", ids, GREEDY, images=(images[0].replaced_by(rows[1:]),))
    engine.add_request("whole", ids, GREEDY, images=(images[0].replaced_by(rows),))
    out = run(engine)
    assert "came encoded wrongly" in out["short"][-1].error
    assert out["whole"][-1].error is None and sum(len(s.token_ids) for d in out["whole"] for s in d.seqs) == 12


def test_a_text_only_model_has_no_encoder(llava, tmp_path):
    with pytest.raises(InvalidInputError, match="takes no images"):
        ImageEncoder(EngineConfig(model=str(build_model_dir(tmp_path / "text", "qwen2")), max_model_len=256))
    with pytest.raises(InvalidInputError, match="image 0 serves it text-only"):
        ImageEncoder(EngineConfig(model=str(llava), **OPTIONS, limit_mm_per_prompt={"image": 0}))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_encoder_builds_and_reads_the_tower_and_projector_alone(name, tmp_path):
    """For every vision-language family: the encoder's parameters are the full model's tower's and projector's,
    every one of them, and it encodes a picture as the full model does."""
    path = FAMILIES[name][0](tmp_path / name)
    engine = LLMEngine(EngineConfig(model=str(path), **OPTIONS))
    encoder = ImageEncoder(EngineConfig(model=str(path), **OPTIONS))
    full = dict(engine.runner.model.named_parameters())
    tower = {n: p for n, p in full.items() if not n.startswith(("model.", "lm_head."))}
    assert tower and sorted(dict(encoder.model.named_parameters())) == sorted(tower)
    _, images = prompt_with(engine, [random_picture(3)])
    with torch.inference_mode():
        expected = engine.runner.model.encode_images([images[0].tensors])
    assert torch.equal(encoder.encode([images[0].tensors])[0], expected[0])
