"""S1's machinery, without a store: chains, the encoding memo, the content cache."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from threadkeep.codec.serde import build_serde
from threadkeep.core.messages import (
    ContentCache,
    EncodingMemo,
    MessageChain,
    chain_ref,
    chain_tail,
    digest_of,
    parse_chain_ref,
)
from threadkeep.errors import CheckpointSerializationError

SERDE = build_serde()


def test_s1_lists_sharing_a_prefix_share_its_links() -> None:
    first = [HumanMessage("a", id="1"), AIMessage("b", id="2")]
    longer = MessageChain("messages", "2", [*first, HumanMessage("c", id="3")], SERDE)
    shorter = MessageChain("messages", "1", first, SERDE)
    assert longer.nodes[:2] == shorter.nodes
    edited = MessageChain("messages", "3", [HumanMessage("a!", id="1"), *first[1:]], SERDE)
    assert edited.nodes[0] != shorter.nodes[0]
    assert edited.digests[1] == shorter.digests[1]  # the same message is stored once
    assert parse_chain_ref(chain_ref(longer)) == (longer.tail, 3)


# The memo checks a list a block of messages at a time where it can, else one by one: each
# memo test runs with blocks of one message, of two, and of the default size.
BLOCKS = pytest.mark.parametrize("block", [1, 2, 32])


@BLOCKS
def test_s1_memo_reuses_digests_of_unchanged_objects_only(block: int) -> None:
    memo = EncodingMemo(block=block)
    messages = [HumanMessage("hello", id="1"), AIMessage("hi", id="2", additional_kwargs={"k": [1]})]
    first = MessageChain("messages", "1", messages, SERDE, memo=memo, memo_key=("t", "", "messages"))
    assert len(first.encoded()) == 2
    again = MessageChain("messages", "2", messages, SERDE, memo=memo, memo_key=("t", "", "messages"))
    assert again.encoded() == []  # nothing encoded again
    assert again.digests == first.digests

    messages[0].content = "hello, edited"  # mutated in place
    messages[1].additional_kwargs["k"] = (1,)  # a tuple where a list was: same JSON, other type
    edited = MessageChain("messages", "3", messages, SERDE, memo=memo, memo_key=("t", "", "messages"))
    assert [position for position, _ in edited.encoded()] == [0, 1]
    assert edited.digests[0] != first.digests[0]
    assert edited.digests[1] != first.digests[1]


@BLOCKS
def test_s1_memo_gives_the_links_and_digests_a_fresh_encoding_gives(block: int) -> None:
    """Whatever happens to the list between puts (appends, an edit in place in the middle,
    a removal, a message swapped for an equal one), the memo's shortcuts change nothing."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    messages = [
        HumanMessage("q", id="1"),
        AIMessage("a", id="2", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c", "type": "tool_call"}]),
        HumanMessage("r", id="3"),
    ]

    def check(version: str) -> None:
        memoized = MessageChain("messages", version, messages, SERDE, memo=memo, memo_key=key)
        fresh = MessageChain("messages", version, messages, SERDE)
        assert (memoized.nodes, memoized.digests) == (fresh.nodes, fresh.digests)

    check("1")
    messages.append(AIMessage("b", id="4"))
    check("2")
    messages[1].tool_calls[0]["args"]["x"] = 2  # deep in place, in the middle
    check("3")
    messages[1].tool_calls[0]["args"]["x"] = 2.0  # the same JSON number, another type
    check("4")
    del messages[0]
    check("5")
    messages[0] = AIMessage.model_validate(messages[0].model_dump())  # an equal, new object
    check("6")
    messages[1].name = messages[1].name  # no value changes, but "name" is now marked set
    check("7")
    messages[0].additional_kwargs["n"] = 1  # in place, in a container
    check("8")
    messages[0].additional_kwargs["n"] = True  # the same JSON number's equal, another type
    check("9")
    messages[2].__pydantic_extra__["note"] = "x"  # type: ignore[index]  # an extra field, in place
    check("10")
    messages[1].content = str(messages[1].content)  # an equal string, maybe the same object
    check("11")


