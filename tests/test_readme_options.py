"""README's configuration reference names every option of the app config, a model's config and the engine's, and
no other; where a row's default is a value (in backticks), it is the option's default."""

import dataclasses
import re
from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from deployments.app_config import _DEPLOYMENT_OPTIONS, AppConfig, LLMConfig
from runtime.config import EngineConfig, SharedTierConfig

README = Path(__file__).resolve().parents[1] / "README.md"
NESTED = {"model_loading_config", "experimental_configs", "lora_config", "prefill_config", "encoder_config",
          "placement_group_config"}
ROW = re.compile(r"^\| `([\w.]+)` \| ([^|]+) \|")


def _tables() -> list[dict[str, str]]:
    """The reference section's tables in order: option -> its default cell."""
    section = README.read_text().split("## Configuration reference\n", 1)[1].split("\n## ", 1)[0]
    tables, current = [], None
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            if current is None:
                current = {}
                tables.append(current)
            current[match[1]] = match[2].strip()
        elif not line.startswith("|"):
            current = None
    return tables


def _model_fields(model: type[BaseModel], prefix: str = "", nested: set[str] = frozenset()) -> dict[str, object]:
    """Each option's name and default (PydanticUndefined: required), nested models' options by their dotted names."""
    fields = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = next((a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)
                      and issubclass(a, BaseModel)), None)
        if name in nested and inner is not None:
            fields.update(_model_fields(inner, f"{prefix}{name}."))
        else:
            default = field.default_factory() if field.default_factory is not None else field.default
            fields[f"{prefix}{name}"] = default
    return fields


def _engine_fields() -> dict[str, object]:
    fields = {}
    for config, prefix in ((EngineConfig, ""), (SharedTierConfig, "kv_shared_tier.")):
        for field in dataclasses.fields(config):
            if config is EngineConfig and field.name == "kv_shared_tier":
                continue
            fields[prefix + field.name] = PydanticUndefined if field.default is dataclasses.MISSING else field.default
    return fields


def test_the_reference_names_every_option_and_no_other():
    app, model, engine = _tables()
    assert set(app) == set(_model_fields(AppConfig))
    assert set(model) == set(_model_fields(LLMConfig, nested=NESTED))
    assert set(engine) == set(_engine_fields())
    deployment_row = next(line for line in README.read_text().splitlines() if line.startswith("| `deployment_config`"))
    assert all(f"`{option}`" in deployment_row for option in _DEPLOYMENT_OPTIONS)


def test_the_defaults_written_as_values_are_the_options_defaults():
    checked = 0
    for table, fields in zip(_tables(), (_model_fields(AppConfig), _model_fields(LLMConfig, nested=NESTED),
                                         _engine_fields())):
        for option, cell in table.items():
            default = fields[option]
            if cell == "required":
                assert default is PydanticUndefined, option
            elif cell.startswith("`") and option != "direct_streaming":  # its default follows the environment
                written = yaml.safe_load(cell.split("`")[1])
                assert written == default, (option, written, default)
                checked += 1
    assert checked >= 70
