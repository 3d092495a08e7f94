"""Named policies and the routes that pick one per request: the ``PolicyRouter``.

A request's policy: the ``x-fleetgate-policy`` header if it names a policy (the gateway
checks it exists and that the caller may use it), else the first ``routes`` entry whose
``match`` fits (model, every listed header, tenant), else ``default_policy``.
``build_router(config)`` builds every pipeline up front and validates every plugin's params,
raising ``PolicyError`` with the YAML path of the first problem; a reload builds a whole new
router and the gateway swaps one reference.

``FallbackRoutes``: the models a request may fall back to (``routes[].fallbacks``). The
first route whose ``match`` fits the request gives its fallbacks, as it gives its policy
(``x-fleetgate-policy`` picks the policy, never the fallbacks); ``chain`` walks them in
order, then each fallback's own route's fallbacks, each model once, skipping the asked
model and models the caller may not use (their own fallbacks still follow). The config
rejects loops, and the walk remembers what it tried, so a chain always ends.

May touch: config schema, routing pipeline and plugins. Must not touch: I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

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


@dataclass(frozen=True, slots=True)
class FallbackRoutes:
    routes: tuple[tuple[RouteMatch, tuple[str, ...]], ...] = ()

    @classmethod
    def from_config(cls, config: FleetConfig) -> FallbackRoutes:
        if not any(r.fallbacks for r in config.routes):
            return cls()
        return cls(tuple((r.match, tuple(r.fallbacks)) for r in config.routes))

    def of(self, req: RoutingRequest) -> tuple[str, ...]:
        """The fallbacks of the first route that matches ``req``."""
        for match, fallbacks in self.routes:
            if _matches(match, req):
                return fallbacks
        return ()

    def chain(self, req: RoutingRequest, may_use: Callable[[str], bool]) -> Iterator[str]:
        """The models to try after ``req.model``, best first (see the module)."""
        seen = {req.model}
        queue = list(self.of(req))
        while queue:
            model = queue.pop(0)
            if model in seen:
                continue
            seen.add(model)
            queue.extend(self.of(replace(req, model=model)))
            if may_use(model):
                yield model


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
                    max_attempts=policy.max_attempts, seed=seed)