@BLOCKS
def test_s1_memo_encodes_only_new_messages_when_a_window_slides(block: int) -> None:
    """A list that drops its oldest message at every put (a sliding window) shifts every
    message: none is encoded again, and the links are what a fresh encoding gives."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    messages: list[Any] = [HumanMessage(f"m{i}", id=str(i)) for i in range(7)]
    MessageChain("messages", "0", messages, SERDE, memo=memo, memo_key=key)
    for step in range(1, 5):
        messages = [*messages[1:], AIMessage(f"new {step}", id=f"n{step}")]
        chain = MessageChain("messages", str(step), messages, SERDE, memo=memo, memo_key=key)
        assert [position for position, _ in chain.encoded()] == [len(messages) - 1]
        fresh = MessageChain("messages", str(step), messages, SERDE)
        assert (chain.nodes, chain.digests) == (fresh.nodes, fresh.digests)


@BLOCKS
def test_s1_memo_never_keeps_a_digest_for_a_message_edited_while_it_was_encoded(block: int) -> None:
    """A node may edit a message in place while a put (run in the background, LangGraph's
    async durability) encodes it: the digest is of what was encoded, so the next put must
    not take it for the message as it is now."""

    class EditingSerde:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            encoded = SERDE.dumps_typed(obj)
            obj.additional_kwargs["edited"] = True  # after encoding, before the put ends
            return encoded

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return SERDE.loads_typed(data)

    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    messages = [HumanMessage("q", id="1"), HumanMessage("r", id="2")]
    MessageChain("messages", "1", messages, EditingSerde(), memo=memo, memo_key=key)
    memoized = MessageChain("messages", "2", messages, SERDE, memo=memo, memo_key=key)
    assert memoized.digests == MessageChain("messages", "2", messages, SERDE).digests


def test_s1_memo_is_per_list_and_bounded() -> None:
    memo = EncodingMemo(lists=2)
    message = HumanMessage("x", id="1")
    for thread in ("a", "b", "c"):
        MessageChain("messages", "1", [message], SERDE, memo=memo, memo_key=(thread, "", "messages"))
    assert memo.previous(("a", "", "messages")).digests == {}
    assert id(message) in memo.previous(("c", "", "messages")).digests


def test_s1_content_cache_returns_lists_only_when_it_holds_every_payload() -> None:
    cache = ContentCache(max_lists=4, max_bytes=10_000)
    chain = MessageChain("messages", "1", [HumanMessage("a" * 100, id="1"), AIMessage("b", id="2")], SERDE)
    cache.keep_chain(chain)
    assert cache.messages(chain.tail) == [chain.payload(0), chain.payload(1)]
    assert cache.messages(b"\0" * 16) is None


def test_s1_content_cache_is_bounded_in_bytes() -> None:
    cache = ContentCache(max_lists=100, max_bytes=4_000)  # payloads over 500 bytes are never kept
    chains = [MessageChain("m", str(i), [HumanMessage("x" * 300, id=str(i))], SERDE) for i in range(20)]
    for chain in chains:
        cache.keep_chain(chain)
    assert cache.messages(chains[0].tail) is None  # its payload was dropped
    assert cache.messages(chains[-1].tail) is not None
    too_big = MessageChain("m", "big", [HumanMessage("y" * 600, id="big")], SERDE)
    cache.keep_chain(too_big)
    assert cache.messages(too_big.tail) is None


@BLOCKS
def test_s1_memo_never_keeps_a_digest_for_an_edit_made_during_the_put_and_undone_after(block: int) -> None:
    """A node edits a message while the put encodes another one (or that one), and undoes
    the edit after the put: what the put remembers must not pass for the message as it is
    again, since the digest stored is of the edited message."""
    messages = [HumanMessage("a", id="1"), HumanMessage("b", id="2")]

    class EditingSerde:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            messages[1].additional_kwargs["tmp"] = 1  # a node edits message 1 meanwhile
            return SERDE.dumps_typed(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return SERDE.loads_typed(data)

    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    MessageChain("messages", "1", messages, EditingSerde(), memo=memo, memo_key=key)
    del messages[1].additional_kwargs["tmp"]  # undone, after the put
    memoized = MessageChain("messages", "2", messages, SERDE, memo=memo, memo_key=key)
    assert memoized.digests == MessageChain("messages", "2", messages, SERDE).digests


def test_s1_memo_block_keeps_each_field_value_with_its_message() -> None:
    """A block's field values are checked as one run: a value that moves from the end of
    one message to the start of the next (the same object, as a node may arrange by hand)
    must not pass."""
    status = "success"
    messages: list[Any] = [
        ToolMessage("a", tool_call_id="c1", id="1", status=status),
        HumanMessage(status, id="2"),
    ]
    memo = EncodingMemo(block=2)
    key = ("t", "", "messages")
    MessageChain("messages", "1", messages, SERDE, memo=memo, memo_key=key)
    del messages[0].__dict__["status"]
    messages[1].__dict__ = {"extra_first": status, **messages[1].__dict__}
    memoized = MessageChain("messages", "2", messages, SERDE, memo=memo, memo_key=key)
    fresh = MessageChain("messages", "2", messages, SERDE)
    assert memoized.digests == fresh.digests


@BLOCKS
@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b"x", bytearray(b"x")),  # marshal renders both as the same bytes
        (bytearray(b"x"), b"x"),
        ({1, 9}, None),  # the same set, its elements in another order (1 and 9 share a slot)
    ],
    ids=["bytes-to-bytearray", "bytearray-to-bytes", "set-reordered"],
)
def test_s1_memo_never_keeps_a_digest_marshal_cannot_tell_from_an_edit(
    block: int, before: Any, after: Any
) -> None:
    """``marshal`` renders a ``bytearray`` as the equal ``bytes`` would, and a set's elements
    sorted, where the codec keeps both the type and the order: a message holding either is
    encoded on every put, so an edit only ``marshal`` cannot see still reaches the store."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    messages = [HumanMessage("q", id="1"), AIMessage("a", id="2", additional_kwargs={"v": before})]

    def check(version: str) -> None:
        memoized = MessageChain("messages", version, messages, SERDE, memo=memo, memo_key=key)
        fresh = MessageChain("messages", version, messages, SERDE)
        assert (memoized.nodes, memoized.digests) == (fresh.nodes, fresh.digests)

    check("1")
    check("2")
    value = messages[1].additional_kwargs["v"]
    if after is None:  # rebuild the set in place: the element inserted first takes the slot
        order = list(value)
        value.clear()
        value.update(reversed(order))
        assert list(value) == order[::-1]
    else:
        messages[1].additional_kwargs["v"] = after
    check("3")


