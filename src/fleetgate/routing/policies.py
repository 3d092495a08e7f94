"""Named policies and the routes that pick one per request: the ``PolicyRouter``.

A request's policy: the ``x-fleetgate-policy`` header if it names a policy (the gateway
checks it exists and that the caller may use it), else the first ``routes`` entry whose
``match`` fits (model, every listed header, tenant), else ``default_policy``.
``build_router(config)`` builds every pipeline up front and validates every plugin's params,
raising ``PolicyError`` with the YAML path of the first problem; a reload builds a whole new
router and the gateway swaps one reference.

May touch: config schema, routing pipeline and plugins. Must not touch: I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.config.schema import FleetConfig, PolicyConfig, RouteMatch
from fleetgate.routing.estimate import Slo
from fleetgate.routing.pipeline import Pipeline
from fleetgate.routing.plugins import FILTERS, PICKERS, SCORERS, Bound, PluginError, bind
from fleetgate.routing.strategies import STRATEGIES
from fleetgate.routing.types import Decision, RoutingRequest, Snapshot


class PolicyError(ValueError):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass
class PolicyRouter:
    policies: dict[str, Pipeline]
    routes: list[tuple[RouteMatch, str]]
    default: str

    def policy_for(self, req: RoutingRequest) -> str:
        if req.policy and req.policy in self.policies:
            return req.policy
        for match, policy in self.routes:
            if _matches(match, req):
                return policy
        return self.default

    def route(self, request: RoutingRequest, snapshot: Snapshot) -> Decision:
        return self.policies[self.policy_for(request)].route(request, snapshot)


def _matches(match: RouteMatch, req: RoutingRequest) -> bool:
    if match.model is not None and match.model != req.model:
        return False
    if match.tenant is not None and match.tenant != req.tenant:
        return False
    return all(req.headers.get(k.lower()) == v for k, v in match.header.items())


def build_router(config: FleetConfig, seed: int | None = None) -> PolicyRouter:
    errors: list[str] = []
    pipelines: dict[str, Pipeline] = {}
    for name, policy in config.policies.items():
        try:
            pipelines[name] = build_pipeline(name, policy, seed)
        except PluginError as exc:
            errors.append(str(exc))
    if errors:
        raise PolicyError(errors)
    routes = [(r.match, r.policy) for r in config.routes]
    return PolicyRouter(pipelines, routes, config.default_policy)


def build_pipeline(name: str, policy: PolicyConfig, seed: int | None = None) -> Pipeline:
    where = f"policies.{name}"
    preset = STRATEGIES.get(policy.strategy)
    if preset is None:
        raise PluginError(f"{where}.strategy", f"unknown strategy {policy.strategy!r}; "
                          f"known: {sorted(STRATEGIES)}")
    if preset.needs_scorers and not policy.scorers:
        raise PluginError(f"{where}.scorers",
                          f"strategy {policy.strategy!r} needs at least one scorer")
    if policy.scorers:
        scorers = [bind(SCORERS, "scorer", s.name, s.params, f"{where}.scorers[{i}]", s.weight)
                   for i, s in enumerate(policy.scorers)]
    else:
        scorers = [bind(SCORERS, "scorer", n, {}, f"{where}.strategy", w)
                   for n, w in preset.scorers]
    filters: list[Bound] = [bind(FILTERS, "filter", "context_fit", {}, f"{where}.filters")]
    filters += [bind(FILTERS, "filter", f.name, f.params, f"{where}.filters[{i}]")
                for i, f in enumerate(policy.filters)]
    if policy.max_usd_per_mtok is not None:
        filters.append(bind(FILTERS, "filter", "max_cost",
                            {"usd_per_mtok": policy.max_usd_per_mtok}, f"{where}.max_usd_per_mtok"))
    picker_name = policy.picker or preset.picker
    if picker_name not in PICKERS:
        raise PluginError(f"{where}.picker", f"unknown picker {picker_name!r}; "
                          f"known: {sorted(PICKERS)}")
    slo = Slo(ttft_s=policy.slo.ttft_ms / 1000 if policy.slo.ttft_ms else None,
              tpot_s=policy.slo.tpot_ms / 1000 if policy.slo.tpot_ms else None)
    return Pipeline(name=name, picker=PICKERS[picker_name](seed), filters=filters,
                    scorers=scorers, slo=slo, slo_mode=preset.slo_mode,
                    max_attempts=policy.max_attempts)
