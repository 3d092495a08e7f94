"""The live dashboard in a real browser: headless Chromium against a real ``fleetgate serve``.

One gateway (four emulated pools, AMD and NVIDIA, auth on with an admin key and two tenant
keys) and one logged-in page are shared by the module; a background client sends streamed
and plain requests from both tenants while a test asks for traffic. The page polls the
admin API once a second; every response it gets is kept by poll number (the page sends
``x-dashboard-poll``), so a test compares what the page shows with the exact API answers
it rendered, and, with traffic stopped, with a fresh answer of the API at the same moment.
Nothing here waits a fixed time: every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashpage import Page, api_value, check_number, check_page_against, find, wait

from procs import Proc, spawn_gateway

PUBLIC, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
ADMIN_KEY = "dashboard-admin-key-0123"
KEYS = {"team-a": "dashboard-team-a-key-0123", "team-b": "dashboard-team-b-key-0123"}
POOLS = [("mi300x-sglang", "mi300x", "sglang", 1.99), ("mi355x-vllm", "mi355x", "vllm", 2.90),
         ("h100-vllm", "h100", "vllm", 2.95), ("h200-sglang", "h200", "sglang", 3.60)]
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "src" / "fleetgate" / "gateway" / "dashboard" / "static"


def _config() -> dict[str, Any]:
    return {
        "pools": [{"name": name, "accelerator": gpu, "engine": engine,
                   "price_per_gpu_hour": price, "endpoints": [f"emulated://{engine}/{gpu}?speed=20"],
                   "models": {PUBLIC: SERVED}} for name, gpu, engine, price in POOLS],
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}},
                     "spread": {"strategy": "round_robin"}},
        "default_policy": "cheapest",
        "auth": {"admin_keys": [ADMIN_KEY],
                 "keys": [{"name": t, "key": k, "tenant": t} for t, k in KEYS.items()]},
    }


class Traffic:
    """Four client threads, two per tenant, streamed and plain, cost and round-robin
    policies; they send only while ``on`` is set."""

    def __init__(self, base: str) -> None:
        self.base, self.on, self.stop = base, threading.Event(), threading.Event()
        self.sent, self.busy, self.lock = 0, 0, threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(4)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        key = list(KEYS.values())[i % 2]
        with httpx.Client(base_url=self.base, timeout=30) as client:
            n = 0
            while not self.stop.is_set():
                if not self.on.wait(0.05):
                    continue
                with self.lock:
                    self.busy += 1
                try:
                    self._one(client, key, n, i)
                finally:
                    with self.lock:
                        self.busy -= 1
                        self.sent += 1
                n += 1

    @staticmethod
    def _one(client: httpx.Client, key: str, n: int, i: int) -> None:
        headers = {"authorization": f"Bearer {key}"}
        if (n + i) % 3 == 0:
            headers["x-fleetgate-policy"] = "spread"
        body: dict[str, Any] = {"model": PUBLIC, "max_tokens": 16 + 8 * (n % 3),
                                "messages": [{"role": "user", "content": "GPUs " * 40}]}
        if n % 2 == 0:
            body.update(stream=True, stream_options={"include_usage": True})
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                r.read()
        else:
            client.post("/v1/chat/completions", json=body, headers=headers)

    def quiet(self) -> None:
        """Stop sending and wait for the requests under way to finish."""
        self.on.clear()
        wait(lambda: self.busy == 0, "the client threads to finish their requests")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = spawn_gateway(_config(), tmp_path_factory.mktemp("dash"),
                         env={"FLEETGATE_REQUEST_LOG": "off"})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def traffic(gateway: Proc) -> Iterator[Traffic]:
    t = Traffic(gateway.url)
    yield t
    t.stop.set()
    t.on.clear()
    for thread in t.threads:
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def page(browser: Any, gateway: Proc) -> Iterator[Page]:
    p = Page(browser, gateway.url)
    p.page.goto(f"{gateway.url}/dashboard?interval=1")
    p.page.fill("#key", ADMIN_KEY)
    p.page.click("#login button[type=submit]")
    p.page.wait_for_selector("#pools .card")
    yield p
    p.context.close()


# ---------------------------------------------------------------------------- helpers
# ---------------------------------------------------------------------------- tests

def test_the_page_is_the_gateways_own_and_loads_nothing_from_elsewhere(gateway: Proc) -> None:
    page = httpx.get(gateway.url + "/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in ("dashboard.js", "scaling.js", "dashboard.css"):
        assert httpx.get(f"{gateway.url}/dashboard/{name}").status_code == 200
    assert httpx.get(gateway.url + "/dashboard/evil.js").status_code == 404
    for path in STATIC.iterdir():  # no CDN, no external font, no absolute URL of any kind
        assert not re.search(r"https?://|//cdn|@import", path.read_text()), path.name
    # the shell holds no data; the data is behind the admin key
    assert httpx.get(gateway.url + "/admin/endpoints").status_code == 401
    tenant = {"authorization": f"Bearer {KEYS['team-a']}"}
    assert httpx.get(gateway.url + "/admin/costs", headers=tenant).status_code == 403


def test_the_page_asks_for_an_admin_key_when_auth_is_on(browser: Any, gateway: Proc) -> None:
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(gateway.url + "/dashboard")
        tab.wait_for_selector("#login:not([hidden])")
        assert tab.locator("#pools .card").count() == 0
        tab.fill("#key", KEYS["team-a"])
        tab.click("#login button[type=submit]")
        wait(lambda: "may not use the admin API" in tab.inner_text("#login-error"),
             "the page to refuse a tenant key")
        assert tab.locator("#pools .card").count() == 0
        tab.fill("#key", ADMIN_KEY)
        tab.click("#login button[type=submit]")
        tab.wait_for_selector("#pools .card")
        assert tab.locator("#login").is_hidden()
    finally:
        context.close()


def test_the_page_updates_while_traffic_flows(page: Page, traffic: Traffic) -> None:
    def total_requests() -> int:
        return sum(int(float(v)) for v in page.page.locator(
            '#pools [data-src="costs.pools"][data-k="requests"]').evaluate_all(
            "els => els.map(e => e.dataset.value || '0')"))

    before, first_poll = total_requests(), page.poll()
    traffic.on.set()
    wait(lambda: total_requests() >= before + 20, "the cards to count new requests")
    wait(lambda: page.poll() >= first_poll + 3, "three more polls")
    wait(lambda: page.page.locator("#decisions tbody tr[data-request]").count() >= 10,
         "routing decisions to appear")
    wait(lambda: page.page.locator("#share svg polygon").count() >= 2,
         "the traffic share to show two pools")
    wait(lambda: page.page.locator('#tenants tr[data-row]').count() == 2, "both tenants' costs")
    newest = page.page.get_attribute("#decisions tbody tr[data-request]", "data-request")
    wait(lambda: page.page.get_attribute("#decisions tbody tr[data-request]",
                                         "data-request") != newest, "a newer decision")


def test_the_cards_show_the_pools_with_the_admin_apis_numbers(page: Page,
                                                               traffic: Traffic) -> None:
    traffic.on.set()
    wait(lambda: len([r for r in httpx.get(page.base + "/admin/costs", headers=ADMIN).json()
                      ["pools"] if r["requests"]]) >= 3, "traffic on three pools")
    page.wait_poll(page.poll())
    answers = page.pause()  # under traffic: the page equals the answers it rendered
    cards = page.page.locator("#pools .card").evaluate_all("els => els.map(e => e.dataset.pool)")
    assert cards == [p["pool"] for p in answers["/admin/endpoints"]["pools"]]
    assert sorted(cards) == sorted(name for name, *_ in POOLS)
    assert check_page_against(page, answers) > 100
    for card, (name, gpu, engine, price) in zip(cards, POOLS, strict=True):
        text = page.page.inner_text(f'.card[data-pool="{card}"]')
        assert card == name and gpu.upper() in text and engine in text and f"${price}" in text
        assert ("AMD" if gpu.startswith("mi") else "NVIDIA") in text

    traffic.quiet()  # traffic stopped: the page and a fresh API answer, same moment
    wait(lambda: all(e["in_flight"] == 0 for e in httpx.get(
        page.base + "/admin/endpoints", headers=ADMIN).json()["endpoints"]), "idle endpoints")
    before = page.poll()
    page.resume()
    page.wait_poll(before)
    page.pause()
    fresh = {"/admin/costs": httpx.get(page.base + "/admin/costs", headers=ADMIN).json(),
             "/admin/endpoints": httpx.get(page.base + "/admin/endpoints", headers=ADMIN).json()}
    ledger = [n for n in page.numbers() if n["src"].startswith("costs.")]
    assert len(ledger) > 40
    for n in ledger:
        check_number(n, api_value(fresh, n))
    for n in page.numbers("#pools"):
        if n["k"] in ("price_per_gpu_hour", "usd_per_hour", "in_flight", "queued") \
                and n["src"].startswith("endpoints."):
            check_number(n, api_value(fresh, n))
    page.resume()


def test_opening_a_decision_shows_every_candidate_and_why_it_lost(page: Page,
                                                                  traffic: Traffic) -> None:
    traffic.on.set()
    page.wait_poll(page.poll())
    answers = page.pause()
    traffic.quiet()
    row = page.page.locator("#decisions tbody tr[data-request]").nth(2)
    request_id = row.get_attribute("data-request")
    decision = find(answers["/admin/decisions"]["decisions"], "request_id", request_id or "")
    assert decision is not None
    row.click()
    page.page.wait_for_selector("#decision:not([hidden])")
    candidates = page.page.locator("#decision tr[data-candidate]")
    assert candidates.evaluate_all("els => els.map(e => e.dataset.candidate)") == \
        [c["endpoint"] for c in decision["candidates"]]
    assert len(decision["candidates"]) == len(POOLS)
    whys = candidates.locator("td.why").all_inner_texts()
    assert whys[0] == "chosen" and decision["candidates"][0]["endpoint"] == decision["chosen"]
    assert all(w and w != "chosen" for w in whys[1:])
    detail = page.page.inner_text("#decision")
    assert decision["reason"] in detail and decision["policy"] in detail
    for scorer in decision["candidates"][0]["scores"]:
        assert scorer in detail


def test_screenshot_is_saved_and_shows_the_fleet(page: Page, traffic: Traffic,
                                                 output_dir: Path) -> None:
    traffic.on.set()  # live again, then quiet so the decision list holds still
    page.resume()
    page.wait_poll(page.poll() + 2)
    traffic.quiet()
    page.wait_poll(page.poll())
    page.page.locator("#decisions tbody tr[data-request]").first.click()
    page.page.wait_for_selector("#decision:not([hidden])")
    path = output_dir / "dashboard.png"
    page.page.screenshot(path=str(path), full_page=True)
    from matplotlib.image import imread
    pixels = imread(str(path))[:, :, :3]
    height, width = pixels.shape[:2]
    assert width == 1400 and height > 1000
    assert pixels.std() > 0.05  # not a blank page
    rgb = (pixels * 255).round().astype(int)

    def has(color: tuple[int, int, int]) -> bool:
        return bool((abs(rgb - color).sum(axis=2) <= 12).any())

    assert has((0xED, 0x1C, 0x24)) and has((0x76, 0xB9, 0x00))  # AMD and NVIDIA cards
    assert "no shadow configured" in page.page.inner_text("#shadow") or \
        page.page.locator("#shadow table").count() == 1
    if os.environ.get("FLEETGATE_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copy(path, REPO / "docs" / "dashboard.png")


def test_no_page_error_and_every_request_to_the_gateway(page: Page) -> None:
    # the four admin calls before the key was entered answer 401: the browser logs them
    assert [e for e in page.errors if "status of 401" not in e] == []
    assert page.urls and all(u.startswith(page.base + "/") or u.startswith("data:")
                             for u in page.urls), sorted(set(page.urls))