def test_a_walked_list_from_buffers_is_kept_as_bytes_in_list_order() -> None:
    """A pool an application configured may load ``bytea`` as buffers, not bytes: a walked
    list is then placed by depth all the same, and what the content cache keeps (and a
    later put looks its digests up by) is bytes."""
    from threadkeep.backends.sql.programs import _walked_list

    stored = [SERDE.dumps_typed(HumanMessage(text, id=text)) for text in ("a", "b", "c")]
    digests = [bytes([i]) * 16 for i in range(3)]
    # (depth, digest, type, payload), the last message first as a walk may return them
    rows = [(2 - i, memoryview(digests[i]), stored[i][0], memoryview(stored[i][1])) for i in (2, 0, 1)]
    content = ContentCache()
    tail = chain_tail(digests)  # a walk's digests must lead to its tail
    assert tail is not None
    assert _walked_list(content, "thread", tail, 3, rows) == stored
    assert content.messages(tail) == stored
    assert all(type(payload) is bytes for _, payload in content.messages(tail) or [])
    assert content.payload(digests[1]) == stored[1]


# A run loads its thread, then puts the messages it read back (new objects) with its new
# ones: the memo remembers a list a read decoded (EncodingMemo.seed), so that put encodes
# only what is new, and finds any edit made to the decoded messages meanwhile.


