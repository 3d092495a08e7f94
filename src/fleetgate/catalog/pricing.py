"""The cost rule, in one place: what a replica costs, what a request is charged, $/Mtok.

A replica costs ``price_per_gpu_hour * gpus_per_replica / 3600`` dollars per second whether
busy or idle (DESIGN.md §2). A request that ran ``e2e_s`` seconds on a replica shared with
``concurrency`` requests on average is charged its share of the replica's time:

    replica-seconds = e2e_s / max(1, concurrency)
    charge $        = replica $/s * replica-seconds

A replica busy with B requests for T seconds is charged B * (T/B) = T replica-seconds, so
the charges add up to exactly what the busy replica cost. $/Mtok counts *output* tokens:
``replica $/s / tokens_per_s * 1e6``. The router (its ``usd_per_s`` column), the cost ledger,
limits and budgets, the route span's estimate, ``/admin/endpoints``, the metrics and the
simulator all use these functions.

May touch: nothing (pure arithmetic). Must not touch: anything else.
"""

from __future__ import annotations

from dataclasses import dataclass


def usd_per_second(price_per_gpu_hour: float, gpus_per_replica: int = 1) -> float:
    """What one replica costs per second, busy or idle."""
    return price_per_gpu_hour * gpus_per_replica / 3600.0


def replica_seconds(e2e_s: float, concurrency: float) -> float:
    """A request's share of its replica's time."""
    return max(0.0, e2e_s) / max(1.0, concurrency)


def charge_usd(usd_per_s: float, e2e_s: float, concurrency: float) -> float:
    """The attribution rule: replica $/s times the request's share of the replica's time."""
    return usd_per_s * replica_seconds(e2e_s, concurrency)


def usd_per_mtok(usd_per_s: float, tokens_per_s: float | None) -> float | None:
    """$ per million output tokens at a sustained rate; None when the rate is unknown."""
    if not tokens_per_s or tokens_per_s <= 0:
        return None
    return usd_per_s / tokens_per_s * 1e6


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """A hosted API's price: $ per million input (prompt) and output tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def charge_usd(self, input_tokens: float, output_tokens: float) -> float:
        """What a request with these tokens is charged."""
        return (max(0.0, input_tokens) * self.input_usd_per_mtok
                + max(0.0, output_tokens) * self.output_usd_per_mtok) / 1e6

    def usd_per_output_mtok(self, input_tokens: float, output_tokens: float) -> float:
        """$ per million output tokens for requests of this shape (the prompt's price
        spread over the answer), comparable with a replica's ``usd_per_mtok``."""
        return self.output_usd_per_mtok + self.input_usd_per_mtok * (
            max(0.0, input_tokens) / max(1.0, output_tokens))
