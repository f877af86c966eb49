"""A Responses request's tools: function tools, namespaces of them (a named group, as Codex CLI sends), and
hosted tools the server cannot run (web search, file search, code interpreter, computer use, image generation,
MCP, shell, custom grammar tools), which are dropped and named in the reply's `x-ignored-fields` header, as
vLLM and SGLang drop them; forcing one through `tool_choice` is a 400.

The model sees every function flat, as chat tools; a function inside a namespace goes by its own name, or by
`<namespace>__<name>` where another tool has that name too. Its calls go back to the client as the client
named it: the bare name, with the namespace in the call's `namespace` field (what Codex routes by).
"""

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from deployments.api.request_model import RequestModel

# the namespace a plain function belongs to, however a client spells it (Codex: absent, "" or "functions")
_DEFAULT_NAMESPACES = (None, "", "functions")


class FunctionTool(RequestModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamespaceTool(RequestModel):
    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    tools: list[FunctionTool] = Field(default_factory=list)


class HostedTool(RequestModel):
    """A tool that runs on OpenAI's side; kept only to be named and echoed as it came."""

    type: str

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


def _tool_kind(tool: Any) -> str:
    kind = tool.get("type") if isinstance(tool, dict) else getattr(tool, "type", None)
    return kind if kind in ("function", "namespace") else "hosted"


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind)]


class NamedFunction(RequestModel):
    type: Literal["function"]
    name: str
    namespace: str | None = None


def forced_hosted_tool(choice: Any) -> str | None:
    """The kind of tool a `tool_choice` forces when it is not a function (web_search, mcp, allowed_tools...)."""
    if isinstance(choice, dict) and choice.get("type") != "function":
        return str(choice.get("type"))[:40]
    return None


class ToolNames:
    """The function tools of a request, by the name the model calls them and by the client's (namespace, name)."""

    def __init__(self, tools: list):
        functions = [(None, t) for t in tools if isinstance(t, FunctionTool)]
        functions += [(None if n.name in _DEFAULT_NAMESPACES else n.name, t)
                      for n in tools if isinstance(n, NamespaceTool) for t in n.tools]
        bare = Counter(t.name for _, t in functions)
        self.functions: list[tuple[str, FunctionTool]] = []  # (the model's name, the tool)
        self._client: dict[str, tuple[str | None, str]] = {}
        self._model: dict[tuple[str | None, str], str] = {}
        for namespace, tool in functions:
            model_name = tool.name if namespace is None or bare[tool.name] == 1 else f"{namespace}__{tool.name}"
            self.functions.append((model_name, tool))
            self._client[model_name] = (namespace, tool.name)
            self._model[(namespace, tool.name)] = model_name

    def model_name(self, namespace: str | None, name: str) -> str:
        """What the model calls the function the client names (a call echoed back, a named tool_choice)."""
        namespace = None if namespace in _DEFAULT_NAMESPACES else namespace
        return self._model.get((namespace, name), name if namespace is None else f"{namespace}__{name}")

    def client_fields(self, model_name: str) -> dict:
        """A call's `name`, and its `namespace` when the function is in one."""
        namespace, name = self._client.get(model_name, (None, model_name))
        return {"name": name} if namespace is None else {"name": name, "namespace": namespace}
