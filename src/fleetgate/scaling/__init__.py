"""Fleet autoscaling: desired replicas per pool from demand and each replica's learned SLO
capacity (``scaler.py``), read from live state the same way by the simulator and the
gateway (``signals.py``). Sits below the gateway and the simulator, above ``state``.
"""

from fleetgate.scaling.scaler import TICK_S, FleetScaler, PoolState, Target, allocate
from fleetgate.scaling.signals import (
    DRAINING,
    OFF,
    READY,
    STARTING,
    ScaledPool,
    changes,
    observe,
    scaled_pools,
)

__all__ = ["DRAINING", "OFF", "READY", "STARTING", "TICK_S", "FleetScaler",
           "PoolState", "ScaledPool", "Target", "allocate", "changes", "observe", "scaled_pools"]
