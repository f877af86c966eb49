"""OpenAI's Conversations API through the `openai` SDK: a conversation created with items, read, changed, its
items listed, added, read and deleted, then deleted; a Responses turn that names it runs on its items (the same
tokens as the chat of the same messages) and adds its own; errors in OpenAI's shape; turns added at once from two
replicas all kept."""

import openai
import pytest

from tests.conftest import MODEL_ID


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_a_conversation_and_its_items(client):
    conversation = client.conversations.create(items=[_user("My name is Ada.")], metadata={"topic": "names"})
    assert conversation.object == "conversation" and conversation.id.startswith("conv_")
    assert conversation.metadata == {"topic": "names"} and conversation.created_at > 0
    assert client.conversations.retrieve(conversation.id) == conversation
    assert client.conversations.update(conversation.id, metadata={"topic": "people"}).metadata == {"topic": "people"}
    [first] = client.conversations.items.list(conversation.id).data
    assert (first.type, first.role, first.content[0].type, first.content[0].text) == (
        "message", "user", "input_text", "My name is Ada.")
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "assistant", "content": "Hello Ada."}, _user("Hi")])
    assert [i.role for i in added.data] == ["assistant", "user"] and added.first_id == added.data[0].id
    ids = [first.id, *(i.id for i in added.data)]
    assert [i.id for i in client.conversations.items.list(conversation.id, order="asc").data] == ids
    newest = client.conversations.items.list(conversation.id, limit=2)
    assert [i.id for i in newest.data] == ids[:0:-1] and newest.has_more
    assert [i.id for i in client.conversations.items.list(conversation.id, after=newest.last_id).data] == ids[:1]
    reply = client.conversations.items.retrieve(ids[1], conversation_id=conversation.id)
    assert (reply.role, reply.content[0].type, reply.content[0].text) == ("assistant", "output_text", "Hello Ada.")
    assert client.conversations.items.delete(ids[2], conversation_id=conversation.id).id == conversation.id
    assert [i.id for i in client.conversations.items.list(conversation.id, order="asc").data] == ids[:2]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(ids[2], conversation_id=conversation.id)
    deleted = client.conversations.delete(conversation.id)
    assert (deleted.id, deleted.deleted) == (conversation.id, True)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_a_response_continues_a_conversation_and_adds_its_turn(client):
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."}]
    conversation = client.conversations.create(items=[{"type": "message", **m} for m in history])
    messages = list(history)
    for question in ("What is my name?", "Say it again."):
        response = client.responses.create(model=MODEL_ID, conversation=conversation.id, input=question,
                                           max_output_tokens=6, temperature=0)
        messages.append({"role": "user", "content": question})
        chat = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=6, temperature=0)
        assert response.output_text == chat.choices[0].message.content
        assert response.conversation.id == conversation.id
        messages.append({"role": "assistant", "content": response.output_text})
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in items] == [(m["role"], m["content"]) for m in messages]
    assert items[-1].id == response.output[0].id  # the output items as the response gave them


def test_bad_requests(client):
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL_ID, input="x", conversation=conversation.id,
                                previous_response_id="resp_" + "0" * 32)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL_ID, input="x", conversation="conv_" + "0" * 32)
    assert missing.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.create(conversation.id, items=[_user(str(i)) for i in range(21)])
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.create(conversation.id, items=[{"type": "shell_call"}])


def test_turns_added_at_once_from_two_replicas_are_all_kept(tmp_path):
    """Each change to a conversation's items is an object of its own: two replicas (two APIs on one storage)
    adding turns at the same time lose none; a conversation stored before the item log (items in its object)
    reads as it was, with the log's changes after."""
    import asyncio
    import json

    from deployments.api.conversations.protocol import ConversationCreate, ConversationUpdate
    from deployments.http.conversations.handler import ConversationsAPI
    from deployments.http.conversations.store import ConversationStore
    from deployments.storage import LocalStore

    a, b = (ConversationsAPI(ConversationStore(LocalStore(str(tmp_path)))) for _ in range(2))

    async def main() -> list[str]:
        conversation = await a.create(ConversationCreate(), None)
        await asyncio.gather(*(api.append(conversation["id"], None, [{"id": f"msg_{i}"}])
                               for i, api in enumerate([a, b] * 8)))
        return [i["id"] for i in (await b.store.load(None, conversation["id"]))["items"]]

    assert sorted(asyncio.run(main())) == sorted(f"msg_{i}" for i in range(16))
    legacy = "conv_" + "1" * 32
    (tmp_path / "conversations" / "public" / f"{legacy}.json").write_text(json.dumps({
        "conversation": {"id": legacy, "object": "conversation", "created_at": 1, "metadata": {}},
        "items": [{"id": "msg_old"}]}))
    asyncio.run(a.append(legacy, None, [{"id": "msg_new"}]))
    asyncio.run(b.update(legacy, ConversationUpdate(metadata={"k": "v"}), None))
    assert [i["id"] for i in asyncio.run(b.store.load(None, legacy))["items"]] == ["msg_old", "msg_new"]
