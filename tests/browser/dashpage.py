"""What the browser tests share: a logged-in dashboard page that keeps every admin answer
it rendered (by poll number: the page sends ``x-dashboard-poll``), a bounded wait, and the
check of each number on the page (``data-src``/``data-id``/``data-k``/``data-value``)
against the admin API's answer behind it.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse


def wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """The first truthy ``check()`` (polled every 50 ms) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")



class Page:
    """A logged-in dashboard page and what it saw: admin answers by poll, requests, errors."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.polls: dict[int, dict[str, Any]] = defaultdict(dict)
        self.urls: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("response", self._keep)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _keep(self, response: Any) -> None:
        poll = response.request.headers.get("x-dashboard-poll")
        if poll is not None and response.ok:
            self.polls[int(poll)][urlparse(response.url).path] = response.json()

    def poll(self) -> int:
        return int(self.page.get_attribute("body", "data-poll") or 0)

    def wait_poll(self, after: int) -> int:
        return int(wait(lambda: self.poll() > after and self.poll(), f"a poll after {after}"))

    def pause(self) -> dict[str, Any]:
        """Stop polling; the admin answers of the poll now on screen."""
        self.page.click("#pause")
        wait(lambda: self.page.get_attribute("body", "data-busy") == "false", "no poll in flight")
        return self.polls[self.poll()]

    def resume(self) -> None:
        """Poll again, and return once that poll has been rendered (status included)."""
        before = self.poll()
        self.page.click("#pause")
        self.wait_poll(before)  # data-poll and #status are set in the same JS task

    def numbers(self, scope: str = "") -> list[dict[str, str]]:
        return list(self.page.locator(f"{scope} [data-src]").evaluate_all(
            "els => els.map(e => ({src: e.dataset.src, id: e.dataset.id || '', k: e.dataset.k,"
            " fmt: e.dataset.fmt || 'num', value: e.dataset.value, text: e.textContent}))"))



def find(rows: list[dict[str, Any]], key: str, value: str) -> dict[str, Any] | None:
    return next((r for r in rows if r.get(key) == value), None)


def predicted(decisions: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in decisions:
        for c in d["candidates"]:
            if c["pool"] not in out and c["estimates"].get("usd_per_mtok") is not None:
                out[c["pool"]] = c["estimates"]["usd_per_mtok"]
    return out


def api_value(answers: dict[str, Any], n: dict[str, str]) -> Any:
    """The admin API's value behind one number on the page."""
    endpoints, costs = answers["/admin/endpoints"], answers["/admin/costs"]
    src, ident, k = n["src"], n["id"], n["k"]
    if src == "decisions":
        return predicted(answers["/admin/decisions"]["decisions"]).get(ident)
    if src == "derived":  # a sum the page makes (the fleet's totals)
        return None
    if src == "scaling":  # /admin/scaling: a dict of autoscaled pools by name
        row = answers["/admin/scaling"]["pools"].get(ident)
        return None if row is None else row.get(k)
    table = {"endpoints.pools": (endpoints["pools"], "pool"),
             "endpoints.endpoints": (endpoints["endpoints"], "id"),
             "costs.pools": (costs["pools"], "pool"), "costs.tenants": (costs["tenants"], "tenant")}
    rows, key = table[src]
    row = find(rows, key, ident)
    return None if row is None else row.get(k)


def check_number(n: dict[str, str], expected: Any) -> None:
    where = f"{n['src']}[{n['id']}].{n['k']}"
    if expected is None:
        assert n["value"] == "" and n["text"] == "\u2013", f"{where}: page {n}, API None"
        return
    assert float(n["value"]) == float(expected), f"{where}: page {n['value']}, API {expected}"
    scale = {"ms": 1000.0, "pct": 100.0}.get(n["fmt"], 1.0)
    shown = float(re.sub(r"[$,%]| ms", "", n["text"]))
    want = float(expected) * scale
    slack = 0.5 if n["fmt"] == "int" or abs(want) >= 1000 else 5e-4 * abs(want)
    assert abs(shown - want) <= slack + 1e-12, f"{where}: shows {n['text']!r} for {expected}"


def check_page_against(page: Page, answers: dict[str, Any], scope: str = "") -> int:
    checked = 0
    for n in page.numbers(scope):
        if n["src"] == "derived":
            continue
        check_number(n, api_value(answers, n))
        checked += 1
    return checked

