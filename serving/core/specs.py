"""How an optimized pipeline splits into serving stages: the vocabulary every wing uses.

Stages are coarse on purpose (each hop costs CPU on both sides): the *cheap* stage runs
the first cascade level; the *expensive* stage runs every later level and only sees the
rows the cheap stage was unsure of. A pipeline without a cascade has one *model* stage;
the *baseline* stage (the unoptimized pipeline in one deployment) exists for side-by-side
benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.core.constants import HANDOVER_SURGE_PERCENT, LOST_AFTER_S, MAX_BODY_BYTES, MAX_ROWS
from willump import OptimizedPipeline


@dataclass(frozen=True)
class StageSpec:
    """A stage runs cascade levels first..last (inclusive)."""

    name: str
    first: int
    last: int


#: the stage that runs every level of a cascade in one pass (:func:`whole_cascade`)
WHOLE_STAGE = "cascade"


def whole_cascade(opt: OptimizedPipeline) -> list[StageSpec]:
    """Every level as one stage: a fused ingress runs it and the unsure rows never leave the
    process (no hop). Cheaper than a stage of their own where a hop costs more CPU than the
    expensive level's work on the few rows it gets; ``deploy(layout="auto")`` plans both and
    keeps the faster (:func:`serving.launch.deploy.make_plan`)."""
    return [StageSpec(WHOLE_STAGE, 0, len(opt.levels) - 1)]


def stage_specs(opt: OptimizedPipeline) -> list[StageSpec]:
    """Cheap + expensive stages for a cascade; one model stage otherwise."""
    n = len(opt.levels)
    if n == 1:
        return [StageSpec("model", 0, 0)]
    return [StageSpec("cheap", 0, 0), StageSpec("expensive", 1, n - 1)]


def unsure_share(opt: OptimizedPipeline) -> float:
    """Fraction of rows the cheap level sends on, as measured at certification."""
    levels = opt.report().levels
    if len(levels) < 2:
        return 1.0
    return float(min(1.0, max(0.0, 1.0 - levels[0].fraction_answered)))


def gpu_capable(opt: OptimizedPipeline, spec: StageSpec, runtime: str) -> bool:
    """Whether the stage's models can run on a GPU: ONNX Runtime sessions (CUDA provider) or
    torch models; scikit-learn and LightGBM models run on the CPU only."""
    if runtime == "onnx":
        return True
    if spec.name == "baseline":
        models = [opt.baseline.model]
    else:
        models = [opt.levels[i].model for i in range(spec.first, spec.last + 1)]
    return all(hasattr(m, "module_") and hasattr(m, "to") for m in models)


class ChainStageSpec(BaseModel):
    """One partition stage of a module group's chain: the file deploy wrote and its digest."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    replicas: int = Field(default=1, ge=1)
    #: the stage plan's blocks [start, end) (for /plan and the docs)
    blocks: tuple[int, int]


def pool_deployment(app: str, stage: str, pool: str) -> str:
    """The Serve deployment of ``stage``'s replicas on node pool ``pool`` (``deploy(pools=...)``)."""
    return f"{app}-{stage}-{pool}"


