"""Pictures through the served app, on a tiny LLaVA: the `openai` SDK's chat (whole and streamed, data: URLs, an allowed
http URL, an allowed s3:// URI), the `anthropic` SDK's image blocks, the Responses API's input_image (by URL and by
the file_id of an upload) and a batch file with image lines each answer as the offline engine does, the pictures
encoded by the app's encoder deployment; every kind of bad picture is a 400 in the API's shape, after which the next
request is served."""

import base64
import http.server
import threading

import anthropic
import boto3
import openai
import pytest
import requests
import torch
from ray import serve

from deployments.app_config import encoder_name, replica_name
from runtime import LLM, SamplingParams
from runtime.config import EngineConfig
from runtime.engine.image_encoder import ImageEncoder
from runtime.engine.validator import RequestValidator
from testing.helpers import wait_until
from testing.vision_checkpoints import build_llava_dir, data_url, declared_size_png, encoded, random_picture
from tests.conftest import ENGINE_KWARGS, another_app, app_args
from tests.deployments.batch.test_batches import jsonl, read_jsonl
from tests.runtime.test_vision_models import conversation

MODEL = "llava"
BUCKET = "vision-images"
GREEDY = {"max_tokens": 12, "temperature": 0}


class PictureHost(http.server.ThreadingHTTPServer):
    """An http server on 127.0.0.1 with a picture at /picture.png and a URL that never answers (/hang)."""

    def __init__(self, picture: bytes):
        hang = self.hang = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/hang":
                    hang.wait(60)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(picture)))
                self.end_headers()
                self.wfile.write(picture)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return build_llava_dir(tmp_path_factory.mktemp("served-llava"))


@pytest.fixture(scope="module")
def host():
    server = PictureHost(encoded(random_picture(1)))
    yield server
    server.hang.set()
    server.shutdown()


@pytest.fixture(scope="module")
def vision_app(server, llava, host, s3_endpoint, tmp_path_factory):
    """The base URL of an app beside the shared one serving the tiny LLaVA, reading pictures from 127.0.0.1 and
    s3://vision-images/ too (allowed_media_domains, allowed_media_prefixes), two pictures a prompt at most, its
    pictures encoded by an encoder deployment of its own (encoder_config)."""
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    args = app_args(llava, f"file://{tmp_path_factory.mktemp('vision-storage')}")
    args["llm_configs"][0].update(model_loading_config={"model_id": MODEL, "model_source": str(llava)},
                                  engine_kwargs={**ENGINE_KWARGS, "limit_mm_per_prompt": {"image": 2}},
                                  encoder_config={"deployment_config": {"ray_actor_options": {"num_cpus": 0}}})
    args.update(allowed_media_domains=["127.0.0.1"], allowed_media_prefixes=[f"s3://{BUCKET}/"],
                media_fetch_timeout_s=2, max_batch_line_bytes=1 << 20)
    with another_app(server, "vision", args) as url:
        yield url


@pytest.fixture(scope="module")
def offline(llava):
    """The offline engine's greedy answer to a user turn of text and pictures."""
    llm = LLM(str(llava), **ENGINE_KWARGS)

    def answer(text: str, pictures: list) -> tuple[str, int]:
        parts = [{"type": "text", "text": text}, *({"type": "image", "image": p} for p in pictures)]
        out = llm.chat([{"role": "user", "content": parts}], SamplingParams(temperature=0, max_tokens=12))[0]
        return out.outputs[0].text, len(out.prompt_token_ids)

    return answer


def user_turn(text: str, *urls: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         *({"type": "image_url", "image_url": {"url": u, "detail": "low"}}
                                           for u in urls)]}]


