"""Vision-language models against transformers' own classes: tiny random LLaVA (CLIP tower, projector, Qwen2),
Gemma 3 (SigLIP, pictures' tokens attending both ways), Mistral 3 (Pixtral's tower, pictures spelled out row by
row with breaks), Llama 4 (pictures in tiles, chunked attention, experts), Qwen2-VL, Qwen2.5-VL (windowed tower,
M-RoPE by sections), Qwen3-VL (resized learned positions, interleaved M-RoPE, deep-stack taps), Qwen3.5 (Qwen3-VL's
tower without taps, linear attention) and Qwen3.5-MoE checkpoints saved with their processors, prompted with one
and two pictures; greedy tokens equal transformers' `generate` on the same pictures and text, with prefill chunks
cutting through (or, for Gemma 3, stopping before) a picture's tokens, from the prefix cache on a repeated picture
(where the model has one), and at TP=2; and they differ when the picture does."""

import pytest
import torch
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
)

from runtime import LLM, InvalidInputError, LLMEngine, SamplingParams
from runtime.config import EngineConfig
from runtime.engine.validator import RequestValidator
from runtime.models.gemma3_vl import Gemma3ForConditionalGeneration
from testing.model_factory import build_model_dir
from testing.vision_checkpoints import (
    build_gemma3_dir,
    build_llama4_dir,
    build_llava_dir,
    build_mistral3_dir,
    build_qwen2_5_vl_dir,
    build_qwen2_vl_dir,
    build_qwen3_5_dir,
    build_qwen3_5_moe_dir,
    build_qwen3_vl_dir,
    random_picture,
)

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
OPTIONS = {"dtype": "float32", "max_model_len": 512}  # transformers' reference runs in float32 (on a GPU too)


def conversation(pictures: int) -> list[dict]:
    parts = [{"type": "text", "text": "Compare "}]
    for i in range(pictures):
        parts += [{"type": "image"}, {"type": "text", "text": f" and {i} "}]
    return [{"role": "user", "content": parts}]


def without_eos(model):
    """`model`, generating past its end-of-sequence tokens (as `ignore_eos` does)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def processor_reference(path):
    """The checkpoint's processor and transformers' model class (LLaVA's, Gemma 3's: its processor gives the token
    types that make a picture's tokens attend both ways)."""
    processor = AutoProcessor.from_pretrained(path)
    model = without_eos(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval())

    def generate(pictures: list) -> list[int]:
        text = processor.apply_chat_template(conversation(len(pictures)), add_generation_prompt=True)
        inputs = processor(text=[text], images=pictures, return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1]:].tolist()

    return generate


def qwen_reference(path):
    """Qwen's processor, by its steps (its video half needs torchvision): each <|image_pad|> repeated for the
    picture's merged patches, and the token types its M-RoPE positions are computed from."""
    tokenizer, images = AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path)
    model = without_eos(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval())

    def generate(pictures: list) -> list[int]:
        text = tokenizer.apply_chat_template(conversation(len(pictures)), tokenize=False, add_generation_prompt=True)
        tensors = images(images=pictures, return_tensors="pt")
        pieces = text.split("<|image_pad|>")
        counts = (tensors["image_grid_thw"].prod(-1) // 4).tolist()
        text = pieces[0] + "".join("<|image_pad|>" * n + piece for n, piece in zip(counts, pieces[1:]))
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **tensors, do_sample=False,
                             mm_token_type_ids=(ids == model.config.image_token_id).int(),
                             max_new_tokens=GREEDY.max_tokens)
        return out[0, ids.shape[1]:].tolist()

    return generate


