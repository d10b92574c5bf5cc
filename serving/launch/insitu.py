"""Plan a running app again from what its processes measure, and put that plan in force:
redeployed where its replicas differ, adopted by the running replicas where they do not.

The measurement itself (probe traffic, CPU read from /proc, measured over modelled factors)
is :mod:`serving.measure.insitu`; this module is the launch side: it asks for the probe,
plans again with the factors, and puts the refined plan in force.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from serving.core.plan_board import publish_plan
from serving.core.procstat import session_dir
from serving.core.serve_apps import delete_app, logging_config, run_app
from serving.core.specs import AppSpec
from serving.launch.graph import build_app, chain_role, monitor_settings, row_schema, specs_of
from serving.launch.module_chains import chain_callers
from serving.measure.insitu import PROBE_BODIES, PROBE_HEADER, probe, summary
from serving.measure.stages import request_bodies
from serving.planning.planner import (
    SIMULATED_LOAD,
    kept_running,
    plan_again,
    same_replicas,
    simulated_at,
)
from serving.runtime.stage_runner import module_groups


def refine_in_situ(spec: AppSpec, opt: Any, plan: Any, url: str, token: str, *,
                   api_key: str | None, replan: bool, budget_cpus: float | None,
                   overrides: Callable[[Any], None] | None = None) -> tuple[Any, str]:
    """Probe the app running ``spec``, plan again with the measured CPU factors (``replan``;
    else the given plan keeps its replicas and only its predictions change; ``overrides``
    re-applies the caller's settings to the new plan), and put it in force: where it runs other
    replicas, the app redeployed with it and without the probe's token; where it runs the same,
    published for the running replicas, which adopt it and stop honouring the token
    (serving.core.plan_board). Returns the plan in force and a note; a failed probe leaves the
    app and its plan as they were."""
    import ray

    monitor = spec.monitor
    _, record_config = monitor_settings(monitor, opt) if monitor is not None else ({}, {})
    bodies = request_bodies(opt.sample_rows_, plan.rows_per_request, row_schema(opt, record_config), PROBE_BODIES)
    headers = {PROBE_HEADER: token, **({"X-API-Key": api_key} if api_key else {})}
    try:
        measured = probe(f"{url}/predict", bodies, plan.rows_per_request, plan, spec.name,
                         session=session_dir(ray.get_runtime_context().gcs_address) or "", headers=headers,
                         charge_to=chain_roles(spec, opt, plan))
    except Exception as exc:  # the app stays as deployed; the plan says it was not checked
        return plan, f"in-situ probe failed ({exc}); the plan's predictions are its model's alone"
    before = {"max_rows_per_s": plan.max_rows_per_s, "predicted": dict(plan.predicted), "bottleneck": plan.bottleneck}
    refined = plan_again(plan, budget_cpus=budget_cpus, cpu_scale=measured["factors"]) if replan else None
    if refined is None or not refined.placeable:
        refined = replace(plan, in_situ={"factors": measured["factors"]}, notes=list(plan.notes))
        rate = plan.target_rps or SIMULATED_LOAD * plan.max_rows_per_s / plan.rows_per_request
        refined.predicted = simulated_at(refined, rate)
    if overrides is not None:
        overrides(refined)
    changed = not same_replicas(plan, refined)
    if not changed:  # the running replicas adopt it: their reservations and admission bound stay
        refined = kept_running(refined, plan)
    refined.in_situ.update({**{k: v for k, v in measured.items() if k != "factors"}, "before": before,
                            "replanned": changed})
    if changed:
        spec.plan, spec.probe_sha256 = refined.to_dict(), None
        # deleted first, so that the new replicas are placed on free nodes as planned (an update in
        # place would start them while the old ones still hold their CPUs); the monitor stays
        delete_app(spec.name)
        run_app(build_app(spec, opt), spec.name, f"/{spec.name}", logging_config(spec.access_log, spec.log_format))
        what = "replicas planned again"
    else:  # the same replicas: the running ones adopt the refined plan, none restarts
        spec.plan = refined.to_dict()
        publish_plan(spec.name, spec.probe_sha256, spec.plan)
        what = "replicas unchanged, kept running"
    return refined, (f"in situ ({measured['clients']} clients, {measured['seconds']:g} s): CPU measured over modelled "
                     f"{summary(measured['factors'])}; {what}; bound {before['max_rows_per_s']:.0f} -> "
                     f"{refined.max_rows_per_s:.0f} rows/s")


def chain_roles(spec: AppSpec, opt: Any, plan: Any) -> dict[str, str]:
    """Each module-chain deployment's role (as the probe names processes) -> the stage that
    calls it, whose module work it does."""
    chains = spec.module_chains or {}
    out: dict[str, str] = {}
    for stage in chain_callers(specs_of(opt, spec.baseline, plan)):
        for group in module_groups(opt, stage):
            for k in range(len(chains[group].stages) if group in chains else 0):
                out[chain_role(group, k)] = stage.name
    return out
