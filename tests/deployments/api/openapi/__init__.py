"""OpenAI's published OpenAPI schemas (the subset in openai_schemas.json, see extract.py) as a validator of our
response bodies."""

import json
from functools import cache
from pathlib import Path

import jsonschema


def _honouring_nullable(check):
    """The spec says OpenAPI 3.1 (JSON Schema 2020-12) but still marks some fields with 3.0's `nullable: true`
    (a stream chunk's finish_reason and logprobs, which its own examples send as null): null passes there."""
    def checked(validator, value, instance, schema):
        if instance is None and schema.get("nullable"):
            return
        yield from check(validator, value, instance, schema)
    return checked


_BASE = jsonschema.Draft202012Validator
_Validator = jsonschema.validators.extend(_BASE, {keyword: _honouring_nullable(_BASE.VALIDATORS[keyword])
                                                  for keyword in ("type", "enum")})


@cache
def _document() -> dict:
    return json.loads(Path(__file__).with_name("openai_schemas.json").read_text())


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """An anyOf/oneOf failure as the failures inside the one branch the value was meant for (the branch whose
    type and `type` discriminator it has), so a null deep in an object or an event is reported where it is; the
    error itself when no single branch is meant."""
    branches: dict = {}
    for sub in error.context or []:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    depth = len(error.absolute_path)

    def meant(subs) -> bool:
        return not any(s.validator == "type" and len(s.absolute_path) == depth
                       or list(s.absolute_path)[depth:] == ["type"] for s in subs)

    candidates = [subs for subs in branches.values() if meant(subs)]
    if len(candidates) != 1:
        return [error]
    return [leaf for sub in candidates[0] for leaf in _leaves(sub)]


def violations(body: dict, schema: str) -> list[tuple[str, str, object]]:
    """Where `body` breaks OpenAI's component schema `schema`, as (path, message, value at the path); empty when
    it conforms. References resolve within the subset document."""
    validator = _Validator({**_document(), "$ref": f"#/components/schemas/{schema}"})
    return [("/".join(map(str, leaf.absolute_path)), leaf.message[:300], leaf.instance)
            for error in validator.iter_errors(body) for leaf in _leaves(error)]
