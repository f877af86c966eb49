"""What the HTTP routes work with, passed in whole: the app's config, its API keys, its models, the body
parser, and the Batch, Responses and Conversations APIs. `OpenAIFront.for_app` builds them for a Serve
application; a test builds one around any `ModelClient` and serves it in-process
(tests/deployments/http/test_http_app.py)."""

from dataclasses import dataclass

from fastapi import Request
from pydantic import BaseModel

from deployments.api.sampling_fields import salted_by_owner
from deployments.app_config import AppConfig, replica_name
from deployments.batch.api import BatchAPI
from deployments.batch.files import FileLimits
from deployments.batch.job import BatchLimits
from deployments.clients import ModelClient
from deployments.http import published_keys
from deployments.http.auth import ApiKeys
from deployments.http.body import BodyParser
from deployments.http.conversations.handler import ConversationsAPI
from deployments.http.conversations.store import ConversationStore
from deployments.http.models import ModelRegistry
from deployments.http.responses.handler import ResponsesAPI
from deployments.http.responses.store import ResponseStore
from deployments.storage import open_store
from deployments.storage.usage import Quota
from deployments.tracing import start_tracing


@dataclass
class OpenAIFront:
    config: AppConfig
    auth: ApiKeys
    models: ModelRegistry
    body: BodyParser
    batches: BatchAPI
    responses: ResponsesAPI
    conversations: ConversationsAPI

    @classmethod
    def for_app(cls, config: AppConfig, clients: dict[str, ModelClient], app_name: str) -> "OpenAIFront":
        """The front of the Serve application `app_name` (its batch manager is named after it)."""
        start_tracing(config.otlp_traces_endpoint, "rayllm-http")
        models = ModelRegistry(config, clients)
        file_limits = FileLimits(config.max_file_bytes, config.max_file_lines,
                                 Quota(config.max_files_per_key, config.max_file_bytes_per_key))
        batch_limits = BatchLimits(max_line_bytes=config.max_batch_line_bytes, max_lines=config.max_file_lines,
                                   seats=config.batch_seats(), max_active_per_key=config.max_active_batches_per_key,
                                   salt_by_key=config.cache_salt_by_key)
        batches = BatchAPI(config.storage_uri, app_name, {model_id: replica_name(model_id) for model_id in clients},
                           file_limits, batch_limits)
        if config.start_batch_manager:
            batches.start_manager()
        stored = Quota(config.max_stored_responses_per_key, config.max_stored_response_bytes_per_key)
        store = open_store(config.storage_uri)
        conversations = ConversationsAPI(ConversationStore(store))
        keys = ApiKeys(config.api_keys)
        published_keys.keep_published(app_name, keys.digests, config.max_requests_per_key, config.max_waiting_per_key)
        return cls(config, keys, models, BodyParser(models, config.max_request_bytes), batches,
                   ResponsesAPI(ResponseStore(store, stored), batches, config.max_image_bytes, conversations,
                                config.key_bounds_per_replica()[0]),
                   conversations)

    async def generation(self, request: Request, model: type[BaseModel]
                         ) -> tuple[BaseModel, ModelClient, str | None]:
        """A generation route's parsed body, the client of the model it names, and the caller's owner id (the
        engine shares its seats fairly among owners)."""
        owner = self.auth.owner(request)
        body = self.salted(await self.body.parse(request, model), owner)
        return body, self.models.client(body.model), owner

    def salted(self, body: BaseModel, owner: str | None) -> BaseModel:
        """`body`, salted by its API key where the app says so (`cache_salt_by_key`)."""
        return salted_by_owner(body, owner) if self.config.cache_salt_by_key else body
