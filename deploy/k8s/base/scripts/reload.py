"""config-reloader sidecar: POST /admin/reload when the mounted fleet YAML changes.

The kubelet replaces a ConfigMap volume's files in place (an atomic symlink swap, within
about a minute of the edit; never with subPath mounts). This loop hashes the file every
FLEETGATE_RELOAD_INTERVAL_S seconds and, when the bytes change, asks the gateway in the same
pod to re-read it. The gateway validates the new file first: a bad one changes nothing and
the answer (logged here) lists each error with its YAML path. A failed POST is retried on
the next tick. Standard library only: it runs in the gateway image.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
import urllib.error
import urllib.request


def digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def reload(url: str, key: str | None, timeout: float = 10.0) -> tuple[int, str]:
    request = urllib.request.Request(url, data=b"", method="POST")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def main() -> int:
    path = os.environ.get("FLEETGATE_CONFIG", "/etc/fleetgate/fleet.yaml")
    url = os.environ.get("FLEETGATE_RELOAD_URL", "http://127.0.0.1:8080/admin/reload")
    key = os.environ.get("FLEETGATE_ADMIN_KEY")
    interval = float(os.environ.get("FLEETGATE_RELOAD_INTERVAL_S", "5"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seen = digest(path)  # what the gateway loaded at start
    print(f"config-reloader: watching {path} ({seen})", flush=True)
    while True:
        time.sleep(interval)
        now = digest(path)
        if now is None or now == seen:
            continue
        status, body = reload(url, key)
        print(f"config-reloader: {path} changed -> {status} {body[:2000]}", flush=True)
        if status in (200, 400):  # reloaded, or rejected for good (fix the file)
            seen = now


if __name__ == "__main__":
    sys.exit(main())
