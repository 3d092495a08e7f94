"""Every span, event, attribute and metric name the gateway emits, in one place.

Dashboards, alerts, docs (``docs/observability.md``) and tests read these names; change one
only on purpose, with the docs in the same commit. Attribute names follow the OpenTelemetry
semantic conventions where one exists (HTTP server, GenAI client: ``gen_ai.*``,
``server.*``, ``error.type``); fleetgate's own live under ``fleetgate.*``. Metric names carry
the ``fleetgate_`` prefix (DESIGN.md §1).

May touch: nothing (constants and three tiny name builders). Must not touch: anything else.
"""

from __future__ import annotations

import functools

# -- spans and events ---------------------------------------------------------------------
SPAN_ROUTE = "route"
EVENT_FIRST_TOKEN = "first_token"
TRACER_NAME = "fleetgate"
SERVICE_NAME = "fleetgate"


def server_span_name(path: str) -> str:
    """HTTP server convention: ``{method} {route}``."""
    return f"POST {path}"


def client_span_name(operation: str, served_model: str) -> str:
    """GenAI client convention: ``{gen_ai.operation.name} {gen_ai.request.model}``."""
    return f"{operation} {served_model}"


# -- semantic-convention attributes -------------------------------------------------------
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

GENAI_OPERATION = "gen_ai.operation.name"
GENAI_PROVIDER = "gen_ai.provider.name"
GENAI_REQUEST_MODEL = "gen_ai.request.model"
GENAI_RESPONSE_MODEL = "gen_ai.response.model"
GENAI_MAX_TOKENS = "gen_ai.request.max_tokens"
GENAI_TEMPERATURE = "gen_ai.request.temperature"
GENAI_TOP_P = "gen_ai.request.top_p"
GENAI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GENAI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
OPERATION_BY_PATH = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}

# -- fleetgate attributes -----------------------------------------------------------------
REQUEST_ID = "fleetgate.request_id"
TENANT = "fleetgate.tenant"
STREAM = "fleetgate.stream"
POOL = "fleetgate.pool"
ENDPOINT = "fleetgate.endpoint"
VENDOR = "fleetgate.vendor"
ATTEMPT = "fleetgate.attempt"  # 0 = first try, 1 = first retry, ...
ATTEMPTS = "fleetgate.attempts"  # on the server span: how many upstream attempts
MIGRATED_AFTER = "fleetgate.migrated_after_tokens"  # a resumed stream's continuation attempt
COST_USD = "fleetgate.cost.usd"
MEAN_CONCURRENCY = "fleetgate.cost.mean_concurrency"
TTFT_S = "fleetgate.ttft_s"  # on the first_token event

ROUTE_POLICY = "fleetgate.route.policy"
ROUTE_REASON = "fleetgate.route.reason"
ROUTE_CANDIDATES = "fleetgate.route.candidates"  # endpoints that passed every filter
ROUTE_REJECTED = "fleetgate.route.rejected"  # endpoints serving the model but filtered out
ROUTE_ORDER = "fleetgate.route.order"  # endpoint ids in retry order
ROUTE_ESTIMATED_COST = "fleetgate.route.estimated_cost_usd"
ROUTE_MODEL = "fleetgate.route.model"  # the public model this decision routed
# on a fallback model's decision (gateway/proxy/fallback.py): the model the client asked
# for, the model tried just before and why it could not serve the request
ROUTE_FALLBACK_ASKED = "fleetgate.route.fallback.asked"
ROUTE_FALLBACK_FROM = "fleetgate.route.fallback.from"
ROUTE_FALLBACK_REASON = "fleetgate.route.fallback.reason"
ROUTE_CHOSEN = "fleetgate.route.chosen"
ROUTE_RUNNER_UP = "fleetgate.route.runner_up"
ROUTE_CHOSEN_VENDOR = ROUTE_CHOSEN + ".vendor"
ROUTE_CHOSEN_ACCELERATOR = ROUTE_CHOSEN + ".accelerator"
ROUTE_CHOSEN_ENGINE = ROUTE_CHOSEN + ".engine"
# under ROUTE_CHOSEN and ROUTE_RUNNER_UP (route_attr): endpoint, pool, score,
# scores.<scorer> and estimate.<one of ROUTE_ESTIMATES>
ROUTE_ESTIMATES = ("ttft_s", "tpot_s", "usd_per_mtok", "marginal_usd", "slo_capacity")


@functools.cache
def route_attr(who: str, name: str) -> str:
    """``fleetgate.route.chosen.scores.cost`` = route_attr(ROUTE_CHOSEN, "scores.cost")."""
    return f"{who}.{name}"

# -- metrics ------------------------------------------------------------------------------
M_REQUESTS = "fleetgate_requests"  # counter: model, pool, endpoint, status, policy
M_ATTEMPTS = "fleetgate_upstream_attempts"  # counter: pool, endpoint, outcome
M_RETRIES = "fleetgate_retries"  # counter: model, policy, pool (the pool that failed)
M_MIGRATIONS = "fleetgate_stream_migrations"  # counter: model, policy, pool (continued on)
M_DECISIONS = "fleetgate_routing_decisions"  # counter: policy, pool, reason
M_TTFT = "fleetgate_time_to_first_token_seconds"  # histogram: pool
M_TPOT = "fleetgate_time_per_output_token_seconds"  # histogram: pool
M_E2E = "fleetgate_e2e_request_latency_seconds"  # histogram: pool
M_INPUT_TOKENS = "fleetgate_input_tokens"  # counter: pool, model
M_OUTPUT_TOKENS = "fleetgate_output_tokens"  # counter: pool, model
M_COST = "fleetgate_cost_usd"  # counter: pool, model, tenant, outcome
M_GPU_SECONDS = "fleetgate_gpu_seconds"  # counter: pool, model
M_SPANS_DROPPED = "fleetgate_trace_spans_dropped"  # counter: the span queue was full
M_SPAN_EXPORT_FAILURES = "fleetgate_trace_export_failures"  # counter: batches not exported

# per-endpoint, read from the live state at scrape time
M_EP_INFO = "fleetgate_endpoint_info"
M_EP_QUEUE = "fleetgate_endpoint_queue_depth"
M_EP_RUNNING = "fleetgate_endpoint_running"
M_EP_IN_FLIGHT = "fleetgate_endpoint_in_flight"
M_EP_KV = "fleetgate_endpoint_kv_cache_usage_ratio"
M_EP_READY = "fleetgate_endpoint_ready"
M_EP_BREAKER = "fleetgate_endpoint_breaker_state"  # 0 closed, 1 half_open, 2 open
M_EP_TOKENS_PER_S = "fleetgate_endpoint_tokens_per_second"
M_EP_USD_PER_MTOK = "fleetgate_endpoint_usd_per_mtok"
M_EP_PRICE = "fleetgate_endpoint_price_usd_per_hour"
M_SCRAPE_ERRORS = "fleetgate_scrape_errors"  # counter: endpoint
M_TENANT_BUDGET = "fleetgate_tenant_budget_usd"  # gauge: tenant, period (day|month)
M_SHADOW_COST = "fleetgate_shadow_cost_usd"  # counter: pool, serving_pool
M_SHADOW_SKIPPED = "fleetgate_shadow_skipped_budget"  # counter: pool, serving_pool
M_SHADOW_CAP = "fleetgate_shadow_max_usd_per_hour"  # gauge: policy, pool
BREAKER_CODES = {"closed": 0, "half_open": 1, "open": 2}

OUTCOME_OK, OUTCOME_FAILED, OUTCOME_CANCELLED = "ok", "failed", "cancelled"
NO_POOL = "none"  # label value when a request reached no endpoint
ANONYMOUS = "anonymous"  # tenant of a request without one
M_POOL_DESIRED = "fleetgate_pool_desired_replicas"  # gauge: pool (autoscale:, the scaler's want)
M_POOL_REPLICAS = "fleetgate_pool_replicas"  # gauge: pool, state (ready|starting|draining)
M_POOL_USD_PER_HOUR = "fleetgate_pool_usd_per_hour"  # gauge: pool (the bill now)
