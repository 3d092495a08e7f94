"""Admission's drain rate is the fleet's, not this request's: Little's law over the requests
in flight, sized by the workload's typical answer (``state/admission.drain_and_budget``)."""

from __future__ import annotations

import numpy as np
import pytest
from routing_fixtures import make_fleet, pipeline, request

from fleetgate.state.admission import drain_and_budget, full, room


def test_a_long_answer_sees_the_same_drain_as_a_short_one() -> None:
    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 1500, "tpot_ms": 80})
    for k in range(50):  # the workload: answers of 250 tokens
        i = k % len(live.endpoints)
        s = live.on_dispatch(i, 0.1, 0.1, 500)
        live.on_finish(i, 0.1, 250, 5.0, 0.02, s)
    short = pipe.route(request(max_tokens=20), live.snapshot(1.0))
    long = pipe.route(request(max_tokens=2000), live.snapshot(1.0))
    drain_short, _ = drain_and_budget(short)
    drain_long, _ = drain_and_budget(long)
    assert drain_long > 0
    # (their SLO capacities differ only by what KV memory holds at each one's full length)
    assert drain_long == pytest.approx(drain_short, rel=0.15)
    # and it is capacity over the typical request's e2e, not over this one's
    est, alive = long.estimates, long.alive
    assert est is not None and alive is not None
    own = float(np.sum(np.where(alive, est["slo_capacity"] / est["e2e_s"], 0.0)))
    assert drain_long > 4 * own


def test_before_any_answer_the_request_own_length_sizes_it() -> None:
    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 1500, "tpot_ms": 80})
    d = pipe.route(request(max_tokens=500), live.snapshot(1.0))
    est, alive = d.estimates, d.alive
    assert est is not None and alive is not None
    own = float(np.sum(np.where(alive, est["slo_capacity"] / est["e2e_s"], 0.0)))
    assert drain_and_budget(d)[0] == pytest.approx(own)


def test_full_is_room_zero_from_empty_to_past_every_limit() -> None:
    """``full`` (asked on every arrival) answers what ``room(...) == 0`` does, cheaply."""
    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 1500, "tpot_ms": 80})
    seen = set()
    for k in range(400):  # fill every endpoint past its learned limit, one at a time
        d = pipe.route(request(), live.snapshot(1.0))
        assert full(d) == (room(d) == 0)
        seen.add(full(d))
        live.on_dispatch(k % len(live.endpoints), 1.0, 0.1, 500)
    assert seen == {True, False}
    assert not full(pipeline("cost").route(request(), live.snapshot(1.0)))  # no SLO: never
