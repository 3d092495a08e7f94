"""A real headless Chromium (Debian's ``chromium`` package) driven by Playwright for Python.

Playwright's own browser downloads are never used: the browser is the system executable
(``FLEETGATE_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH). Without one the
tests skip, unless ``CI`` is set (as ``.ci/run`` runs) or ``FLEETGATE_REQUIRE_BROWSER=1``:
then they fail, since ``make test`` installs the browser.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("FLEETGATE_TEST_OUTPUT", REPO / "build" / "test-output"))


def chromium_path() -> str | None:
    named = os.environ.get("FLEETGATE_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")  # module: the sync API holds an event loop while open
def browser() -> Iterator[Any]:
    required = os.environ.get("FLEETGATE_REQUIRE_BROWSER") == "1" or bool(os.environ.get("CI"))
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            raise
        pytest.skip("playwright is not installed (make test installs it)")
    if executable is None:
        if required:
            pytest.fail("no chromium executable (apt-get install chromium)")
        pytest.skip("no chromium executable (make test installs Debian's chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable,
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT
