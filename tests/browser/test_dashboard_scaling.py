"""The dashboard's replicas and bill per pool in a real browser: headless Chromium against a
real ``fleetgate serve`` that runs its fleet scaler every second.

The fleet: one autoscaled ``emulated://`` pool (``min_replicas: 0``, one configured
endpoint, two slots, short cold start and scale-down delay) and one fixed pool; auth on,
the page logged in with the admin key. With no traffic the scaler drains the autoscaled
pool to nothing; raising its floor to 1 (``POST /admin/reload``) starts a replica again.
The page follows both, and at every step shows exactly the admin answers it rendered.
Nothing here waits a fixed time: every wait is for a condition, with a deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dashpage import Page, check_page_against, wait

from procs import Proc, spawn_gateway

PUBLIC, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
ADMIN_KEY = "scaling-admin-key-0123"
TENANT_KEY = "scaling-tenant-key-0123"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
AUTO, FIXED = "mi300x-auto", "h100-fixed"
AUTO_PRICE, FIXED_PRICE = 1.99, 2.95
SCALE_WAIT_S = 90.0  # bound on a scaler step seen by the page (1 s ticks, 6 s delay)


def _config(min_replicas: int) -> dict[str, Any]:
    models = {PUBLIC: SERVED}
    return {
        "pools": [
            {"name": AUTO, "accelerator": "mi300x", "engine": "sglang",
             "price_per_gpu_hour": AUTO_PRICE, "models": models,
             "endpoints": ["emulated://sglang/mi300x?speed=20"],
             "autoscale": {"min_replicas": min_replicas, "max_replicas": 2,
                           "cold_start_s": 1, "scale_down_delay_s": 6}},
            {"name": FIXED, "accelerator": "h100", "engine": "vllm",
             "price_per_gpu_hour": FIXED_PRICE, "models": models,
             "endpoints": ["emulated://vllm/h100?speed=20"]},
        ],
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}}},
        "default_policy": "cheapest",
        "auth": {"admin_keys": [ADMIN_KEY],
                 "keys": [{"name": "team", "key": TENANT_KEY, "tenant": "team"}]},
    }


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dash-scaling") / "fleet.yaml"
    path.write_text(yaml.safe_dump(_config(min_replicas=0)))
    return path


@pytest.fixture(scope="module")
def gateway(config_path: Path) -> Iterator[Proc]:
    proc = spawn_gateway(config_path, config_path.parent,
                         env={"FLEETGATE_REQUEST_LOG": "off", "FLEETGATE_SCALE_INTERVAL_S": "1"})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def page(browser: Any, gateway: Proc) -> Iterator[Page]:
    p = Page(browser, gateway.url)
    p.page.goto(f"{gateway.url}/dashboard?interval=1")
    p.page.fill("#key", ADMIN_KEY)
    p.page.click("#login button[type=submit]")
    p.page.wait_for_selector("#scaling tr[data-scaling]")
    yield p
    p.context.close()


# ---------------------------------------------------------------------------- helpers

def shown(page: Page, k: str, pool: str = AUTO) -> float | None:
    """The raw value behind the scaling view's number ``k`` of ``pool`` (None: not shown)."""
    cell = page.page.locator(f'#scaling [data-src="scaling"][data-id="{pool}"][data-k="{k}"]')
    if cell.count() != 1:
        return None
    value = cell.get_attribute("data-value")
    return float(value) if value else None


def fleet_bill(page: Page) -> tuple[float, float]:
    def one(k: str) -> float:
        return float(page.page.get_attribute(f'#scaling [data-k="{k}"]', "data-value") or "nan")
    return one("fleet_usd_per_hour"), one("fleet_usd_per_hour_at_desired")


def expected_bill(answers: dict[str, Any]) -> tuple[float, float]:
    """The fleet's $/hour now and at desired from the admin answers: autoscaled pools at
    the scaler's figures, fixed pools at /admin/endpoints'."""
    scaled = answers["/admin/scaling"]["pools"]
    now = desired = 0.0
    for p in answers["/admin/endpoints"]["pools"]:
        s = scaled.get(p["pool"])
        now += s["usd_per_hour"] if s else p["usd_per_hour"]
        desired += s["usd_per_hour_at_desired"] if s else p["usd_per_hour"]
    return now, desired


def parked_rows(page: Page) -> dict[str, str]:
    """Endpoint id -> its row's text, for the autoscaled pool's parked endpoints."""
    rows = page.page.locator(f'.card[data-pool="{AUTO}"] .ep.parked')
    return dict(zip(rows.evaluate_all("els => els.map(e => e.dataset.endpoint)"),
                    rows.all_inner_texts(), strict=True))


def check_still_page(page: Page) -> dict[str, Any]:
    """Pause; every number on the page equals the admin answers it rendered; resume."""
    answers = page.pause()
    try:
        assert set(answers) >= {"/admin/endpoints", "/admin/scaling"}
        assert check_page_against(page, answers, "#scaling") >= 11
        assert check_page_against(page, answers, "#pools") > 20
        now, desired = fleet_bill(page)
        want_now, want_desired = expected_bill(answers)
        assert now == pytest.approx(want_now) and desired == pytest.approx(want_desired)
    finally:
        page.resume()
    return answers


