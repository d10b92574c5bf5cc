"""What a stage replica does, as plain Python (no Ray), so it is testable on its own.

A replica loads the artifact (see :mod:`serving.core.artifacts`: by path or from the object
store, checksums verified) and runs its range of cascade levels on batches that may merge
rows from many requests; one request's bad rows fail only that request.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

import willump
from serving.core.specs import StageSpec
from willump import OptimizedPipeline
from willump.runtime import Block, hstack, predict_proba


def serial_when_inline(opt: OptimizedPipeline, inline: bool) -> list[str]:
    """A stage that runs inline on its replica's event loop computes its feature groups one
    after another (``opt.workers = 1``); returns a note when that overrides the artifact.

    ``optimize(workers="auto")`` keeps one thread per group when that measured faster for one
    call in one process; a close call, decided by the wall clock of a few repeats, that went
    either way from run to run. Served, the replicas are the parallelism: an inline stage is
    CPU-bound by its profile, so its groups' threads only contend for the GIL, and the event
    loop waits on them (a profile of such an ingress spent 45% of its samples in thread
    hand-offs, at about half the rows/s)."""
    if not inline or getattr(opt, "workers", 1) <= 1:
        return []
    was, opt.workers = opt.workers, 1
    return [f"feature groups computed one after another on the event loop (the artifact asked for {was} "
            "threads; the stage runs inline, so its replicas are the parallelism)"]


def place_models(opt: OptimizedPipeline, device: str, runtime: str) -> list[str]:
    """Move or convert the models to run on ``device``; returns notes on what happened.

    ``runtime='onnx'`` swaps every level's model for an ONNX Runtime session
    (CUDA provider on a GPU device, CPU otherwise), checked numerically against the
    native model on the sample rows. Torch models move to the device natively.
    Anything else stays a native CPU model.
    """
    notes = []
    if runtime not in ("native", "onnx"):
        raise ValueError(f"runtime must be 'native' or 'onnx', got {runtime!r}")
    torch_device = "cuda" if device.startswith("cuda") or device == "gpu" else "cpu"
    if runtime == "onnx":
        from willump.runtime import Level, hstack

        sample = opt.sample_rows_
        if sample is None:
            raise ValueError("runtime='onnx' needs the artifact's sample rows to check the export")
        blocks, _ = opt.pipeline.compute(sample, opt.pipeline.graph.groups)
        levels = []
        for level in opt.levels:
            X = hstack([blocks[g] for g in level.groups])
            onx = willump.OnnxModel(willump.to_onnx(level.model, X.shape[1]), opt.classes_, torch_device)
            diff = willump.check_onnx(level.model, onx, X)
            fell_back = f" (asked for {torch_device}: {onx.fallback})" if onx.fallback else ""
            notes.append(f"level {list(level.groups)}: ONNX on {onx.providers[0]}{fell_back}, max diff {diff:.1e}")
            levels.append(Level(level.groups, onx, level.threshold))
        opt.levels = levels
        return notes
    for level in opt.levels:
        if hasattr(level.model, "to") and hasattr(level.model, "module_"):
            if torch_device == "cuda":
                import torch

                if not torch.cuda.is_available():
                    warnings.warn("CUDA requested but torch sees no GPU; staying on CPU", stacklevel=2)
                    continue
            level.model.to(torch_device)
            notes.append(f"level {list(level.groups)}: torch on {torch_device}")
    notes += _place_module_groups(opt, torch_device)
    return notes


def module_groups(opt: OptimizedPipeline, spec: StageSpec) -> list[str]:
    """The ``willump.module_feature`` groups (torch modules) a stage computes: those of its
    levels that no earlier level computed (every one for the baseline stage)."""
    from willump import ModuleFeature

    features = _graph_features(opt)
    done = set(opt.levels[spec.first - 1].groups) if spec.first > 0 and spec.name != "baseline" else set()
    names = {g for i in range(spec.first, spec.last + 1) for g in opt.levels[i].groups} - done
    return sorted(g for g in names if isinstance(features.get(g), ModuleFeature))


def _graph_features(opt: OptimizedPipeline) -> dict[str, Any]:
    """The feature group behind each node; empty for a pipeline that has none to show."""
    graph_features = getattr(opt.pipeline, "graph_features", None)
    if graph_features is None:
        return {}
    try:
        return graph_features()
    except willump.PipelineError:  # not captured: no groups to place
        return {}


def _place_module_groups(opt: OptimizedPipeline, torch_device: str) -> list[str]:
    """Move the pipeline's module feature groups to the replica's device (their inputs follow
    at call time; a replica computes only its stage's groups)."""
    from willump import ModuleFeature

    notes = []
    for name, group in _graph_features(opt).items():
        if not isinstance(group, ModuleFeature) or group.device == torch_device:
            continue
        if torch_device == "cuda":
            import torch

            if not torch.cuda.is_available():
                warnings.warn("CUDA requested but torch sees no GPU; module groups stay on CPU", stacklevel=2)
                continue
        group.to(torch_device)
        notes.append(f"module group {name}: torch on {torch_device}")
    return notes


def concat_rows(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def concat_blocks(parts: Sequence[dict[str, Block] | None]) -> dict[str, Block] | None:
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise ValueError("cannot merge requests with and without precomputed blocks")
    if len(parts) == 1:
        return parts[0]
    out = {}
    for g in parts[0]:
        pieces = [p[g] for p in parts]
        out[g] = sp.vstack(pieces, format="csr") if sp.issparse(pieces[0]) else np.vstack(pieces)
    return out


def slice_blocks(blocks: dict[str, Block] | None, start: int, stop: int) -> dict[str, Block] | None:
    return None if blocks is None else {g: b[start:stop] for g, b in blocks.items()}


class StageRunner:
    """Runs cascade levels ``spec.first..spec.last`` (or the baseline) for a replica."""

    def __init__(self, opt: OptimizedPipeline, spec: StageSpec, *, baseline: bool = False,
                 fallback: bool = False):
        self.opt = opt
        self.spec = spec
        self.baseline = baseline
        #: also return this stage's own (last level's) prediction for the rows it leaves
        #: unsure, so the ingress can answer them degraded when a later stage is too late
        self.fallback = fallback and not baseline and spec.last < len(opt.levels) - 1

    def run(self, rows: pd.DataFrame, blocks: dict[str, Block] | None = None) -> dict[str, Any]:
        """Probabilities, answering level, unsure positions and their blocks for ``rows``."""
        start = time.perf_counter()
        if self.baseline:
            proba = self.opt.baseline.predict_proba(rows)
            level = np.full(len(rows), len(self.opt.levels) - 1, dtype=np.int64)
            out = {"proba": proba, "level": level, "unsure": np.zeros(0, dtype=np.int64), "blocks": None}
        else:
            result = self.opt.run_levels(rows, self.spec.first, self.spec.last, blocks)
            out = {
                "proba": result.proba,
                "level": result.level,
                "unsure": result.unsure,
                "blocks": result.blocks if result.unsure.size else None,
            }
            if self.fallback and result.unsure.size:
                level = self.opt.levels[self.spec.last]
                out["fallback"] = predict_proba(level.model, hstack([result.blocks[g] for g in level.groups]))
        out["seconds"] = time.perf_counter() - start
        return out

    def canary(self) -> dict[str, Any]:
        """One sample row (the artifact's own) through this stage on its device: raises
        RuntimeError when it fails or answers something that is not a probability row. What
        a replica's health check runs, so a broken CUDA context or a stage that can no
        longer compute reads as unhealthy rather than as a replica that answers nothing."""
        sample = getattr(self.opt, "sample_rows_", None)
        if sample is None or len(sample) == 0:
            return {"canary": "skipped: the artifact has no sample rows"}
        start = time.perf_counter()
        try:
            out = self.run(sample.iloc[:1])
        except Exception as exc:
            raise RuntimeError(f"stage {self.spec.name}: the canary row failed: {type(exc).__name__}: {exc}") from exc
        proba = np.asarray(out["proba"], dtype=float)
        # a stage before the last may leave the row to the next one: then it says so (unsure, with
        # the blocks it computed) and answers no probability for it
        handed_on = (not self.baseline and self.spec.last < len(self.opt.levels) - 1
                     and list(np.asarray(out.get("unsure", ()))) == [0] and out.get("blocks") is not None)
        if proba.shape != (1, len(self.opt.classes_)) or (not handed_on and (
                not np.all(np.isfinite(proba)) or not np.isclose(proba.sum(), 1.0, atol=1e-3))):
            raise RuntimeError(f"stage {self.spec.name}: the canary row answered {proba.tolist()}, not one "
                               f"probability row over {len(self.opt.classes_)} classes")
        return {"canary": "ok" if not handed_on else "ok (handed on to the next stage)",
                "seconds": time.perf_counter() - start}

    def run_many(self, items: Sequence[tuple[pd.DataFrame, dict[str, Block] | None]]) -> list[dict[str, Any] | Exception]:
        """One pass over the rows of several requests; results split back per request. When
        the merged pass fails, each request runs alone and a failing one gets its exception
        (in its place in the list) instead of failing the others."""
        if len(items) == 1:
            try:
                return [self.run(*items[0])]
            except Exception as exc:
                return [exc]
        sizes = [len(rows) for rows, _ in items]
        try:
            merged = self.run(concat_rows([r for r, _ in items]), concat_blocks([b for _, b in items]))
        except Exception:
            return [self.run_many([item])[0] for item in items]
        return split_outputs(merged, sizes)

    # --- top-K halves ------------------------------------------------------------------
    def topk_filter(self, rows: pd.DataFrame, k: int, label_index: int) -> dict[str, Any] | None:
        step = self.opt.topk_filter_step(rows, k, label_index)
        if step is None:
            return None
        return {"ratio": step.ratio, "cheap_scores": step.cheap_scores, "kept": step.kept,
                "blocks": step.kept_blocks, "label": step.label, "check": step.check}

    def topk_rank(self, rows: pd.DataFrame, blocks: dict[str, Block], label_index: int,
                  check: dict[str, Any]) -> dict[str, Any]:
        """Full scores of the kept rows and the answer's certificate (see willump._topk)."""
        scores = self.opt.topk_rank_step(rows, blocks, label_index)
        return {"scores": scores, "certificate": self.opt.topk_certify(label_index, check, scores).to_dict()}

    def full_scores(self, rows: pd.DataFrame, label_index: int) -> np.ndarray:
        return self.full_proba(rows)[:, label_index]

    def full_proba(self, rows: pd.DataFrame) -> np.ndarray:
        """The full pipeline's probabilities (the live audit's reference answer, and the answer
        while the audit's alarm holds gear 0; every gear's certificate is against this pipeline)."""
        return np.asarray(self.opt.baseline.predict_proba(rows))


def with_busy_s(out: Any, busy_s: float) -> Any:
    """``out`` with the seconds its replica was busy computing it (``busy_s``, an emulated
    device's hold included), what the ingress reads a stage's load from (GearSwitch's step back):
    a list of per-call outputs of one merged pass shares them by rows."""
    if isinstance(out, dict):
        out["busy_s"] = float(busy_s)
    elif isinstance(out, list):
        parts = [o for o in out if isinstance(o, dict)]
        sizes = [len(o.get("level", ())) for o in parts]
        total = sum(sizes)
        for o, size in zip(parts, sizes, strict=True):
            o["busy_s"] = float(busy_s) * (size / total if total else 1.0 / len(parts))
    return out


def split_outputs(merged: dict[str, Any], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """A stage output over concatenated requests, split back per request (in order)."""
    if len(sizes) == 1:
        return [merged]
    offsets = np.cumsum([0, *sizes])
    unsure = merged["unsure"]
    outs = []
    for i in range(len(sizes)):
        lo, hi = offsets[i], offsets[i + 1]
        mask = (unsure >= lo) & (unsure < hi)
        first = int(np.searchsorted(unsure, lo))
        count = int(mask.sum())
        out = {
            "proba": merged["proba"][lo:hi],
            "level": merged["level"][lo:hi],
            "unsure": unsure[mask] - lo,
            "blocks": slice_blocks(merged["blocks"], first, first + count) if count else None,
            "seconds": merged["seconds"],
            "replica": merged.get("replica"),
        }
        if merged.get("fallback") is not None and count:
            out["fallback"] = merged["fallback"][first:first + count]
        outs.append(out)
    return outs


def split_rows(rows: pd.DataFrame, blocks: dict[str, Block] | None, max_rows: int):
    """Chunks of at most ``max_rows`` rows (with their blocks), in order."""
    n = len(rows)
    for start in range(0, n, max_rows):
        stop = min(start + max_rows, n)
        yield rows.iloc[start:stop], slice_blocks(blocks, start, stop)


def merge_chunks(chunks: Sequence[dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """Inverse of split_rows for stage outputs."""
    if len(chunks) == 1:
        return chunks[0]
    offsets = np.cumsum([0, *sizes[:-1]])
    unsure = np.concatenate([c["unsure"] + off for c, off in zip(chunks, offsets, strict=True)])
    parts = [c["blocks"] for c in chunks if c["blocks"] is not None]
    out = {
        "proba": np.vstack([c["proba"] for c in chunks]),
        "level": np.concatenate([c["level"] for c in chunks]),
        "unsure": unsure.astype(np.int64),
        "blocks": concat_blocks(parts) if parts else None,
        "seconds": float(sum(c["seconds"] for c in chunks)),
        "replica": chunks[0].get("replica"),
    }
    if any("busy_s" in c for c in chunks):
        out["busy_s"] = float(sum(c.get("busy_s", 0.0) for c in chunks))
    fallbacks = [c["fallback"] for c in chunks if c.get("fallback") is not None]
    if fallbacks:
        out["fallback"] = np.vstack(fallbacks)
    return out
