"""The JSON schema a forced tool call (`tool_choice` "required" or a named function) is decoded under.

A call is `{"name": ..., "arguments": <the tool's parameters>}`. The parameters sit inside the call, so their
own references (`#/$defs/X`, `#/definitions/X`, `#` itself) would resolve against the call's schema and find
nothing; each tool's definitions are hoisted to the call schema's `$defs` under a per-tool name, and its
references rewritten to match, so several tools may use the same definition names.
"""

import json


def tool_call_schema(tools: list[tuple[str, dict | None]]) -> str:
    """The schema of one call to any of `tools` ((name, parameters) pairs), as JSON text."""
    defs: dict = {}
    calls = []
    for i, (name, parameters) in enumerate(tools):
        arguments = _hoist(parameters or {"type": "object"}, f"tool{i}", defs)
        calls.append({"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return json.dumps({**schema, "$defs": defs} if defs else schema)


def _hoist(parameters: dict, prefix: str, defs: dict) -> dict:
    """`parameters` without its definitions, which go to `defs` as `<prefix>.<name>`; references rewritten."""
    own = {**parameters.get("$defs", {}), **parameters.get("definitions", {})}
    root = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}
    uses_root = _refers_to_root(root) or any(_refers_to_root(d) for d in own.values())

    def rewrite(node):
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: rewrite(v) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str):
            for head in ("#/$defs/", "#/definitions/"):
                if ref.startswith(head):
                    name, _, rest = ref[len(head):].partition("/")
                    out["$ref"] = f"#/$defs/{prefix}.{name}" + (f"/{rest}" if rest else "")
            if ref == "#":
                out["$ref"] = f"#/$defs/{prefix}"
        return out

    for name, definition in own.items():
        defs[f"{prefix}.{name}"] = rewrite(definition)
    rewritten = rewrite(root)
    if uses_root:  # a recursive root: reachable by name
        defs[prefix] = rewritten
    return rewritten


def _refers_to_root(node) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == "#" or any(_refers_to_root(v) for v in node.values())
    return isinstance(node, list) and any(_refers_to_root(v) for v in node)
