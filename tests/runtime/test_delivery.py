"""DeliverySchedule: a request's first and last deltas go at once, the ones between are held and merged: for an
interval, or to the end when the request is not streamed."""

from runtime.engine.delivery import DeliverySchedule
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
