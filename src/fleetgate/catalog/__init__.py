"""The catalog: pure data about engines (``engines.py``), GPUs (``gpus.py``), model shapes
(``models.py``), the roofline step cost (``roofline.py``) and the cost rule (``pricing.py``).

The leaf of the package graph: it imports nothing from fleetgate.
"""
