"""The shift section of ``benchmarks.guarantee_live``: UCI Adult's certified cascade, its held-out
rows replayed as served traffic whose share of one segment grows, the live audit's ledger
(``drift._guarantee.GuaranteeLedger``) fed batch by batch.

The workload is ``pipelines.adult`` on every row of the file (24,420 training rows, 8,141
held out). 6,000 training rows are set aside and passed to ``willump.optimize`` as ``cert=``, so
the certification counts are counted on the very rows that certified the plan (unless the
artifact records them on its gear: ``cert_rows`` / ``cert_disagreed``, then those). Costs are
fixed (``fixed_costs``: one profile of this pipeline on a 2-core machine, rounded), so the plan
does not flip with the machine's load (profiled on a busy machine it did), and the cascade is
kept whatever its speedup (``keep_slower_cascade``): the question is the audit, not the speed.

Each held-out row gets: answered by a cheap level or not, whether the served class differs from
the full pipeline's, and its accuracy loss (full right minus served right, with the label). The
stream draws served rows from the held-out rows (with replacement) by the value of one
attribute: the planted value's share grows linearly from its natural share to 1 over ``ramp``
audited rows; within a value, rows are drawn uniformly. Per batch of about 20 audited rows the
counts (served, cheap, audited, disagreed) of each value go into the ledger, the alarm is read,
and the true loss is the held-out rows' loss under the current mixture (instantaneous) and over
every row served so far (cumulative). The ledger's alarm tests every run of its epochs (about
2,000 audited rows each) ending now, so it speaks of the rows since some epoch start: between
the two; the audited rows of the run that fired are reported.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

import pipelines
import willump
from drift._guarantee import GearTerms, GuaranteeLedger
from pipelines.adult import CATEGORICAL_GROUPS, categories

#: target from the issue: the alarm before this many audited rows
TARGET_SHIFT_AUDITS = 5_000
CERT_ROWS = 6_000
AUDIT_RATE = 0.01
BATCH_AUDITS = 20
#: audited rows a stream runs for at most
STREAM_AUDITS = 20_000
#: audited rows over which the planted segment's share grows from natural to 1 (None: stationary)
RAMPS = (2_000, 10_000)
#: held-out rows a segment needs to be a candidate
MIN_SEGMENT_ROWS = 200
FAST = dict(verbose=False, importance_repeats=1)
#: seconds per row of each feature group and of a model (one profile, rounded)
FIXED_COSTS = {"numeric": 0.7e-6, "capital": 0.6e-6, "household": 4.6e-6, "work": 4.8e-6, "origin": 3.9e-6,
               "<model>": 1e-6}


@functools.lru_cache(maxsize=2)
def _optimize(seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The adult workload and its cascade (cached: the cbpe section reads the same cascade; copy
    ``info`` before changing it)."""
    w = pipelines.build("adult", seed=seed)
    fit, cert = train_test_split(np.arange(len(w.X_train)), test_size=CERT_ROWS, random_state=seed,
                                 stratify=w.y_train)
    fitted = dataclasses.replace(w, X_train=w.X_train.iloc[fit].reset_index(drop=True), y_train=w.y_train[fit])
    Xc, yc = w.X_train.iloc[cert].reset_index(drop=True), w.y_train[cert]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", willump.WillumpWarning)
        opt = fitted.optimize(keep_slower_cascade=True, cert=(Xc, yc), fixed_costs=FIXED_COSTS, **FAST)
    report = opt.report()
    info = {"workload": "adult", "train_rows": len(fit), "cert_rows_passed": len(cert), "held_out_rows": len(w.X_test),
            "max_loss": w.max_loss, "plan": repr(opt), "is_cascade": opt.is_cascade,
            "loss_bound": report.loss_bound, "splits": dict(report.splits)}
    return w, opt, {"cert": (Xc, yc), **info}


