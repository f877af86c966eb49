"""DeliverySchedule: a request's first and last deltas go at once, the ones between are held and merged: for an
interval, or to the end when the request is not streamed."""

from runtime.engine import delivery
from runtime.engine.delivery import FAIR_STREAMS, DeliverySchedule
from runtime.outputs import RequestDelta, SequenceDelta


def delta(request_id: str, token: int, finished: bool = False) -> RequestDelta:
    seq = SequenceDelta(0, [token], f"<{token}>", None, "length" if finished else None, num_output_tokens=token)
    return RequestDelta(request_id, 3, 0, [seq], finished)


def test_first_and_last_at_once_the_middle_merged_into_the_last():
    schedule = DeliverySchedule(interval_s=60)
    assert schedule.due([delta("a", 1), delta("b", 1)]) == [delta("a", 1), delta("b", 1)]
    engines = [delta("a", 2), delta("b", 2)]
    assert schedule.due(engines) == []
    assert schedule.due([delta("a", 3)]) == []
    [last] = schedule.due([delta("a", 4, finished=True), delta("b", 3)])
    assert last.finished and last.request_id == "a"
    assert (last.seqs[0].token_ids, last.seqs[0].text) == ([2, 3, 4], "<2><3><4>")
    assert (last.seqs[0].num_output_tokens, last.seqs[0].finish_reason) == (4, "length")
    assert engines == [delta("a", 2), delta("b", 2)]  # merged into a copy: the engine's deltas are left as they were


def test_a_request_not_streamed_gets_its_first_delta_then_the_rest_as_one():
    schedule = DeliverySchedule(interval_s=1e-9)
    schedule.start("whole", stream=False)
    schedule.start("streamed", stream=True)
    assert schedule.due([delta("whole", 1), delta("streamed", 1)]) == [delta("whole", 1), delta("streamed", 1)]
    assert schedule.due([delta("whole", 2), delta("streamed", 2)]) == [delta("streamed", 2)]
    [last] = schedule.due([delta("whole", 3, finished=True)])
    assert last.finished and (last.seqs[0].token_ids, last.seqs[0].text) == ([2, 3], "<2><3>")
    # the id is free again: a new request with it is streamed unless it says otherwise
    assert schedule.due([delta("whole", 7)]) == [delta("whole", 7)]
    assert schedule.due([delta("whole", 8)]) == [delta("whole", 8)]


def test_an_aborted_request_is_forgotten():
    schedule = DeliverySchedule(interval_s=60)
    schedule.due([delta("a", 1)])
    schedule.due([delta("a", 2)])
    schedule.forget("a")  # its held token goes with it; the id may come again, as a new request
    assert schedule.due([delta("a", 7)]) == [delta("a", 7)]


def test_no_interval_hands_on_every_delta():
    schedule = DeliverySchedule(interval_s=0)
    deltas = [delta("a", i) for i in range(1, 4)]
    assert [schedule.due([d]) for d in deltas] == [[d] for d in deltas]


def test_while_another_owner_has_requests_an_owners_many_streams_share_its_deliveries(monkeypatch):
    """Owner a's 64 streams get FAIR_STREAMS streams' worth of deliveries (each every 64 / 32 intervals) while
    owner b has a request open, and the plain interval again once b's ends; requests with no owner keep it."""
    clock = {"now": 0.0}
    monkeypatch.setattr(delivery.time, "monotonic", lambda: clock["now"])
    schedule = DeliverySchedule(interval_s=0.1)
    streams = [f"a{i}" for i in range(2 * FAIR_STREAMS)]
    for request_id in streams:
        schedule.start(request_id, stream=True, owner="a")
    schedule.start("free", stream=True)

    def step(at: float, token: int, *extra: RequestDelta) -> set[str]:
        clock["now"] = at
        return {d.request_id for d in schedule.due([delta(r, token) for r in [*streams, "free"]] + list(extra))}

    assert step(0.0, 1) == {*streams, "free"}  # first deltas go at once
    assert step(0.15, 2) == {*streams, "free"}  # a alone: the plain interval
    schedule.start("b", stream=False, owner="b")
    assert step(0.3, 3, delta("b", 1)) == {"free", "b"}  # a's streams now every 0.2 s
    assert step(0.34, 4) == set()
    assert step(0.4, 5) == {*streams, "free"}
    assert step(0.45, 6, delta("b", 2, finished=True)) == {"b"}
    assert step(0.51, 7) == {*streams, "free"}  # b's request ended: the plain interval again
