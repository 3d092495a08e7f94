"""``EmulatorConfig``: everything that defines one emulated engine server, validated.

Defaults follow the real engines where a number matters to routing (engines.md, gpus.md §4):

* profile: from the first served name ("70b" in it -> 70B FP8, else 8B), or ``profile``;
* tp: None -> the smallest power of two whose KV cache holds one ``max_model_len`` sequence
  (a real engine refuses to start otherwise; a given tp that does not fit is an error);
* vLLM scheduler: ``max_num_seqs`` 256, ``max_num_batched_tokens`` 8192, admission on the
  prompt alone with preemption (kv_reserve_ratio 0);
* SGLang scheduler: ``max_running_requests`` 1024, ``chunked_prefill_size`` 8192 (16384 on
  GPUs with >= 140 GB), half of the possible output reserved at admission (its
  ``new_token_ratio`` starts at 0.7 and decays to 0.1; 0.5 is a midpoint).

May touch: pydantic, fleetgate.catalog, the perf model. Must not touch: I/O.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetgate.catalog.gpus import GPUS, GpuSpec
from fleetgate.catalog.models import MODEL_PROFILES, ModelProfile, profile_for_served_name
from fleetgate.catalog.roofline import kv_capacity_tokens, min_tensor_parallel
from fleetgate.emulator.perfmodel import EngineSim, SchedulerConfig


class EmulatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["vllm", "sglang"]
    gpu: str
    served_models: list[str] = Field(min_length=1)
    profile: str | None = None
    speed: float = Field(default=1.0, gt=0)
    stack: Literal["stock", "tuned"] = "stock"
    tp: int | None = Field(default=None, ge=1, le=8)
    max_queued_requests: int | None = Field(default=None, ge=0)
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    natural_completion_tokens: int = Field(default=16, ge=1)
    request_log_size: int = Field(default=200, ge=0)
    model_path: str | None = None  # vLLM card ``root`` (the --model argument); default: 1st name
    # /v1/embeddings answers with vectors; False: a generative server (vLLM 404, SGLang 400)
    embeddings: bool = True
    embedding_dim: int | None = Field(default=None, ge=1)  # None: the profile's d_model
    # usage.prompt_tokens_details = {"cached_tokens": N} on chat/completions answers, as vLLM's
    # --enable-prompt-tokens-details and SGLang's --enable-cache-report (off: null, the default)
    prompt_tokens_details: bool = False
    # LoRA (vLLM --enable-lora --lora-modules NAME=PATH --max-loras N, with
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING for the load/unload routes; SGLang --enable-lora
    # --lora-paths NAME=PATH --max-loras-per-batch N, its load routes always there):
    # adapters served from the start (name -> path), the batch's cap on distinct adapters,
    # and whether adapters may be loaded and unloaded at run time (vLLM only; SGLang always)
    enable_lora: bool = False
    lora_modules: dict[str, str] = Field(default_factory=dict)
    max_loras: int | None = Field(default=None, ge=1)
    runtime_lora: bool = False

    @model_validator(mode="after")
    def _lora(self) -> EmulatorConfig:
        clash = set(self.lora_modules) & set(self.served_models)
        if clash:
            raise ValueError(f"LoRA adapter names {sorted(clash)} are served model names")
        return self

    @property
    def lora_enabled(self) -> bool:
        """--enable-lora, or implied by startup adapters or run-time loading."""
        return self.enable_lora or bool(self.lora_modules) or self.runtime_lora

    @property
    def lora_cap(self) -> int:
        """Distinct adapters one batch may run: vLLM's --max-loras defaults to 1, SGLang's
        --max-loras-per-batch to 8."""
        if self.max_loras is not None:
            return self.max_loras
        return 1 if self.engine == "vllm" else 8

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in GPUS:
            raise ValueError(f"gpu must be one of {sorted(GPUS)}")
        return value

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        if value is not None and value not in MODEL_PROFILES:
            raise ValueError(f"profile must be one of {sorted(MODEL_PROFILES)}")
        return value

    @model_validator(mode="after")
    def _fits(self) -> EmulatorConfig:
        gpu, profile, max_len = self.gpu_spec, self.model_profile, self.context_length
        sched = self.scheduler_config()
        if self.tp is None:
            min_tensor_parallel(
                gpu, profile, max_len, sched.gpu_memory_utilization, sched.workspace_gb
            )
            return self
        capacity = kv_capacity_tokens(
            gpu, profile, self.tp, sched.gpu_memory_utilization, sched.workspace_gb
        )
        if capacity < max_len:
            need = min_tensor_parallel(gpu, profile, max_len)
            raise ValueError(
                f"{profile.name} with tp={self.tp} on {gpu.name} leaves KV room for {capacity} "
                f"tokens, less than max_model_len={max_len}: use tp >= {need}"
            )
        return self

    @property
    def gpu_spec(self) -> GpuSpec:
        return GPUS[self.gpu]

    @property
    def model_profile(self) -> ModelProfile:
        if self.profile is not None:
            return MODEL_PROFILES[self.profile]
        return profile_for_served_name(self.served_models[0])

    @property
    def context_length(self) -> int:
        return self.max_model_len or self.model_profile.max_model_len

    @property
    def tensor_parallel(self) -> int:
        if self.tp is not None:
            return self.tp
        return min_tensor_parallel(self.gpu_spec, self.model_profile, self.context_length)

    def scheduler_config(self) -> SchedulerConfig:
        if self.engine == "vllm":
            seqs, batched, reserve = 256, 8192, 0.0
        else:
            # SGLang 0.5.23 arg_groups/memory_hook.py handle_gpu_memory_settings: chunked
            # prefill 8k below 160 GiB of device memory ("H20, H200"), 16k from there on
            # ("B200, MI300"); hbm_gb is decimal GB
            batched = 16384 if self.gpu_spec.hbm_gb * 1e9 >= 160 * 2**30 else 8192
            seqs, reserve = 1024, 0.5
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs or seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or batched,
            kv_reserve_ratio=reserve,
            max_loras=self.lora_cap if self.lora_enabled else 0,
        )

    def build_sim(self) -> EngineSim:
        return EngineSim(
            self.gpu_spec,
            self.model_profile,
            tp=self.tensor_parallel,
            stack=self.stack,
            scheduler=self.scheduler_config(),
        )
