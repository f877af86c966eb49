"""The batch manager's line coalescing on its own (deployments/batch/line_groups.py): lines started in one turn
of the event loop share one call, at most MAX_LINES each, and each line gets its own answer as soon as the replica
streams it, or the call's error."""

import asyncio

import pytest

from deployments.batch.line_groups import MAX_LINES, LineGroups


class Replica:
    """Answers each line with (200, {"echo": its request id}), recording each call's lines; or raises."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[list[str]] = []
        self.fail = fail

    async def answer(self, lines):
        self.calls.append([request_id for _, request_id in lines])
        await asyncio.sleep(0)
        if self.fail:
            raise self.fail
        yield [(i, 200, {"echo": request_id}) for i, (_, request_id) in enumerate(lines)]


def test_lines_started_together_share_calls_of_at_most_max_lines():
    async def run():
        replica = Replica()
        groups = LineGroups(replica.answer)
        count = 2 * MAX_LINES + 3
        answers = await asyncio.gather(*(groups.send({"n": i}, f"r{i}") for i in range(count)))
        later = await groups.send({}, "late")  # alone in its turn: a call of its own
        return replica.calls, answers, later

    calls, answers, later = asyncio.run(run())
    assert [len(c) for c in calls] == [MAX_LINES, MAX_LINES, 3, 1]
    assert sum(calls, []) == [f"r{i}" for i in range(2 * MAX_LINES + 3)] + ["late"]
    assert answers == [(200, {"echo": f"r{i}"}) for i in range(2 * MAX_LINES + 3)]
    assert later == (200, {"echo": "late"})


def test_a_failed_call_fails_each_of_its_lines_and_no_other():
    async def run():
        failing = LineGroups(Replica(fail=ConnectionError("replica lost")).answer)
        fine = LineGroups(Replica().answer)
        lost = await asyncio.gather(*(failing.send({}, f"r{i}") for i in range(3)), return_exceptions=True)
        return lost, await fine.send({}, "x")

    lost, answered = asyncio.run(run())
    assert [type(e) for e in lost] == [ConnectionError] * 3
    assert answered == (200, {"echo": "x"})


@pytest.mark.parametrize("cancelled", [0, 1])
def test_a_line_cancelled_while_its_group_runs_leaves_the_others_answered(cancelled):
    async def run():
        groups = LineGroups(Replica().answer)
        tasks = [asyncio.ensure_future(groups.send({}, f"r{i}")) for i in range(2)]
        await asyncio.sleep(0)
        tasks[cancelled].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    assert isinstance(results[cancelled], asyncio.CancelledError)
    assert results[1 - cancelled] == (200, {"echo": f"r{1 - cancelled}"})


def test_each_line_is_answered_when_the_replica_streams_it_and_unanswered_lines_fail():
    async def run():
        second = asyncio.Event()

        async def answer(lines):  # the second line first, the first once asked, the third never
            yield [(1, 200, {"echo": lines[1][1]})]
            await second.wait()
            yield [(0, 200, {"echo": lines[0][1]})]

        groups = LineGroups(answer)
        sent = [groups.send({}, f"r{i}") for i in range(3)]
        answered = await sent[1]
        early = [f.done() for f in sent]
        second.set()
        rest = await asyncio.gather(sent[0], sent[2], return_exceptions=True)
        return answered, early, rest

    answered, early, (first, third) = asyncio.run(run())
    assert answered == (200, {"echo": "r1"}) and early == [False, True, False]
    assert first == (200, {"echo": "r0"})
    assert isinstance(third, RuntimeError) and "without answering every line" in str(third)