def row_facts(opt: Any, X: Any, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: answered by a cheap level, served class != the full pipeline's, accuracy loss."""
    proba, level = opt.predict_with_levels(X)
    served = proba.argmax(axis=1)
    full = opt.baseline.predict_proba(X).argmax(axis=1)
    classes = opt.classes_
    loss = (classes[full] == y).astype(int) - (classes[served] == y).astype(int)
    return level < len(opt.levels) - 1, served != full, loss


def _gear_terms(opt: Any, Xc: Any, yc: np.ndarray, max_loss: float) -> tuple[GearTerms, str, dict[str, int]]:
    cheap, disagree, _ = row_facts(opt, Xc, yc)
    counted = {"cert_rows": len(yc), "cert_disagreed": int(disagree.sum()), "cert_cheap": int(cheap.sum())}
    gear = opt.gears_[0]
    if getattr(gear, "cert_rows", None):
        return (GearTerms(0, max_loss, int(gear.cert_rows), int(gear.cert_disagreed or 0)),
                "the artifact (opt.gears_[0].cert_rows / cert_disagreed)", counted)
    return (GearTerms(0, max_loss, counted["cert_rows"], counted["cert_disagreed"]),
            "counted here on the certification rows passed as cert= (the gear does not record them)", counted)


def segment_table(X: Any, cheap: np.ndarray, disagree: np.ndarray, loss: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for attribute in [c for cols in CATEGORICAL_GROUPS.values() for c in cols]:
        values = categories(X, [attribute])[attribute].astype(str).to_numpy()
        for value in np.unique(values):
            m = values == value
            if m.sum() >= MIN_SEGMENT_ROWS:
                rows.append({"attribute": attribute, "value": value, "rows": int(m.sum()),
                             "cheap_share": float(cheap[m].mean()), "disagreement": float(disagree[m].mean()),
                             "loss": float(loss[m].mean())})
    return rows


def _stream(rng: np.random.Generator, values: np.ndarray, planted: str, ramp: int | None, cheap: np.ndarray,
            disagree: np.ndarray, loss: np.ndarray, terms: GearTerms, attribute: str,
            max_loss: float) -> dict[str, Any]:
    names, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    cheap_rate = np.bincount(inverse, cheap) / counts
    d_cheap = np.bincount(inverse, disagree & cheap) / np.maximum(np.bincount(inverse, cheap), 1)
    loss_v = np.bincount(inverse, loss) / counts
    seg = int(np.flatnonzero(names == planted)[0])
    w0 = counts[seg] / counts.sum()
    rest = counts.astype(float)
    rest[seg] = 0.0
    rest /= rest.sum()
    onehot = np.zeros(len(names))
    onehot[seg] = 1.0
    served_per_batch = round(BATCH_AUDITS / (AUDIT_RATE * cheap.mean()))
    ledger = GuaranteeLedger([terms], segments=[attribute])
    reference = ledger.reference_rate(0)[0]
    audited = loss_sum = served = 0
    out: dict[str, Any] = {"alarm_audits": None, "instant_cross_audits": None, "cumulative_cross_audits": None}
    for b in range(STREAM_AUDITS // BATCH_AUDITS):
        t = (b + 0.5) * BATCH_AUDITS
        w = w0 if ramp is None else w0 + (1.0 - w0) * min(1.0, t / ramp)
        probs = (1.0 - w) * rest + w * onehot
        n_v = rng.multinomial(served_per_batch, probs)
        cheap_v = rng.binomial(n_v, cheap_rate)
        audited_v = rng.binomial(cheap_v, AUDIT_RATE)
        disagreed_v = rng.binomial(audited_v, d_cheap)
        for v in np.flatnonzero(n_v):
            ledger.add(0, n_v[v], cheap_v[v], audited_v[v], disagreed_v[v], segment={attribute: names[v]})
        audited += int(audited_v.sum())
        served += int(n_v.sum())
        loss_sum += float(n_v @ loss_v)
        if out["instant_cross_audits"] is None and float(probs @ loss_v) > max_loss:
            out["instant_cross_audits"] = audited
        if out["cumulative_cross_audits"] is None and loss_sum / served > max_loss:
            out["cumulative_cross_audits"] = audited
        if out["alarm_audits"] is None and alarm_possible(ledger, reference):
            verdict = ledger.verdict(0)
            if verdict["alarm"]:
                segments = ledger.report(attribute)["gears"][0]["segments"]
                top = max(segments, key=lambda e: e["disagreement_lower"])
                out.update(alarm_audits=audited, top_segment_at_alarm=top["value"],
                           disagreement_at_alarm=verdict["disagreement_rate"],
                           loss_upper_at_alarm=verdict["loss_upper"], instant_loss_at_alarm=float(probs @ loss_v),
                           alarm_run_audits=verdict["alarm_audited_rows"],
                           cumulative_loss_at_alarm=loss_sum / served, share_at_alarm=w)
        if out["alarm_audits"] is not None and (ramp is None or out["cumulative_cross_audits"] is not None):
            break
    final = ledger.verdict(0)
    out.update(final_audits=audited, final_loss_upper=final["loss_upper"], final_supported=final["supported"])
    return out


def alarm_possible(ledger: GuaranteeLedger, reference: float) -> bool:
    """Whether some run of gear 0's epochs ending now has a served disagreement estimate above
    ``reference``: the ledger's alarm needs one (``rejects_at_most`` rejects a rate only below the
    estimate), so no verdict is read otherwise (with a little slack: the verdict decides)."""
    audited = disagreed = served = cheap = 0
    for e in reversed(ledger.epochs.get(0, [])):
        audited, disagreed, served, cheap = (audited + e.audited, disagreed + e.disagreed, served + e.served,
                                             cheap + e.cheap)
        if disagreed * cheap * (1 + 1e-9) > reference * served * audited:
            return True
    return False


def _quantile(xs: list[Any], q: float = 0.5) -> float | None:
    """The ``q`` quantile (the higher of two middle values), a missing value counting as beyond
    every other: None when it falls on one."""
    filled = np.array([np.inf if x is None else x for x in xs] or [np.inf], dtype=float)
    m = float(np.quantile(filled, q, method="higher"))
    return None if not np.isfinite(m) else m


def _summary(runs: list[dict[str, Any]], planted: str) -> dict[str, Any]:
    alarmed = [r for r in runs if r["alarm_audits"] is not None]
    alarm = [r["alarm_audits"] for r in runs]
    return {
        "seeds": len(runs), "alarmed": len(alarmed),
        "alarm_audits_median": _quantile(alarm),
        "alarm_audits_p90": _quantile(alarm, 0.9),
        "alarm_before_target": float(np.mean([a is not None and a < TARGET_SHIFT_AUDITS for a in alarm])),
        "instant_cross_audits_median": _quantile([r["instant_cross_audits"] for r in runs]),
        "cumulative_cross_audits_median": _quantile([r["cumulative_cross_audits"] for r in runs]),
        "alarm_before_instant_cross": float(np.mean([
            r["alarm_audits"] is not None and (r["instant_cross_audits"] is None
                                               or r["alarm_audits"] <= r["instant_cross_audits"]) for r in runs])),
        "top_segment_is_planted": float(np.mean([r.get("top_segment_at_alarm") == planted for r in alarmed]))
        if alarmed else None,
        "disagreement_at_alarm_median": _quantile([r.get("disagreement_at_alarm") for r in alarmed]),
        "instant_loss_at_alarm_median": _quantile([r.get("instant_loss_at_alarm") for r in alarmed]),
        "cumulative_loss_at_alarm_median": _quantile([r.get("cumulative_loss_at_alarm") for r in alarmed]),
        "loss_upper_at_alarm_median": _quantile([r.get("loss_upper_at_alarm") for r in alarmed]),
        "alarm_run_audits_median": _quantile([r.get("alarm_run_audits") for r in alarmed]),
        "loss_upper_at_stop_median": _quantile([r["final_loss_upper"] for r in runs]),
        "supported_at_stop": float(np.mean([bool(r["final_supported"]) for r in runs])),
        "runs": runs,
    }


def planted_segments(table: list[dict[str, Any]], max_loss: float) -> dict[str, dict[str, Any]]:
    """The segments a shift is planted on: among those losing at least 2 x max_loss, the one
    that disagrees most and the one that loses most (the same row when one does both)."""
    losing = [r for r in table if r["loss"] >= 2 * max_loss]
    if not losing:
        return {}
    picks = {"disagrees most": max(losing, key=lambda r: r["disagreement"])}
    most = max(losing, key=lambda r: r["loss"])
    if most is not picks["disagrees most"]:
        picks["loses most"] = most
    return picks


def shift_section(seeds: int, seed: int) -> dict[str, Any]:
    w, opt, info = _optimize(seed)
    info = dict(info)
    Xc, yc = info.pop("cert")
    out: dict[str, Any] = {"workload": info, "target_audits": TARGET_SHIFT_AUDITS, "audit_rate": AUDIT_RATE,
                           "batch_audits": BATCH_AUDITS, "stream_audits": STREAM_AUDITS}
    if not opt.is_cascade:
        out["skipped"] = f"willump served the full pipeline ({opt.report().reason}): nothing to audit"
        return out
    terms, source, counted = _gear_terms(opt, Xc, yc, w.max_loss)
    ledger = GuaranteeLedger([terms])
    cheap, disagree, loss = row_facts(opt, w.X_test, w.y_test)
    out["certification"] = {**dataclasses.asdict(terms), "source": source, "counted": counted,
                            "alarm_reference": ledger.reference_rate(0)[0]}
    out["held_out"] = {"rows": len(loss), "cheap_share": float(cheap.mean()), "disagreement": float(disagree.mean()),
                       "loss": float(loss.mean())}
    table = segment_table(w.X_test, cheap, disagree, loss)
    picks = planted_segments(table, w.max_loss)
    out["segments"] = sorted(table, key=lambda r: -r["disagreement"])
    for r in out["segments"]:
        r["rank_by_loss"] = 1 + sorted(table, key=lambda x: -x["loss"]).index(r)
    if not picks:
        out["skipped"] = f"no segment of {MIN_SEGMENT_ROWS}+ held-out rows loses 2 x max_loss"
        return out
    scenarios = []
    for i, (why, pick) in enumerate(picks.items()):
        values = categories(w.X_test, [pick["attribute"]])[pick["attribute"]].astype(str).to_numpy()
        for j, ramp in enumerate((*RAMPS, None) if i == 0 else RAMPS):
            rng = np.random.default_rng([seed, 4, i, j])
            runs = [_stream(rng, values, pick["value"], ramp, cheap, disagree, loss, terms, pick["attribute"],
                            w.max_loss) for _ in range(seeds)]
            scenarios.append({"segment": f"{pick['attribute']}={pick['value']}", "why": why, "ramp_audits": ramp,
                              "segment_row": pick, **_summary(runs, pick["value"])})
    out["scenarios"] = scenarios
    return out


def _n(v: float | None, cap: int = STREAM_AUDITS) -> str:
    return f"> {cap:,}" if v is None else f"{v:,.0f}"


def _p(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def print_shift(r: dict[str, Any]) -> None:
    info = r["workload"]
    print(f"\n== shift: {info['workload']}, {info['plan']}, max_loss {info['max_loss']}, certified bound "
          f"{info['loss_bound']:.4f} on {info['cert_rows_passed']:,} certification rows (cert=); "
          f"target: alarm before {r['target_audits']:,} audited rows ==")
    if "skipped" in r and "certification" not in r:
        print(r["skipped"])
        return
    c, h = r["certification"], r["held_out"]
    print(f"certification counts from {c['source']}: {c['cert_disagreed']} of {c['cert_rows']:,} rows disagree "
          f"({c['cert_disagreed'] / c['cert_rows']:.2%}); alarm reference (upper bound) "
          f"{c['alarm_reference']:.2%}")
    print(f"held-out rows {h['rows']:,}: cheap share {h['cheap_share']:.1%}, disagreement {h['disagreement']:.2%}, "
          f"accuracy loss {h['loss']:+.2%}\n")
    print("| segment (held-out rows) | rows | cheap share | disagreement | accuracy loss |")
    print("|---|---|---|---|---|")
    # the most disagreeing segments, and the most losing ones
    for s in [s for s in r["segments"] if r["segments"].index(s) < 6 or s["rank_by_loss"] <= 2]:
        print(f"| {s['attribute']}={s['value']} | {s['rows']:,} | {s['cheap_share']:.1%} | {s['disagreement']:.2%} "
              f"| {s['loss']:+.2%} |")
    if "skipped" in r:
        print(r["skipped"])
        return
    print("\n| planted segment | ramp to 100% (audited rows) | seeds | alarm: median (p90) audited rows "
          "| alarm before 5,000 | true loss > max_loss from: now | since the start | alarm no later than the "
          "loss | alarm's top segment is it | served disagreement at alarm | loss now / since start at alarm "
          "| run that fired (audited rows, median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in r["scenarios"]:
        ramp = "stationary" if s["ramp_audits"] is None else f"{s['ramp_audits']:,}"
        top = "-" if s["top_segment_is_planted"] is None else f"{s['top_segment_is_planted']:.0%}"
        print(f"| {s['segment']} ({s['why']}) | {ramp} | {s['seeds']} | {_n(s['alarm_audits_median'])} "
              f"({_n(s['alarm_audits_p90'])}) | {s['alarm_before_target']:.0%} | {_n(s['instant_cross_audits_median'])} "
              f"| {_n(s['cumulative_cross_audits_median'])} | {s['alarm_before_instant_cross']:.0%} | {top} "
              f"| {_p(s['disagreement_at_alarm_median'])} | {_p(s['instant_loss_at_alarm_median'])} / "
              f"{_p(s['cumulative_loss_at_alarm_median'])} | "
              f"{_n(s['alarm_run_audits_median']) if s['alarmed'] else '-'} |")
    ramps = [s for s in r["scenarios"] if s["ramp_audits"] is not None]
    met = [s for s in ramps if s["alarm_audits_median"] is not None and s["alarm_audits_median"] < r["target_audits"]]
    print(f"target (alarm before {r['target_audits']:,} audited rows): median met in {len(met)} of {len(ramps)} "
          f"planted shifts; share of seeds: " + ", ".join(f"{s['segment']} ramp {s['ramp_audits']:,}: "
                                                          f"{s['alarm_before_target']:.0%}" for s in ramps))
    if r["scenarios"]:
        print("label-free loss bound (loss_upper) where a stream stopped, median: "
              + ", ".join(f"{s['segment']} {s['ramp_audits'] or 'stationary'}: {_p(s['loss_upper_at_stop_median'])}"
                          f" (supported <= max_loss in {s['supported_at_stop']:.0%})" for s in r["scenarios"]))