def pixtral_reference(path):
    """Mistral 3's processor, by its steps (transformers' Pixtral processor needs torchvision): each picture row by
    row, a row's [IMG] tokens (one per 8 x 8 pixels: 4-pixel patches merged 2 x 2) then [IMG_BREAK], the last
    break an [IMG_END]."""
    tokenizer, images = AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path)
    model = without_eos(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval())

    def spelled(height: int, width: int) -> str:
        tokens = (["[IMG]"] * (width // 8) + ["[IMG_BREAK]"]) * (height // 8)
        return "".join(tokens[:-1] + ["[IMG_END]"])

    def generate(pictures: list) -> list[int]:
        text = tokenizer.apply_chat_template(conversation(len(pictures)), tokenize=False, add_generation_prompt=True)
        tensors = images(images=pictures, return_tensors="pt")
        pieces = text.split("[IMG]")
        text = pieces[0] + "".join(spelled(*size) + piece
                                   for size, piece in zip(tensors["image_sizes"].tolist(), pieces[1:]))
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **tensors, do_sample=False,
                             max_new_tokens=GREEDY.max_tokens)
        return out[0, ids.shape[1]:].tolist()

    return generate


def llama4_reference(path):
    """Llama 4's processor by our validator's steps (equal to transformers' own: test_llama4_tiles), and
    transformers' model by its parts: its `forward` on pictures fails in transformers 5.24 (it reads `image_outputs`
    off the language model's output), so the pictures' rows are scattered into the prompt's embeddings as that
    `forward` does it, and its language model generates from them."""
    validator = RequestValidator(EngineConfig(model=str(path), **OPTIONS))
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    without_eos(model.language_model)

    def generate(pictures: list) -> list[int]:
        text = validator.tokenizer.apply_chat_template(conversation(len(pictures)), tokenize=False,
                                                       add_generation_prompt=True)
        ids, images = validator.process_images(text, pictures)
        ids = torch.tensor([ids])
        with torch.no_grad():
            tiles = torch.cat([image.tensors["pixel_values"] for image in images]).float()
            rows = model.multi_modal_projector(model.get_image_features(pixel_values=tiles).last_hidden_state)
            embeds = model.get_input_embeddings()(ids)
            embeds = embeds.masked_scatter((ids == model.config.image_token_id)[..., None].expand_as(embeds),
                                           rows.flatten(0, 1))
            out = model.language_model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids),
                                                max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0].tolist()

    return generate


FAMILIES = {"llava": (build_llava_dir, processor_reference), "gemma3": (build_gemma3_dir, processor_reference),
            "mistral3": (build_mistral3_dir, pixtral_reference), "llama4": (build_llama4_dir, llama4_reference),
            "qwen2_vl": (build_qwen2_vl_dir, qwen_reference),
            "qwen2_5_vl": (build_qwen2_5_vl_dir, qwen_reference), "qwen3_vl": (build_qwen3_vl_dir, qwen_reference),
            "qwen3_5": (build_qwen3_5_dir, qwen_reference), "qwen3_5_moe": (build_qwen3_5_moe_dir, qwen_reference)}
# Qwen3.5's linear-attention layers keep a state per sequence: no prefix cache
CACHED = ["llava", "gemma3", "mistral3", "llama4", "qwen2_5_vl"]


def _family(request, tmp_path_factory):
    """(checkpoint directory, transformers' greedy tokens for a conversation with these pictures)."""
    build, reference = FAMILIES[request.param]
    path = build(tmp_path_factory.mktemp(request.param))
    return path, reference(path)


family = pytest.fixture(scope="module", params=list(FAMILIES))(_family)
cached_family = pytest.fixture(scope="module", params=CACHED)(_family)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return build_llava_dir(tmp_path_factory.mktemp("llava"))


def chat(llm: LLM, pictures: list) -> list[int]:
    messages = conversation(len(pictures))
    parts = [dict(p, image=pictures[i]) if p["type"] == "image" else p
             for i, p in zip(_picture_indices(messages[0]["content"]), messages[0]["content"])]
    return llm.chat([{"role": "user", "content": parts}], GREEDY)[0].outputs[0].token_ids


def _picture_indices(parts: list[dict]) -> list[int]:
    indices, n = [], 0
    for p in parts:
        indices.append(n)
        n += p["type"] == "image"
    return indices


# prefill chunks that cut through every picture's tokens (16 or 20), or, for Gemma 3 (whose pictures' tokens attend
# both ways: a chunk holds a picture whole), stop before pictures
SMALL_CHUNK = {"gemma3": 20}


def small_chunk(request) -> int:
    return SMALL_CHUNK.get(request.node.callspec.params["family"], 8)


@pytest.mark.parametrize("pictures", [1, 2])
@pytest.mark.parametrize("whole", [True, False])
def test_greedy_equals_transformers(request, family, pictures, whole):
    path, reference = family
    images = [random_picture(seed) for seed in range(pictures)]
    chunk = 2048 if whole else small_chunk(request)
    llm = LLM(str(path), max_num_batched_tokens=chunk, **OPTIONS)
    assert chat(llm, images) == reference(images)
    assert llm.stats()["encoder_cache_images"] == 0  # every picture consumed, its output let go
    assert llm.stats()["images_encoded"] == pictures


