"""The fleet simulator and planner: ``fleetgate simulate`` and ``fleetgate plan``.

A discrete-event simulation in virtual time of the real router, live state and request path
(``gateway.py``, ``loop.py``) over replicas driven by the emulator's own engine model
(``replica.py``); workloads from a file or the gateway's request log (``workload.py``,
``arrivals.py``, ``trace.py``); autoscaling (``autoscale.py``); money, the lower bound and the
planner (``summary.py``, ``bound.py``, ``capacity.py``, ``candidates.py``, ``plan.py``); output
(``report.py``, ``plots.py``) and the commands (``cli.py``). docs/simulate.md is the guide.

May touch: routing, state, the emulator's perf model, config, catalog. Must not touch: the
gateway (HTTP), the worker; nothing outside the CLI imports this package.
"""

DEFAULT_GPUS = ("mi300x", "mi355x", "h100", "h200")
