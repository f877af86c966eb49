"""gpt-oss's chat format ("harmony"), rendered by the `openai-harmony` library.

harmony loads the `o200k_base` vocabulary from `$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` (it checks
the file's SHA-256), or downloads it when that variable is unset.
"""

import functools
import json

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

REASONING_EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def uses_harmony(hf_config) -> bool:
    """gpt-oss checkpoints speak harmony."""
    return getattr(hf_config, "model_type", None) == "gpt_oss"


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def stop_token_ids() -> list[int]:
    """`<|return|>` and `<|call|>`: the assistant's turn ends with an answer or a tool call."""
    return sorted(harmony_encoding().stop_tokens_for_assistant_actions())  # harmony's order varies


def render_harmony(messages: list[dict], tools: list[dict] | None = None, reasoning_effort: str | None = None,
                   add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids for an OpenAI chat conversation: `system` and `developer` messages become the developer
    message's instructions, beside the function tools; assistant tool calls go to the commentary channel and
    tool results come back from `functions.<name>`."""
    system = SystemContent.new()
    if reasoning_effort is not None:
        system = system.with_reasoning_effort(REASONING_EFFORTS[reasoning_effort])
    rendered = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools([_tool(t["function"]) for t in tools])
        rendered.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    call_names: dict[str, str] = {}
    for m in messages:
        if m["role"] not in ("system", "developer"):
            rendered += _turn(m, call_names)
    conversation = Conversation.from_messages(rendered)
    if add_generation_prompt:
        return harmony_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)
    return harmony_encoding().render_conversation(conversation)


def _tool(function: dict) -> ToolDescription:
    return ToolDescription.new(function["name"], function.get("description") or "", function.get("parameters"))


def _turn(m: dict, call_names: dict[str, str]) -> list[Message]:
    """One chat message as harmony messages; `call_names` maps tool call ids seen so far to function names."""
    if m["role"] == "user":
        return [Message.from_role_and_content(Role.USER, m["content"])]
    if m["role"] == "tool":
        name = call_names.get(m.get("tool_call_id"), m.get("name"))
        if name is None:
            raise ValueError(f"tool message: tool_call_id {m.get('tool_call_id')!r} names no earlier tool call")
        author = Author.new(Role.TOOL, f"functions.{name}")
        return [Message.from_author_and_content(author, m["content"]).with_channel("commentary")
                .with_recipient("assistant")]
    if m["role"] != "assistant":
        raise ValueError(f"role {m['role']!r}: harmony has system, developer, user, assistant and tool messages")
    calls = m.get("tool_calls") or []
    turn = []
    if m["content"]:  # text before tool calls is a commentary preamble; otherwise the final answer
        turn.append(Message.from_role_and_content(Role.ASSISTANT, m["content"])
                    .with_channel("commentary" if calls else "final"))
    for call in calls:
        function = call["function"]
        call_names[call.get("id")] = function["name"]
        arguments = function["arguments"]
        turn.append(Message.from_role_and_content(Role.ASSISTANT, arguments if isinstance(arguments, str)
                                                  else json.dumps(arguments))
                    .with_channel("commentary").with_recipient(f"functions.{function['name']}")
                    .with_content_type("<|constrain|>json"))
    return turn
