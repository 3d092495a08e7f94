"""drain: an engine container's preStop hook. Returns once the engine has no request left.

Kubernetes runs it when the pod is deleted (a scale-down by KEDA or the HPA, a rollout, a
node drain) and sends the engine SIGTERM only after it returns. Meanwhile the pod's
`register` sidecar has had its SIGTERM and DELETEd this engine at every gateway replica, so
no new request comes; the ones in flight run to their end here. It waits at least MIN_S (a
request the gateway dispatched just before the DELETE still arrives), then until the
engine's own /metrics shows no running and no waiting request on two polls in a row, or
MAX_S at most (keep MAX_S under the pod's terminationGracePeriodSeconds, which also has to
cover the engine's own shutdown). If the engine does not answer, there is nothing to wait for.

    python3 drain.py METRICS_URL [MAX_S] [MIN_S]

Standard library only: it runs in the engine's image (vLLM's, SGLang's, the gateway's).
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

# running + waiting requests, by engine (fleetgate.catalog.engines: the same gauges the
# router reads)
QUEUE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                "sglang:num_running_reqs", "sglang:num_queue_reqs")


def in_flight(text: str) -> float | None:
    """Requests running or waiting, summed over every series of the gauges above (vLLM
    labels them per model); None when the text has none of them."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in QUEUE_GAUGES:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return total if seen else None


def scrape(url: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return in_flight(answer.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def drain(url: str, max_s: float, min_s: float, poll_s: float = 1.0) -> str:
    start = time.monotonic()
    idle = 0
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= max_s:
            return f"drain: gave up after {elapsed:.0f} s with requests in flight"
        count = scrape(url)
        if count is None:
            return f"drain: {url} does not answer; nothing to wait for"
        idle = idle + 1 if count == 0 else 0
        if idle >= 2 and elapsed >= min_s:
            return f"drain: idle after {elapsed:.0f} s"
        time.sleep(poll_s)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    max_s = float(argv[2]) if len(argv) > 2 else 240.0
    min_s = float(argv[3]) if len(argv) > 3 else 5.0
    print(drain(argv[1], max_s, min_s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