def _read_back(memo: EncodingMemo, key: tuple[str, ...], stored: MessageChain) -> list[Any]:
    """The messages of ``stored``, decoded, as a store's read gives them to the memo."""
    forms = [stored.payload(position) for position in range(len(stored.digests))]
    decoded = [SERDE.loads_typed(form) for form in forms]
    memo.seed(key, stored.tail, decoded, stored.digests, forms)
    return decoded


def _put_and_read_back(memo: EncodingMemo, key: tuple[str, ...], messages: list[Any]) -> list[Any]:
    """Put ``messages``, then read them back."""
    return _read_back(memo, key, MessageChain("messages", "1", messages, SERDE, memo=memo, memo_key=key))


def _conversation(count: int) -> list[Any]:
    call = {"name": "lookup", "args": {"query": "q"}, "id": "c", "type": "tool_call"}
    return [
        AIMessage(f"a{i}", id=str(i), tool_calls=[dict(call, id=f"c{i}")], additional_kwargs={"k": [i]})
        if i % 2
        else HumanMessage(f"h{i}", id=str(i))
        for i in range(count)
    ]


@BLOCKS
def test_s1_memo_encodes_only_new_messages_after_a_read_of_the_list_it_put(block: int) -> None:
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    decoded = _put_and_read_back(memo, key, _conversation(2 * block + 3))
    resumed = [*decoded, HumanMessage("new", id="new")]
    chain = MessageChain("messages", "2", resumed, SERDE, memo=memo, memo_key=key)
    assert [position for position, _ in chain.encoded()] == [len(decoded)]
    fresh = MessageChain("messages", "2", resumed, SERDE)
    assert (chain.nodes, chain.digests) == (fresh.nodes, fresh.digests)


@BLOCKS
def test_s1_memo_finds_edits_made_to_messages_a_read_decoded(block: int) -> None:
    """Edits a node makes in place to the state it loaded, in a whole block or in the last,
    partial one: each edited message is encoded again and stored as edited."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    decoded = _put_and_read_back(memo, key, _conversation(2 * block + 3))
    decoded[1].additional_kwargs["k"].append("seen")  # deep in place, in the first block
    decoded[2].content = "edited"  # a field given a new value
    decoded[-2].tool_calls[0]["args"]["query"] = "changed"  # in place, in the last block
    chain = MessageChain("messages", "2", decoded, SERDE, memo=memo, memo_key=key)
    fresh = MessageChain("messages", "2", decoded, SERDE)
    assert (chain.nodes, chain.digests) == (fresh.nodes, fresh.digests)
    assert {1, 2, len(decoded) - 2} <= {position for position, _ in chain.encoded()}


def test_s1_memo_remembers_a_read_only_of_a_list_it_put() -> None:
    """A process that only reads a thread (nothing put of the list, or another list) keeps
    nothing of what it decoded."""
    key = ("t", "", "messages")
    stored = MessageChain("messages", "1", _conversation(5), SERDE)
    never_put = EncodingMemo()
    decoded = _read_back(never_put, key, stored)
    assert never_put.previous(key, decoded[0]).digests == {}
    other = EncodingMemo()
    MessageChain("messages", "1", [HumanMessage("other", id="o")], SERDE, memo=other, memo_key=key)
    decoded = _read_back(other, key, stored)
    assert not any(id(message) in other.previous(key, decoded[0]).digests for message in decoded)


@BLOCKS
@pytest.mark.parametrize("read", [3, 9], ids=["older-state", "longer-list"])
def test_s1_memo_remembers_a_read_of_an_older_or_a_longer_list(block: int, read: int) -> None:
    """A read of an older state (time travel: a prefix of the list put) or of a longer one
    (another process added to it): the next put encodes only its new message, with the
    links a fresh encoding gives."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    everything = _conversation(9)
    MessageChain("messages", "1", everything[:6], SERDE, memo=memo, memo_key=key)
    decoded = _read_back(memo, key, MessageChain("messages", "2", everything[:read], SERDE))
    resumed = [*decoded, HumanMessage("new", id="new")]
    chain = MessageChain("messages", "3", resumed, SERDE, memo=memo, memo_key=key)
    assert [position for position, _ in chain.encoded()] == [read]
    fresh = MessageChain("messages", "3", resumed, SERDE)
    assert (chain.nodes, chain.digests) == (fresh.nodes, fresh.digests)


