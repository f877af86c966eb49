"""Regenerate openai_schemas.json from a checkout of github.com/openai/openai-openapi (MIT, see LICENSE here): the
component schemas our response bodies are checked against (tests/deployments/api/test_openapi_shapes.py) and every
schema they reference, with descriptions and examples dropped (they do not constrain a body).

Run: python tests/deployments/api/openapi/extract.py PATH/TO/openai-openapi/openapi.json COMMIT
"""

import json
import sys
from pathlib import Path

ROOTS = ["CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "CreateCompletionResponse",
         "ListModelsResponse", "Model", "OpenAIFile", "ListFilesResponse", "DeleteFileResponse", "Batch",
         "ListBatchesResponse", "Response", "ResponseStreamEvent", "ResponseItemList",
         "ErrorResponse"]
DROPPED = {"description", "example", "examples", "title"}


def referenced(node) -> list[str]:
    if isinstance(node, dict):
        return [name for key, value in node.items()
                for name in ([value.rsplit("/", 1)[1]] if key == "$ref" else referenced(value))]
    if isinstance(node, list):
        return [name for value in node for name in referenced(value)]
    return []


def stripped(node, in_properties: bool = False):
    """The node without documentation keys (a property that happens to be named like one is kept)."""
    if isinstance(node, dict):
        return {key: stripped(value, key == "properties") for key, value in node.items()
                if in_properties or key not in DROPPED and not key.startswith("x-")}
    if isinstance(node, list):
        return [stripped(value) for value in node]
    return node


def main(spec_path: str, commit: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    schemas, keep, pending = spec["components"]["schemas"], {}, list(ROOTS)
    while pending:
        name = pending.pop()
        if name not in keep:
            keep[name] = schemas[name]
            pending.extend(referenced(schemas[name]))
    out = {"source": f"github.com/openai/openai-openapi openapi.json at {commit} (OpenAPI {spec['openapi']}, "
                     f"API {spec['info']['version']})",
           "components": {"schemas": {name: stripped(keep[name]) for name in sorted(keep)}}}
    Path(__file__).with_name("openai_schemas.json").write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
