"""LoRA adapter control calls to an engine: load, unload, and which adapters it holds.

vLLM (with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): ``POST /v1/load_lora_adapter
{"lora_name", "lora_path"}`` answers 200 with a text body, or its error envelope (400 when
the name is already loaded, 404 when nothing is found at the path, 500 when loading fails);
``POST /v1/unload_lora_adapter {"lora_name"}`` answers 404 for a name it does not hold.
SGLang: ``POST /load_lora_adapter`` and ``/unload_lora_adapter`` with the same fields answer
``{"success", "error_message", "loaded_adapters"}`` with 200, or 400 when ``success`` is
false. Both list the adapters they hold in ``GET /v1/models`` as cards whose ``parent`` is
the base model.

A load of an adapter the engine already holds counts as done, and so does an unload of one
it does not hold: the engine is where the gateway wanted it (another gateway worker, or an
operator, got there first).

The calls go out on the control plane's client (``backends/http1.py``, the collector's:
``backends/probes.py``), each with one timeout for connect, first byte and the whole answer;
bodies are JSON (``content-type: application/json``).

May touch: the relay client. Must not touch: routing, state.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.relay import Timeouts, UpstreamError

PATHS = {  # engine -> (load path, unload path)
    "vllm": ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    "sglang": ("/load_lora_adapter", "/unload_lora_adapter"),
}
_ALREADY = ("already been loaded", "already loaded")
_GONE = ("cannot be found", "does not exist")


class AdapterError(Exception):
    """The engine refused a load or unload (``status``: its HTTP status; 0: unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def served_adapter_name(engine: str, served_base: str, adapter: str) -> str:
    """What a request's ``model`` says to select ``adapter`` on this engine: vLLM serves it
    under its own name, SGLang selects it with ``base:adapter``."""
    return f"{served_base}:{adapter}" if engine == "sglang" else adapter


async def load_adapter(http: Http1Backend, url: str, engine: str, name: str,
                       path: str, headers: Mapping[str, str], timeout_s: float) -> None:
    """Load ``name`` from ``path`` on the engine at ``url``; AdapterError when it refuses."""
    await _call(http, url + PATHS.get(engine, PATHS["vllm"])[0],
                {"lora_name": name, "lora_path": path}, headers, timeout_s, _ALREADY)


async def unload_adapter(http: Http1Backend, url: str, engine: str, name: str,
                         headers: Mapping[str, str], timeout_s: float) -> None:
    """Unload ``name`` from the engine at ``url``; AdapterError when it refuses."""
    await _call(http, url + PATHS.get(engine, PATHS["vllm"])[1], {"lora_name": name},
                headers, timeout_s, _GONE)


async def list_adapters(http: Http1Backend, url: str, headers: Mapping[str, str],
                        timeout_s: float) -> dict[str, tuple[str, str | None]]:
    """The adapters the engine's ``/v1/models`` lists: name -> (its parent (base) model, its
    ``root``: the path the engine loaded it from)."""
    try:
        resp = await http.get(url + "/v1/models", headers, _timeouts(timeout_s))
        raw = await resp.read()
        if resp.status != 200:
            raise AdapterError(resp.status, raw.decode(errors="replace")[:200])
        cards = orjson.loads(raw).get("data") or []
    except (UpstreamError, orjson.JSONDecodeError, AttributeError) as exc:
        raise AdapterError(0, f"{url}/v1/models: {exc or type(exc).__name__}") from None
    return {str(c["id"]): (str(c["parent"]), str(c["root"]) if c.get("root") else None)
            for c in cards if isinstance(c, dict) and c.get("parent") and c.get("id")}


async def _call(http: Http1Backend, url: str, body: dict[str, str],
                headers: Mapping[str, str], timeout_s: float, fine: tuple[str, ...]) -> None:
    try:
        resp = await http.post(url, orjson.dumps(body),
                               {"content-type": "application/json", **headers},
                               _timeouts(timeout_s))
        raw = await resp.read()
        status = resp.status
    except UpstreamError as exc:
        raise AdapterError(0, f"{url}: {exc or type(exc).__name__}") from None
    message = _message(raw)
    if status == 200 and not message.startswith("!"):
        return
    if any(f in message for f in fine):
        return
    raise AdapterError(status, f"{url}: HTTP {status}: {message.lstrip('!')}")


def _timeouts(timeout_s: float) -> Timeouts:
    """One bound for the connect, the first byte and the whole exchange."""
    return Timeouts(connect=timeout_s, read=timeout_s, total=timeout_s)


def _message(raw: bytes) -> str:
    """The error in an answer ("" for none; "!" + it for SGLang's 200 with success false)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")[:500] if raw[:1] in (b"{", b"[") else ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message", ""))
    if isinstance(error, str):
        return error
    if body.get("success") is False:
        return "!" + str(body.get("error_message") or "failed")
    return ""