# ---------------------------------------------------------------------------- tests

def test_the_scaling_view_needs_the_admin_key(gateway: Proc) -> None:
    assert httpx.get(gateway.url + "/admin/scaling").status_code == 401
    tenant = {"authorization": f"Bearer {TENANT_KEY}"}
    assert httpx.get(gateway.url + "/admin/scaling", headers=tenant).status_code == 403
    body = httpx.get(gateway.url + "/admin/scaling", headers=ADMIN).json()
    assert list(body["pools"]) in ([], [AUTO])  # [] until the scaler's first tick


def test_each_pool_shows_its_replicas_and_bill(page: Page) -> None:
    wait(lambda: shown(page, "desired") is not None, "the autoscaled pool's scaling row",
         SCALE_WAIT_S)
    answers = check_still_page(page)
    modes = page.page.locator("#scaling tr[data-scaling]").evaluate_all(
        "els => els.map(e => [e.dataset.scaling, e.dataset.mode || ''])")
    assert modes == [[AUTO, "auto"], [FIXED, "fixed"], ["fleet", ""]]
    auto = page.page.inner_text(f'#scaling tr[data-scaling="{AUTO}"]')
    assert "the gateway starts and stops replicas" in auto
    assert answers["/admin/scaling"]["pools"][AUTO]["reason"] in auto
    fixed = page.page.inner_text(f'#scaling tr[data-scaling="{FIXED}"]')
    assert "fixed" in fixed and f"${FIXED_PRICE}" in fixed
    assert shown(page, "min") == 0 and shown(page, "max") == 2
    # two slots, desired ringed; the card's bill is the scaler's, not every slot's
    assert page.page.locator(f'#scaling tr[data-scaling="{AUTO}"] .slot').count() == 2
    card_bill = page.page.get_attribute(
        f'.card[data-pool="{AUTO}"] .meta [data-k="usd_per_hour"]', "data-src")
    assert card_bill == "scaling"


def test_the_pool_drains_to_nothing_and_its_slots_show_as_off(page: Page) -> None:
    wait(lambda: shown(page, "desired") == 0 and shown(page, "ready") == 0
         and shown(page, "draining") == 0 and shown(page, "usd_per_hour") == 0,
         "the page to show the pool drained to 0 replicas", SCALE_WAIT_S)
    wait(lambda: len(parked_rows(page)) == 2 and all(
        "off" in text for text in parked_rows(page).values()), "both slots off on the card",
         SCALE_WAIT_S)
    answers = check_still_page(page)
    assert answers["/admin/scaling"]["pools"][AUTO]["current"] == 0
    assert fleet_bill(page) == (pytest.approx(FIXED_PRICE), pytest.approx(FIXED_PRICE))
    for endpoint, text in parked_rows(page).items():
        assert "off" in text and "parked by the scaler" in text, endpoint
    # parked is not an error: no red health state on the card's parked rows
    assert page.page.locator(f'.card[data-pool="{AUTO}"] .ep.parked [class^="state-not"]'
                             ).count() == 0
    assert "0 ready · 2 parked" in page.page.inner_text(f'.card[data-pool="{AUTO}"] .stats')
    assert page.page.locator(f'#scaling tr[data-scaling="{AUTO}"] .slot.off').count() == 2


def test_a_higher_floor_starts_a_replica_and_the_bill_follows(page: Page, gateway: Proc,
                                                              config_path: Path,
                                                              output_dir: Path) -> None:
    config_path.write_text(yaml.safe_dump(_config(min_replicas=1)))
    answer = httpx.post(gateway.url + "/admin/reload", headers=ADMIN, timeout=60)
    assert answer.status_code == 200, answer.text
    wait(lambda: shown(page, "min") == 1 and shown(page, "desired") == 1
         and shown(page, "ready") == 1 and shown(page, "usd_per_hour") == AUTO_PRICE,
         "the page to show one ready replica", SCALE_WAIT_S)
    wait(lambda: len(parked_rows(page)) == 1, "one slot routed again", SCALE_WAIT_S)
    check_still_page(page)
    assert fleet_bill(page) == (pytest.approx(AUTO_PRICE + FIXED_PRICE),
                                pytest.approx(AUTO_PRICE + FIXED_PRICE))
    assert page.page.locator(f'#scaling tr[data-scaling="{AUTO}"] .slot.ready.want').count() == 1
    status = page.page.inner_text("#status")
    assert f"fleet ${AUTO_PRICE + FIXED_PRICE:.2f}/hour" in status
    page.page.screenshot(path=str(output_dir / "dashboard-scaling.png"), full_page=True)


def test_no_page_error_and_every_request_to_the_gateway(page: Page) -> None:
    # the five admin calls before the key was entered answer 401: the browser logs them
    assert [e for e in page.errors if "status of 401" not in e] == []
    assert page.urls and all(u.startswith(page.base + "/") or u.startswith("data:")
                             for u in page.urls), sorted(set(page.urls))