@BLOCKS
def test_s1_memo_keeps_a_running_put_s_memory_through_a_read_of_its_list(block: int) -> None:
    """A read made while a run goes on (a UI polling the state) does not cost the run's
    next put its memo: the run puts its own objects, not the read's."""
    memo = EncodingMemo(block=block)
    key = ("t", "", "messages")
    running = _conversation(2 * block + 3)
    MessageChain("messages", "1", running, SERDE, memo=memo, memo_key=key)
    _put_and_read_back(EncodingMemo(), key, running)  # (another memo: only the read below counts)
    _read_back(memo, key, MessageChain("messages", "1", running, SERDE))
    running.append(HumanMessage("new", id="new"))
    chain = MessageChain("messages", "2", running, SERDE, memo=memo, memo_key=key)
    assert [position for position, _ in chain.encoded()] == [len(running) - 1]


@BLOCKS
def test_s1_memo_sends_what_a_read_answered_in_the_form_it_is_stored_in(block: int) -> None:
    """A message stored in another form than this codec now writes (compressed, or by an
    older version) keeps its digest; a put that sends it again (the store lacks it) sends
    that form, so every digest a put writes is of the bytes it writes with it."""
    key = ("t", "", "messages")
    messages = _conversation(2 * block + 3)
    compressed = build_serde(compress_threshold=0)  # every value stored compressed
    stored = MessageChain("messages", "1", messages, compressed)
    assert stored.digests != MessageChain("messages", "1", messages, SERDE).digests
    memo = EncodingMemo(block=block)
    MessageChain("messages", "1", messages[:1], compressed, memo=memo, memo_key=key)  # a shorter put
    decoded = _read_back(memo, key, stored)
    chain = MessageChain(
        "messages", "2", [*decoded, HumanMessage("new", id="new")], SERDE, memo=memo, memo_key=key
    )
    assert chain.digests[:-1] == stored.digests
    assert all(digest_of(*chain.payload(at)) == chain.digests[at] for at in range(len(chain.digests)))


def test_s1_memo_remembers_nothing_of_a_read_whose_digests_are_not_its_list_s() -> None:
    memo = EncodingMemo()
    key = ("t", "", "messages")
    messages = _conversation(5)
    put = MessageChain("messages", "1", messages, SERDE, memo=memo, memo_key=key)
    other = MessageChain("messages", "1", _conversation(6), SERDE)
    decoded = [SERDE.loads_typed(put.payload(position)) for position in range(5)]
    memo.seed(key, other.tail, decoded, put.digests, [put.payload(at) for at in range(5)])
    assert memo.previous(key, decoded[0]) is memo.previous(key)  # the put's: the read was not kept
    assert id(decoded[0]) not in memo.previous(key, decoded[0]).digests


def test_a_walked_list_whose_digests_do_not_lead_to_its_tail_is_refused_and_not_kept() -> None:
    """A walk's rows place each message by its depth: rows whose digests are the list's but
    out of order (a damaged page), or name another message, are refused before the list
    is read or kept in the content cache."""
    from threadkeep.backends.sql.programs import _walked_list

    stored = [SERDE.dumps_typed(HumanMessage(text, id=text)) for text in ("a", "b", "c")]
    digests = [digest_of(kind, payload) for kind, payload in stored]
    tail = chain_tail(digests)
    assert tail is not None
    swapped = [(2, digests[1], *stored[1]), (1, digests[0], *stored[0]), (0, digests[2], *stored[2])]
    another = [(2, digests[0], *stored[0]), (1, digests[1], *stored[1]), (0, digests[0], *stored[0])]
    for rows in (swapped, another):
        content = ContentCache()
        with pytest.raises(CheckpointSerializationError, match="do not lead to the list's tail"):
            _walked_list(content, "thread", tail, 3, rows)
        assert content.messages(tail) is None
    rows = [(2 - at, digests[at], *stored[at]) for at in range(3)]
    assert _walked_list(ContentCache(), "thread", tail, 3, rows) == stored
