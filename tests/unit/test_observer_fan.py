"""CompositeObserver: observers with nothing to watch are left out of a request."""

from __future__ import annotations

from typing import Any

from fleetgate.gateway.proxy.observer import (
    NOOP_ATTEMPT,
    NOOP_REQUEST,
    AttemptResult,
    CompositeObserver,
)


class _Recorder:
    def __init__(self, name: str, log: list[str], watching: bool = True,
                 attempts: bool = True) -> None:
        self.name, self.log, self.watching, self.attempts = name, log, watching, attempts

    def request(self, req: Any) -> Any:
        return self if self.watching else NOOP_REQUEST

    def routed(self, decision: Any) -> None:
        self.log.append(f"{self.name}.routed")

    def attempt(self, endpoint: Any, served_model: str, number: int) -> Any:
        return self if self.attempts else NOOP_ATTEMPT

    def headers(self) -> dict[str, str]:
        return {f"x-{self.name}": "1"}

    def first_token(self, ttft_s: float) -> None:
        self.log.append(f"{self.name}.first_token")

    def finished(self, result: AttemptResult) -> None:
        self.log.append(f"{self.name}.finished")

    def failed(self, status: int, error: str) -> None:
        self.log.append(f"{self.name}.failed")

    def cancelled(self) -> None:
        self.log.append(f"{self.name}.cancelled")

    def end(self, status: int, error: str | None = None) -> None:
        self.log.append(f"{self.name}.end")


def _run(fan: CompositeObserver) -> Any:
    req = fan.request(None)
    req.routed(None)
    attempt = req.attempt(None, "m", 0)
    headers = attempt.headers()
    attempt.first_token(0.1)
    attempt.finished(AttemptResult(200, None, 0.1, 0.2, 1.0))
    req.end(200)
    return req, attempt, headers


def test_every_watching_observer_hears_every_event_in_order() -> None:
    log: list[str] = []
    _, _, headers = _run(CompositeObserver(_Recorder("a", log), _Recorder("b", log)))
    assert headers == {"x-a": "1", "x-b": "1"}
    assert log == ["a.routed", "b.routed", "a.first_token", "b.first_token", "a.finished",
                   "b.finished", "a.end", "b.end"]


def test_a_lone_watcher_gets_the_events_directly() -> None:
    log: list[str] = []
    only = _Recorder("a", log)
    req, attempt, _ = _run(CompositeObserver(only, _Recorder("b", log, watching=False)))
    assert req is only and attempt is only
    assert log == ["a.routed", "a.first_token", "a.finished", "a.end"]


def test_nobody_watching_is_the_noop() -> None:
    log: list[str] = []
    req, attempt, headers = _run(CompositeObserver(_Recorder("a", log, watching=False)))
    assert req is NOOP_REQUEST and attempt is NOOP_ATTEMPT and headers == {} and log == []


def test_an_attempt_only_one_observer_watches_skips_the_fan() -> None:
    log: list[str] = []
    a, b = _Recorder("a", log), _Recorder("b", log, attempts=False)
    _, attempt, headers = _run(CompositeObserver(a, b))
    assert attempt is a and headers == {"x-a": "1"}
    assert log == ["a.routed", "b.routed", "a.first_token", "a.finished", "a.end", "b.end"]
