"""Live state: what the gateway knows about every endpoint now, and how it keeps it current.

``live.py`` (the arrays the router snapshots, updated per event, with the learned
corrections of the prior), ``breaker.py`` (breaker and health state machines), ``prior.py``
(an endpoint's performance prior from the catalog), ``fleet.py`` (one config's endpoints,
emulated engines and collector), ``collector.py`` (probes and scrapes), ``sync.py`` (replica
exchange), ``store/`` (in-memory and Redis stores).

May touch: routing types, backends, config, catalog. Must not touch: the gateway (HTTP).
"""