@pytest.mark.parametrize("count", [1, 2])
def test_chat_whole_and_streamed_equal_the_offline_engine(vision_app, offline, count):
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None")
    pictures = [random_picture(seed) for seed in range(count)]
    text, prompt_tokens = offline("What is this? ", pictures)
    messages = user_turn("What is this? ", *map(data_url, pictures))
    whole = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert whole.choices[0].message.content == text
    assert whole.usage.prompt_tokens == prompt_tokens  # the pictures' tokens counted
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    counted = requests.post(f"{vision_app}/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert counted["count"] == prompt_tokens


def encoder_counts() -> tuple[int, int, int]:
    """Pictures the replica's engine encoded, the pictures it received encoded, and those the encoder encoded."""
    replica = serve.get_deployment_handle(replica_name(MODEL), app_name="vision").stats.remote().result()
    encoder = serve.get_deployment_handle(encoder_name(MODEL), app_name="vision").stats.remote().result()
    return replica["images_encoded"], replica["images_received"], encoder["images_encoded"]


def test_the_encoder_deployment_encodes_the_pictures_the_cache_lacks(vision_app, llava):
    """A picture goes through the encoder deployment, not the replica's tower; asked again, its prefix is cached
    and neither encodes it."""
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None")
    picture, text = random_picture(11), " Describe it in a few words, and then say what colours it has." * 3
    reference = LLM(str(llava), **ENGINE_KWARGS).chat(
        [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": text}]}],
        SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture)}},
                                             {"type": "text", "text": text}]}]
    before = encoder_counts()
    for _ in range(2):
        reply = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
        assert reply.choices[0].message.content == reference
        assert encoder_counts() == (0, before[1] + 1, before[2] + 1)


def test_the_encoder_batches_the_calls_that_arrive_together(vision_app, llava):
    """Six calls sent at once, as six replicas' requests would come: fewer passes through the tower than calls
    (Serve's dynamic batching), and each call gets its own pictures' rows, as the encoder alone computes them."""
    handle = serve.get_deployment_handle(encoder_name(MODEL), app_name="vision")
    config = EngineConfig(model=str(llava), **ENGINE_KWARGS)
    validator, alone = RequestValidator(config), ImageEncoder(config)
    text = validator.tokenizer.apply_chat_template(conversation(1), tokenize=False, add_generation_prompt=True)
    calls = [[validator.process_images(text, [random_picture(40 + i + j)])[1][0].tensors for j in range(1 + i % 2)]
             for i in range(6)]
    passes = handle.stats.remote().result()["encoder_passes"]
    responses = [handle.encode.remote(call) for call in calls]
    answers = [response.result() for response in responses]
    assert handle.stats.remote().result()["encoder_passes"] - passes < len(calls)
    for call, rows in zip(calls, answers, strict=True):
        assert [r.shape for r in rows] == [r.shape for r in alone.encode(call)]
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(rows, alone.encode(call), strict=True))
    validator.close()


def test_pictures_by_allowed_http_and_s3_urls(vision_app, offline, host):
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None")
    picture = random_picture(1)
    boto3.client("s3").put_object(Bucket=BUCKET, Key="cat.png", Body=encoded(picture))
    text, _ = offline("Look: ", [picture])
    for url in (f"{host.url}/picture.png", f"s3://{BUCKET}/cat.png"):
        reply = client.chat.completions.create(model=MODEL, messages=user_turn("Look: ", url), **GREEDY)
        assert reply.choices[0].message.content == text, url


def test_anthropic_and_responses_take_pictures(vision_app, offline):
    picture = random_picture(2)
    text, _ = offline("Describe ", [picture])
    claude = anthropic.Anthropic(base_url=vision_app, api_key="None")
    blocks = [{"type": "text", "text": "Describe "},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": base64.b64encode(encoded(picture)).decode()}}]
    message = claude.messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": blocks}])
    assert message.content[0].text == text
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None")
    response = client.responses.create(model=MODEL, max_output_tokens=12, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Describe "},
                                     {"type": "input_image", "image_url": data_url(picture)}]}])
    assert response.output_text == text