def test_the_tokens_follow_the_picture(family):
    path, reference = family
    llm = LLM(str(path), **OPTIONS)
    first, second = chat(llm, [random_picture(1)]), chat(llm, [random_picture(2)])
    assert first != second  # the check above is discriminative: the picture decides the answer
    assert second == reference([random_picture(2)])


def test_a_repeated_picture_is_a_prefix_cache_hit_and_another_is_not(cached_family):
    path, reference = cached_family
    llm = LLM(str(path), **OPTIONS, block_size=4)
    picture = random_picture(3)
    prompt = llm.engine.validator.process_images(
        llm.tokenizer.apply_chat_template(conversation(1), tokenize=False, add_generation_prompt=True), [picture])
    offset = prompt[1][0].offset
    first = llm.chat(conversation_with([picture]), GREEDY)[0]
    again = llm.chat(conversation_with([picture]), GREEDY)[0]
    other = llm.chat(conversation_with([random_picture(4)]), GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == (len(prompt[0]) - 1) // 4 * 4  # every full block, the picture's included
    assert other.num_cached_tokens == offset // 4 * 4  # the blocks before the picture only
    assert again.outputs[0].token_ids == first.outputs[0].token_ids == reference([picture])
    assert other.outputs[0].token_ids == reference([random_picture(4)])
    assert llm.stats()["images_encoded"] == 2  # the hit computed none of the picture's tokens


def conversation_with(pictures: list) -> list[dict]:
    parts = [{"type": "text", "text": "Compare "}]
    for i, picture in enumerate(pictures):
        parts += [{"type": "image", "image": picture}, {"type": "text", "text": f" and {i} "}]
    return [{"role": "user", "content": parts}]


def test_tp2_equals_tp1(request, ray_cluster, family):
    path, reference = family
    images = [random_picture(5), random_picture(6)]
    llm = LLM(str(path), **OPTIONS, tensor_parallel_size=2, max_num_batched_tokens=small_chunk(request))
    try:
        assert llm.chat(conversation_with(images), GREEDY)[0].outputs[0].token_ids == reference(images)
    finally:
        llm.shutdown()


def test_abort_and_preemption_let_go_of_encoder_outputs(llava):
    """A request aborted mid-picture, and one preempted mid-picture, hold no encoder output after the next step;
    the preempted one encodes its picture again when it is readmitted (no prefix cache holds its blocks), and
    answers as if never preempted."""
    engine = LLMEngine(EngineConfig(model=str(llava), **OPTIONS, max_num_batched_tokens=8,
                                    enable_prefix_caching=False, max_num_seqs=1))
    text = engine.tokenizer.apply_chat_template(conversation(1), tokenize=False, add_generation_prompt=True)
    ids, images = engine.validator.process_images(text, [random_picture(7)])
    engine.add_request("aborted", ids, GREEDY, images=images)
    while engine.requests["aborted"].seqs[0].num_computed_tokens <= images[0].offset:
        engine.step()
    assert len(engine.runner.encoder_cache) == 1  # mid-picture: its output waits for the next chunk
    engine.abort("aborted")
    engine.step()
    assert len(engine.runner.encoder_cache) == 0

    engine.add_request("preempted", ids, GREEDY, priority=1, images=images)
    while engine.requests["preempted"].seqs[0].num_computed_tokens <= images[0].offset:
        engine.step()
    engine.add_request("online", [5, 6, 7], GREEDY)  # readmitted first: the preempted one waits for its seat
    engine.scheduler.preempt_all()
    out = {"preempted": [], "online": []}
    for delta in engine.step():
        out[delta.request_id] += [t for s in delta.seqs for t in s.token_ids]
    assert len(engine.runner.encoder_cache) == 0
    while engine.has_unfinished_requests():
        for delta in engine.step():
            out[delta.request_id] += [t for s in delta.seqs for t in s.token_ids]
    assert engine.runner.encoder_cache.images_encoded == 3  # the aborted one's, the preempted one's twice
    assert len(engine.runner.encoder_cache) == 0
    plain = LLM(str(llava), **OPTIONS).generate(
        {"prompt": text, "multi_modal_data": {"image": random_picture(7)}}, GREEDY)[0]
    assert out["preempted"] == plain.outputs[0].token_ids


def test_pictures_beyond_what_the_model_takes_are_refused(llava, tmp_path):
    llm = LLM(str(llava), **OPTIONS, limit_mm_per_prompt={"image": 1})
    with pytest.raises(InvalidInputError, match="over the 1 a prompt may hold"):
        llm.chat(conversation_with([random_picture(1), random_picture(2)]), GREEDY)
    with pytest.raises(InvalidInputError, match="2 image placeholders"):
        llm.generate({"prompt": "<image><image>", "multi_modal_data": {"image": [random_picture(1)]}}, GREEDY)
    text_only = LLM(str(build_model_dir(tmp_path / "text", "qwen2")), max_model_len=256)
    with pytest.raises(InvalidInputError, match="does not take images"):
        text_only.chat(conversation_with([random_picture(1)]), GREEDY)
    assert chat(llm, [random_picture(1)])  # the engine serves on


def test_a_vision_model_served_text_only_builds_no_tower(llava):
    """limit_mm_per_prompt image 0: the tower is neither built nor loaded, text answers as with it, pictures are
    refused; LoRA and pipeline stages, which pictures rule out, pass the engine's checks."""
    text = [{"role": "user", "content": "Compare a and b"}]
    with_tower = LLM(str(llava), **OPTIONS).chat(text, GREEDY)[0].outputs[0].token_ids
    llm = LLM(str(llava), **OPTIONS, limit_mm_per_prompt={"image": 0}, enable_lora=True)
    assert llm.engine.runner.model.vision_tower is None
    assert not any(name.startswith("vision_tower") for name, _ in llm.engine.runner.model.named_parameters())
    assert llm.chat(text, GREEDY)[0].outputs[0].token_ids == with_tower
    with pytest.raises(InvalidInputError, match="does not take images"):
        llm.chat(conversation_with([random_picture(1)]), GREEDY)
    with pytest.raises(InvalidInputError, match="limit_mm_per_prompt image 0 serves it text-only"):
        LLM(str(llava), **OPTIONS, pipeline_parallel_size=2)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = build_gemma3_dir(tmp_path_factory.mktemp("gemma3"))
    return path, processor_reference(path)


def test_gemma3_pictures_attend_both_ways(gemma3, monkeypatch):
    """Transformers' answer needs each picture's tokens to see each other both ways: served causally, the same
    pictures answer otherwise."""
    path, reference = gemma3
    images = [random_picture(1), random_picture(2)]
    assert chat(LLM(str(path), **OPTIONS), images) == reference(images)
    monkeypatch.setattr(Gemma3ForConditionalGeneration, "pictures_attend_both_ways", False)
    assert chat(LLM(str(path), **OPTIONS), images) != reference(images)


def test_gemma3_prefix_hit_ending_inside_a_picture(gemma3):
    """A cached prefix that ends inside a picture (the next prompt shares it up to the picture's end): the rest of
    the picture's queries see its cached tokens and its new ones, as transformers computes the whole prompt."""
    path, _ = gemma3
    llm = LLM(str(path), **OPTIONS, block_size=16)
    picture = random_picture(3)
    first = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "red"}]}]
    second = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "blue"}]}]
    llm.chat(first, GREEDY)
    out = llm.chat(second, GREEDY)[0]
    text = llm.tokenizer.apply_chat_template(second, tokenize=False, add_generation_prompt=True)
    image = llm.engine.validator.process_images(text, [picture])[1][0]
    assert image.offset < out.num_cached_tokens < image.end  # the hit ends inside the picture
    processor = AutoProcessor.from_pretrained(path)
    model = without_eos(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval())
    inputs = processor(text=[text], images=[picture], return_tensors="pt")
    expected = model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
    assert out.outputs[0].token_ids == expected[0, inputs["input_ids"].shape[1]:].tolist()


def test_gemma3_needs_a_chunk_that_holds_a_picture(gemma3):
    with pytest.raises(InvalidInputError, match="must hold a picture's 16 tokens"):
        LLM(str(gemma3[0]), **OPTIONS, max_num_batched_tokens=15)
