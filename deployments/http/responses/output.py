"""Response objects and their output items, in the shapes of OpenAI's Responses API."""

from deployments.api.ids import new_id
from deployments.api.responses.protocol import ResponsesRequest
from deployments.api.responses.tools import ToolNames


def response_object(req: ResponsesRequest, response_id: str, created_at: int, model: str, status: str,
                    output: list[dict], usage: dict | None = None, error: dict | None = None) -> dict:
    """The whole response; the request's settings are echoed as OpenAI echoes them. A response cut by
    `max_output_tokens` marks the item it cut `incomplete`, as OpenAI does."""
    if status == "incomplete" and output and output[-1]["type"] in ("message", "reasoning"):
        output = output[:-1] + [{**output[-1], "status": "incomplete"}]
    fmt = req.text.format if req.text and req.text.format else None
    if fmt is not None and fmt.type == "json_schema":
        fmt = {**fmt.model_dump(by_alias=True, exclude_none=True), "schema": fmt.schema_ or {}}
    elif fmt is not None:
        fmt = {"type": fmt.type}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "usage": usage,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "previous_response_id": req.previous_response_id,
        "conversation": {"id": req.conversation_id} if req.conversation_id else None,
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_logprobs": req.top_logprobs,
        "tools": [t.model_dump() for t in req.tools or []],  # strict and parameters: required keys, null if not given
        "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump(),
        "parallel_tool_calls": req.parallel_tool_calls,
        "text": {"format": fmt or {"type": "text"}, "verbosity": req.text.verbosity if req.text else None},
        "reasoning": req.reasoning,
        "truncation": req.truncation,
        "store": req.store,
        "metadata": req.metadata or {},
        "user": req.user,
        "background": req.background,
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def message_item(item_id: str, text: str | None, logprobs: list[dict] | None, status: str = "completed") -> dict:
    content = [] if text is None else [text_part(text, logprobs)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def text_part(text: str, logprobs: list[dict] | None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def function_call_item(item_id: str, call: dict, names: ToolNames, status: str = "completed") -> dict:
    """`call` is a chat tool call: {id, function: {name, arguments}}; named as the client named the function."""
    return {"id": item_id, "type": "function_call", "call_id": call["id"],
            **names.client_fields(call["function"]["name"]), "arguments": call["function"]["arguments"],
            "status": status}


def output_items(message: dict, logprobs: list[dict] | None, names: ToolNames) -> list[dict]:
    """A chat completion's message as output items: its reasoning, its text, then each function call. A
    reply that is only calls has no message item, as OpenAI's."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs_"), message["reasoning_content"]))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(new_id("msg_"), message.get("content") or "", logprobs))
    items += [function_call_item(new_id("fc_"), call, names) for call in calls]
    return items


def response_usage(chat_usage: dict) -> dict:
    details = chat_usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
                                 "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
        "total_tokens": chat_usage["total_tokens"],
    }


def turn_messages(output: list[dict], names: ToolNames) -> list[dict]:
    """The response's output as the assistant turn of a chat conversation (for `previous_response_id`), its calls
    named as the model called them."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {
        "name": names.model_name(item.get("namespace"), item["name"]), "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    message: dict = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return [message]