def test_responses_take_an_uploaded_picture_by_file_id(vision_app, offline):
    """A picture uploaded to the Files API (purpose vision) answers as the same picture sent inline; its input item
    names the file; an unknown file id is a 400 naming the part, and the next request is served."""
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None", max_retries=0)
    picture = random_picture(7)
    text, _ = offline("Describe ", [picture])
    uploaded = client.files.create(file=("cat.png", encoded(picture)), purpose="vision")
    assert uploaded.purpose == "vision" and uploaded.bytes == len(encoded(picture))
    content = [{"type": "input_text", "text": "Describe "}, {"type": "input_image", "file_id": uploaded.id}]
    response = client.responses.create(model=MODEL, max_output_tokens=12, temperature=0,
                                       input=[{"role": "user", "content": content}])
    assert response.output_text == text
    items = client.responses.input_items.list(response.id).data
    assert items[0].content[1].model_dump(exclude_none=True) == {"type": "input_image", "file_id": uploaded.id}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, max_output_tokens=12, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Describe "}, {"type": "input_image", "file_id": "file-missing"}]}])
    assert e.value.body["param"] == "input[0].content[1].file_id", e.value.body
    assert "no file with id 'file-missing'" in e.value.body["message"]
    assert client.responses.create(model=MODEL, max_output_tokens=12, temperature=0,
                                   input=[{"role": "user", "content": content}]).output_text == text


def test_a_batch_of_image_lines(vision_app, offline):
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None")
    pictures = [random_picture(seed) for seed in (3, 4)]
    lines = [{"custom_id": f"picture-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": user_turn("Name it: ", data_url(p)), **GREEDY}}
             for i, p in enumerate(pictures)]
    uploaded = client.files.create(file=("pictures.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
                       timeout=120)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    answers = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
               for r in read_jsonl(client, batch.output_file_id)}
    assert answers == {f"picture-{i}": offline("Name it: ", [p])[0] for i, p in enumerate(pictures)}


def _truncated() -> str:
    png = encoded(random_picture(5))
    return "data:image/png;base64," + base64.b64encode(png[: len(png) // 2]).decode()


BAD = {
    "corrupt": ("data:image/png;base64," + base64.b64encode(b"not a picture at all").decode(), "not an image"),
    "truncated": (_truncated(), "could not be decoded"),
    "bomb": ("data:image/png;base64," + base64.b64encode(declared_size_png(100_000, 100_000)).decode(), "pixels"),
    # a shortest-edge resize would make it 33,600,000 x 336
    "long and thin": ("data:image/png;base64," + base64.b64encode(declared_size_png(1, 100_000)).decode(),
                      "over 200 times its shorter"),
    "malformed URL": ("http://[::1/cat.png", "not a URL"),
    "unsupported format": (data_url(random_picture(6), "TIFF"), "not an image in a supported format"),
    "bad base64": ("data:image/png;base64,%%%", "not valid base64"),
    "file scheme": ("file:///etc/passwd", "unsupported image URL scheme"),
    "other domain": ("http://example.com/cat.png", "not fetched from example.com"),
    "s3 outside the prefixes": ("s3://another-bucket/cat.png", "not under a prefix"),
    "hanging fetch": ("{host}/hang", "took over 2"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_picture_is_a_400_and_the_next_request_is_served(vision_app, host, case):
    url, message = BAD[case]
    client = openai.Client(base_url=f"{vision_app}/v1", api_key="None", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=user_turn("Hi ", url.format(host=host.url)), **GREEDY)
    error = e.value.body
    assert message in error["message"] and error["param"] == "messages[0].content[1].image_url", error
    assert client.chat.completions.create(model=MODEL, messages=user_turn("Hi ", data_url(random_picture(1))),
                                          **GREEDY).choices[0].message.content


def test_too_many_pictures_and_pictures_for_a_text_model_are_400s(vision_app, client):
    vision = openai.Client(base_url=f"{vision_app}/v1", api_key="None", max_retries=0)
    url = data_url(random_picture(1))
    with pytest.raises(openai.BadRequestError, match="over the 2 a prompt may hold"):
        vision.chat.completions.create(model=MODEL, messages=user_turn("Hi ", url, url, url), **GREEDY)
    with pytest.raises(openai.BadRequestError, match="does not take images"):
        client.chat.completions.create(model="qwen/qwen2.5-0.5b-instruct", messages=user_turn("Hi ", url), **GREEDY)
    assert vision.chat.completions.create(model=MODEL, messages=user_turn("Hi ", url), **GREEDY).choices
    assert client.chat.completions.create(model="qwen/qwen2.5-0.5b-instruct",
                                          messages=[{"role": "user", "content": "Hi"}], **GREEDY).choices
