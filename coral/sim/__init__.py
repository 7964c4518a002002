"""Event-based simulator of a planned deployment (see `event_loop.py` for the model, `pd.py` for
prefill/decode-disaggregated instances)."""

from coral.sim.deployment import (
    DeploymentError,
    InstanceSpec,
    Stage,
    StageNode,
    instance_from_template,
    instances_from_plan,
)
from coral.sim.config import SimConfig
from coral.sim.event_loop import Simulator, simulate
from coral.sim.results import PdRequestResult, RequestResult, SimResult
from coral.sim.metrics import summarize
from coral.sim.workload import Request, WorkloadError, read_trace, synthetic, trace_requests

__all__ = [
    "DeploymentError", "InstanceSpec", "PdRequestResult", "Request", "RequestResult",
    "SimConfig", "SimResult", "Simulator", "Stage", "StageNode", "WorkloadError",
    "instance_from_template", "instances_from_plan", "read_trace", "simulate", "summarize",
    "synthetic", "trace_requests",
]
