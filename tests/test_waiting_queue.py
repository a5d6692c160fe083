"""The engine's waiting queue (simulator/core/queue.py) against a plain model of it: per-client
lanes and one global order, where `push` goes to the back and `push_front` to the front."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator.core.queue as queue_module
from simulator.core.queue import WaitingQueue

CLIENT_OF = [r % 3 for r in range(40)]
# (operation, request, how deep in its lane a removal reaches)
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["push", "push_front", "remove"]), st.integers(0, 39), st.integers(0, 3)
    ),  # fmt: skip
    max_size=300,
)


def check_against_the_model(operations: list[tuple[str, int, int]]) -> None:
    queue, order = WaitingQueue(CLIENT_OF), []  # the model: the global order as a list
    for op, req, depth in operations:
        if op in ("push", "push_front") and req not in order:
            (queue.push if op == "push" else queue.push_front)(req)
            order = [*order, req] if op == "push" else [req, *order]
        elif op == "remove" and order:
            lane = [r for r in order if CLIENT_OF[r] == CLIENT_OF[req]]
            if lane:  # a later request of the lane when the lane is deep enough (FairServe)
                taken = lane[min(depth, len(lane) - 1)]
                assert queue.head(CLIENT_OF[taken]) == lane[0]
                queue.remove(taken)
                order.remove(taken)
        assert queue.in_order() == order
        assert queue.in_order(5) == order[:5]
        assert queue.oldest() == (order[0] if order else None)
        assert len(queue) == len(order)
        lanes = {c: [r for r in order if CLIENT_OF[r] == c] for c in range(3)}
        for c, lane in lanes.items():
            assert queue.head(c) == (lane[0] if lane else None)
            assert queue.has_waiting(c) == bool(lane)
        assert queue.waiting_clients() == [c for c, lane in lanes.items() if lane]
        assert queue.earliest_head([0, 2]) == next(
            (r for r in order if CLIENT_OF[r] in (0, 2)), None
        )


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_the_queue_order_is_the_model_s_after_any_sequence_of_operations(operations):
    check_against_the_model(operations)


@settings(max_examples=100, deadline=None)
@given(OPERATIONS)
def test_rebuilding_the_order_without_its_holes_changes_nothing(operations):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(queue_module, "MAX_HOLES", 2)  # rebuild after every few removals
        check_against_the_model(operations)


def test_taking_out_a_request_that_is_not_waiting_is_an_error():
    queue = WaitingQueue(CLIENT_OF)
    queue.push(1)
    queue.remove(1)
    with pytest.raises(ValueError, match="request 1 is not waiting"):
        queue.remove(1)
    with pytest.raises(ValueError, match="request 4 is not waiting"):
        queue.remove(4)
