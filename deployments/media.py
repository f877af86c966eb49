"""Pictures a request names by URL, read within the operator's bounds on a model's replica (so chat, Responses,
Anthropic Messages and batch lines all take them the same way):

- `data:` URLs (base64), always;
- `http(s)://` URLs whose host the app config allows (`allowed_media_domains`, vLLM's name; none by default),
  fetched with a time bound, no redirects, and a size bound read as the bytes arrive;
- `s3://` URIs under a prefix the app config allows (`allowed_media_prefixes`; none by default), read through
  boto3 up to the size bound.

Anything else (`file://`, another host, a bad data URL, too many bytes, a file that is not a picture) is a 400 in
OpenAI's shape that names the message part."""

import asyncio
import base64
import binascii
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from PIL import Image

from deployments.errors import OpenAIError
from deployments.storage import MissingObjectError, StoreError, open_s3_object
from deployments.work_pool import off_loop
from runtime.multimodal import ImageLimits, decode_image


@dataclass(frozen=True)
class MediaPolicy:
    allowed_domains: tuple[str, ...] = ()  # hosts http(s) pictures may come from (exact names)
    s3_prefixes: tuple[str, ...] = ()  # s3:// prefixes pictures may be read under
    limits: ImageLimits = ImageLimits()  # of one picture: its bytes, pixels and shape
    fetch_timeout_s: float = 10.0  # for the whole of one http(s) fetch


class MediaLoader:
    def __init__(self, policy: MediaPolicy):
        self.policy = policy
        self.limits = policy.limits
        self._client: httpx.AsyncClient | None = None

    async def images(self, urls: list[tuple[str, str]]) -> list[Image.Image]:
        """The pictures at `urls` ((url, the request field that named it)), decoded, fetched concurrently."""
        return list(await asyncio.gather(*(self.image(url, param) for url, param in urls)))

    async def image(self, url: str, param: str) -> Image.Image:
        data = await self._read(url, param)
        try:
            return await off_loop(decode_image, data, self.limits)
        except ValueError as e:
            raise OpenAIError(400, f"{param}: {e}", param) from None

    async def _read(self, url: str, param: str) -> bytes:
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError as e:  # a malformed authority ("http://[::1")
            raise OpenAIError(400, f"{param}: not a URL: {e}", param) from None
        scheme = parts.scheme.lower() if not url.startswith("data:") else "data"
        if scheme == "data":
            return self._data_url(url, param)
        if scheme in ("http", "https"):
            return await self._fetch(url, host, param)
        if scheme == "s3":
            return await off_loop(self._s3_object, url, param)
        raise OpenAIError(400, f"{param}: unsupported image URL scheme {scheme + ':' if scheme else '(none)'}; "
                          "send a data: URL, an http(s) URL of an allowed domain, or an allowed s3:// URI", param)

    def _data_url(self, url: str, param: str) -> bytes:
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise OpenAIError(400, f"{param}: a data URL must be data:<type>;base64,<data>", param)
        if len(payload) > self.limits.max_bytes * 4 // 3 + 4:
            raise OpenAIError(400, f"{param}: the image is over the {self.limits.max_bytes} bytes allowed", param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise OpenAIError(400, f"{param}: the data URL is not valid base64 ({e})", param) from None

    async def _fetch(self, url: str, host: str, param: str) -> bytes:
        if host not in self.policy.allowed_domains:
            raise OpenAIError(400, f"{param}: images are not fetched from {host or 'that URL'}: the server allows "
                              f"{', '.join(self.policy.allowed_domains) or 'no domains'} (allowed_media_domains)",
                              param)
        if self._client is None:  # no proxies or credentials from the environment; the bytes as sent
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                             headers={"Accept-Encoding": "identity"})
        try:
            return await asyncio.wait_for(self._download(url, param), self.policy.fetch_timeout_s)
        except asyncio.TimeoutError:
            raise OpenAIError(400, f"{param}: fetching the image took over {self.policy.fetch_timeout_s} s",
                              param) from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise OpenAIError(400, f"{param}: the image could not be fetched: {type(e).__name__}", param) from None

    async def _download(self, url: str, param: str) -> bytes:
        async with self._client.stream("GET", url, timeout=self.policy.fetch_timeout_s) as response:
            if response.status_code != 200:
                raise OpenAIError(400, f"{param}: fetching the image gave HTTP {response.status_code}", param)
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > self.limits.max_bytes:
                    raise OpenAIError(400, f"{param}: the image is over the {self.limits.max_bytes} bytes allowed",
                                      param)
            return bytes(data)

    def _s3_object(self, uri: str, param: str) -> bytes:
        if not any(uri.startswith(p if p.endswith("/") else p + "/") for p in self.policy.s3_prefixes):
            raise OpenAIError(400, f"{param}: {uri} is not under a prefix this server reads images from", param)
        store, key = open_s3_object(uri)
        try:
            data = bytearray()
            for chunk in store.iter_chunks(key):
                data += chunk
                if len(data) > self.limits.max_bytes:
                    raise OpenAIError(400, f"{param}: the image is over the {self.limits.max_bytes} bytes allowed",
                                      param)
            return bytes(data)
        except MissingObjectError:
            raise OpenAIError(400, f"{param}: no object at {uri}", param) from None
        except StoreError as e:
            raise OpenAIError(400, f"{param}: {uri} could not be read: {e}", param) from None