class ModuleChainSpec(BaseModel):
    """A module group served as a chain of partition stages (``deploy(module_memory=...)``)."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["cpu", "cuda"] = "cpu"
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    stages: list[ChainStageSpec] = Field(min_length=1)
    #: the partition plan (``serving.partition.Plan.to_dict()``)
    plan: dict[str, Any] = Field(default_factory=dict)


class AppSpec(BaseModel):
    """What an app is: written by :func:`serving.deploy` and ``willump build`` (into a Serve
    config's ``args``), read by :mod:`serving.launch.graph`. Validated once, at that edge: a
    config file with a misspelt or missing field is refused by name."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(min_length=1)
    #: where replicas get the artifact (:class:`serving.core.artifacts.ArtifactSource`'s fields)
    artifact: dict[str, Any]
    #: the stage plan (``Plan.to_dict()``)
    plan: dict[str, Any]
    baseline: bool = False
    runtime: Literal["native", "onnx"] = "native"
    batching: bool = True
    #: the user's monitor options (None: no monitor)
    monitor: dict[str, Any] | None = None
    degrade: bool = False
    deadline_ms: float | None = Field(default=None, gt=0)
    #: the API key's HMAC under the machines' key secret (serving.runtime.keys; None: no key)
    api_key_hmac: str | None = None
    #: an environment variable every ingress replica reads its API key from when it starts (a
    #: Kubernetes Secret injected into the pods): the key itself never enters the config; a
    #: replica whose variable is unset or empty refuses to start
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: Host names the app answers to (None: any; deploy sets the loopback names when it binds there)
    allowed_hosts: list[str] | None = None
    #: deploy's in-situ probe token (its hash): None once the app is redeployed after the probe; where the
    #: running replicas adopt the refined plan instead (serving.core.plan_board), it names that plan's entry
    probe_sha256: str | None = None
    max_in_flight: int | None = Field(default=None, ge=1)
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1)
    max_rows: int = Field(default=MAX_ROWS, ge=1)
    min_replicas: int | None = Field(default=None, ge=0)
    max_replicas: int | None = Field(default=None, ge=1)
    downscale_to_zero_s: float | None = Field(default=None, ge=0)
    #: who picks an autoscaled stage's replicas: "serve" (Serve's default policy: requests held
    #: per replica) or "planner" (serving.planning.autoscale: rows answered over the planned
    #: capacity per replica)
    autoscaler: Literal["serve", "planner"] = "serve"
    #: :func:`serving.runtime.gears.gear_info` (None: the plan's one gear)
    gears: dict[str, Any] | None = None
    #: :class:`serving.runtime.calls.StageHedge`'s options (None: no hedging)
    hedging: dict[str, Any] | None = None
    #: how calls reach a stage's replicas: "capacity" (serving.runtime.routing.CapacityRouter:
    #: by measured capacity, draining and silent replicas last) or "serve" (Serve's default)
    router: Literal["capacity", "serve"] = "capacity"
    #: seconds a stage call may wait on a replica nobody reported lost before it is copied to
    #: another (serving.runtime.hedge.LOST_AFTER_S; None: never)
    lost_after_s: float | None = Field(default=LOST_AFTER_S, gt=0)
    #: module groups served as chains of partition stages, by group name
    module_chains: dict[str, ModuleChainSpec] | None = None
    #: share of the cheap level's rows the live audit also runs through the full pipeline
    #: (serving.runtime.audit; 0: no audit)
    audit_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    #: what the audit's alarm does: "alert" only, or "step" (hold the gear; serving.runtime.hold)
    on_alarm: Literal["alert", "step"] = "alert"
    #: Serve's replica logs: text lines or JSON objects, with a line per request or not
    #: (serving.core.serve_apps.logging_config)
    log_format: Literal["text", "json"] = "text"
    access_log: bool = False
    #: Serve's ``max_surge_percent`` for the ingress and stages (serving.core.constants.
    #: HANDOVER_SURGE_PERCENT; 0 where deploy found no room for the replacements beside the
    #: running app of the same name: Serve then stops old replicas first)
    surge_percent: int = Field(default=HANDOVER_SURGE_PERCENT, ge=0, le=100)
    #: names the monitor's default state directory (serving.runtime.monitor_state): drawn for a
    #: new app, handed on to the app that replaces it (None: the monitor keeps its state in memory)
    monitor_state: str | None = Field(default=None, pattern=r"^[0-9a-f]{8,64}$")

    @model_validator(mode="after")
    def _planner_needs_autoscaling(self) -> AppSpec:
        if self.autoscaler == "planner" and self.min_replicas is None:
            raise ValueError("autoscaler='planner' picks an autoscaled stage's replicas: give min_replicas "
                             "(autoscaling is off without it)")
        return self


class IngressConfig(BaseModel):
    """Everything an ingress replica is told, built from an :class:`AppSpec` and the artifact
    by :mod:`serving.launch.graph` (or by the calibration probes). Its JSON form (``info``) is
    what ``/plan``, ``/report`` and the dashboard read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model_version: str
    classes: list[Any]
    #: feature groups per cascade level
    levels: list[list[str]]
    stages: list[str]
    first_stage_last_level: int = 0
    #: :meth:`serving.core.schema.RowSchema.to_dict`
    row_schema: dict[str, Any]
    report: dict[str, Any] = Field(default_factory=dict)
    plan: dict[str, Any] = Field(default_factory=dict)
    layout: Literal["staged", "fused"] = "staged"
    #: the monitor app's name and the record config, or None
    monitor: dict[str, Any] | None = None
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=1)
    max_rows: int = Field(default=MAX_ROWS, ge=1)
    batching: bool = True
    deadline_s: float = Field(gt=0)
    degrade: bool = False
    api_key_hmac: str | None = None
    api_key_env: str | None = None
    allowed_hosts: list[str] | None = None
    probe_sha256: str | None = None
    max_in_flight: int = Field(ge=1)
    gears: dict[str, Any] | None = None
    hedging: dict[str, Any] | None = None
    lost_after_s: float | None = Field(default=LOST_AFTER_S, gt=0)
    #: stages served by a deployment per node pool (``deploy(pools=...)``): stage -> {"rates": rows/s
    #: of one replica per pool, "replicas": per pool} (None: none)
    pools: dict[str, dict[str, Any]] | None = None
    #: the live audit (:class:`serving.runtime.audit.LiveAudit`): rate, the full level's index per
    #: gear, the request attributes followed as segments (None: no audit)
    audit: dict[str, Any] | None = None
    #: write each log record when it happens (an app that asked for access or JSON logs), not in
    #: Serve's buffer of 1,000 (serving.runtime.edge.unbuffer_request_logs)
    unbuffered_logs: bool = False

    def info(self) -> dict[str, Any]:
        """The plain-JSON form the dashboard and the ``/plan`` and ``/report`` routes read."""
        out = self.model_dump()
        out["schema"] = out.pop("row_schema")
        return out
