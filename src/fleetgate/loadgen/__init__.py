"""``fleetgate bench``: a load generator and report for any OpenAI-compatible URL.

``plan.py`` draws the requests (lengths, arrivals: flags, a workload file or a request-log
trace read by ``sim.workload`` / ``sim.trace``), ``prompts.py`` writes prompts of a token
length, ``client.py`` sends one request and times it the way vLLM's ``vllm bench serve``
does, ``run.py`` schedules them (closed loop, open loop, replay; always bounded),
``metrics.py`` turns the records into the ``bench --json`` object of DESIGN.md §1,
``costs.py`` reads the gateway's ledger, ``report.py`` prints and compares, ``plots.py``
draws, ``sweep.py`` finds each pool's highest load within the SLO, ``cli.py`` is the command.

May touch: aiohttp, numpy, rich, matplotlib (plots only), the simulator's workload and trace
readers. Must not touch: the gateway, state, routing or backends (it is a client of the HTTP
API, like any other).
"""
