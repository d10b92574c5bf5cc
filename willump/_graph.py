"""The captured graph: feature groups, their upstream steps, and the columns they read."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._blocks import Block, to_block
from ._rows import columns_of, n_rows, take
from .errors import PipelineError

if TYPE_CHECKING:
    from ._capture import Pipeline

#: rows used to learn the graph (validation, dependencies, column reads)
CAPTURE_SAMPLE_ROWS = 64
#: tolerance when checking that a group's rows do not depend on other rows of the batch
ROWWISE_RTOL = 1e-7
ROWWISE_ATOL = 1e-9


@dataclass
class Graph:
    """Feature groups in model order, the nodes they need, and the input columns they read."""

    groups: list[str]
    nodes: list[str]
    upstream: dict[str, set[str]]
    depth0: set[str]
    columns: dict[str, list[str]]
    input_columns: list[str]
    widths: dict[str, int]
    sparse: dict[str, bool]
    conservative: bool = False
    notes: list[str] = field(default_factory=list)
    #: call-site path -> node key (see FeatureGroup._site_path): how later runs name nodes
    sites: dict[str, str] = field(default_factory=dict)
    #: groups that gave different values on two runs over the same rows (no cascade then)
    nondeterministic: list[str] = field(default_factory=list)
    #: the body's top-level feature calls may run in a thread pool (see willump._concurrent)
    concurrent: bool = False
    #: groups whose row cache may serve (declared cache=, row-wise, deterministic, dense)
    cacheable: list[str] = field(default_factory=list)
    #: (rtol, atol) a group's values may differ by and still count as equal in capture's
    #: checks (float32 networks differ by ~1e-6 with the batch they run in); default otherwise
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)

    def tolerance_of(self, group: str) -> tuple[float, float]:
        return getattr(self, "tolerances", {}).get(group, (ROWWISE_RTOL, ROWWISE_ATOL))

    @property
    def position(self) -> dict[str, int]:
        return {g: i for i, g in enumerate(self.groups)}

    def closure(self, groups: Any) -> set[str]:
        """The groups plus every upstream node they transitively need."""
        todo = list(groups)
        seen: set[str] = set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            todo.extend(self.upstream.get(node, ()))
        return seen

    def needed_nodes(self, groups: Any) -> set[str]:
        """Nodes a run must compute when called from the body to produce ``groups``."""
        unknown = [g for g in groups if g not in self.position]
        if unknown:
            raise KeyError(f"unknown feature group(s) {unknown}; known: {self.groups}")
        needed = self.closure(groups)
        if self.conservative:
            needed |= {n for n in self.depth0 if n not in self.position}
        return needed

    def shared_nodes(self) -> list[str]:
        """Nodes needed by two or more groups: computed once, costed once."""
        users: dict[str, int] = {}
        for g in self.groups:
            for n in self.closure([g]):
                users[n] = users.get(n, 0) + 1
        return [n for n in self.nodes if users.get(n, 0) > 1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": list(self.groups),
            "nodes": list(self.nodes),
            "upstream": {k: sorted(v) for k, v in self.upstream.items() if v},
            "columns": {k: list(v) for k, v in self.columns.items()},
            "input_columns": list(self.input_columns),
            "widths": dict(self.widths),
            "sparse": dict(self.sparse),
            "shared": self.shared_nodes(),
            "conservative": self.conservative,
            "notes": list(self.notes),
        }


def capture_graph(pipeline: Pipeline, sample: Any) -> Graph:
    """Run the pipeline on a sample and learn its graph, validating each group."""
    total = n_rows(sample, "X")
    if total == 0:
        raise PipelineError("cannot capture a pipeline on zero rows")
    if total > CAPTURE_SAMPLE_ROWS:
        pick = np.sort(np.random.default_rng(0).choice(total, CAPTURE_SAMPLE_ROWS, replace=False))
        sample = take(sample, pick)
    rows = n_rows(sample)
    previous, pipeline.graph_ = pipeline.graph_, None  # capture names nodes afresh
    try:
        result = pipeline.execute(sample)
    finally:
        pipeline.graph_ = previous
    run = result.run
    groups: list[str] = []
    for i, out in enumerate(result.outputs):
        owner = run.output_owner.get(id(out))
        if owner is None:
            raise PipelineError(
                f"pipeline '{pipeline.name}' output #{i} ({type(out).__name__}) was not returned by "
                "a @willump.feature function; return feature-group outputs directly"
            )
        if owner in groups:
            raise PipelineError(f"feature group '{owner}' appears twice in the pipeline's output")
        groups.append(owner)
    blocks = {g: to_block(result.outputs[i], rows, g) for i, g in enumerate(groups)}
    graph = Graph(
        groups=groups,
        nodes=list(run.order),
        upstream={k: set(v) for k, v in run.parents.items()},
        depth0=set(run.depth0),
        columns={},
        input_columns=columns_of(sample),
        widths={g: int(b.shape[1]) for g, b in blocks.items()},
        sparse={g: bool(sp.issparse(b)) for g, b in blocks.items()},
        sites=dict(run.sites),
        tolerances={g: run.functions[g].tolerance for g in groups
                    if getattr(run.functions.get(g), "tolerance", None) is not None},
    )
    pipeline.features_ = dict(run.functions)
    pipeline.code_modules = {
        getattr(f.fn, "__module__", "__main__") for f in run.functions.values()
    } | {getattr(pipeline.fn, "__module__", "__main__")}
    previous, pipeline.graph_ = pipeline.graph_, graph
    try:
        deterministic = _check_deterministic(pipeline, graph, sample, blocks)
        _check_skipping(pipeline, graph, sample, blocks, deterministic)
        _check_rowwise(pipeline, graph, sample, blocks, deterministic)
        graph.columns = _columns_read(pipeline, graph, sample, blocks, deterministic)
        graph.concurrent = _check_concurrent(pipeline, graph, sample, blocks, deterministic)
        graph.cacheable = _check_cacheable(pipeline, graph, sample, blocks, deterministic, run.functions)
    except Exception:
        pipeline.graph_ = previous
        raise
    return graph


def _close(a: Block, b: Block, tolerance: tuple[float, float] = (ROWWISE_RTOL, ROWWISE_ATOL)) -> bool:
    rtol, atol = tolerance
    if a.shape != b.shape:
        return False
    if sp.issparse(a) or sp.issparse(b):
        diff = abs(sp.csr_matrix(a) - sp.csr_matrix(b))
        if diff.nnz == 0:
            return True
        scale = abs(sp.csr_matrix(b)).max() if sp.csr_matrix(b).nnz else 0.0
        return bool(diff.max() <= atol + rtol * scale)
    return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def _check_deterministic(pipeline, graph: Graph, sample, blocks) -> set[str]:
    again = pipeline.execute(sample)
    rows = n_rows(sample)
    pos = graph.position
    same = {g for g in graph.groups if _close(to_block(again.outputs[pos[g]], rows, g), blocks[g], graph.tolerance_of(g))}
    graph.nondeterministic = [g for g in graph.groups if g not in same]
    for g in graph.nondeterministic:
        msg = (
            f"feature group '{g}' gave different values on two runs over the same rows; a cascade "
            "over it would not be the pipeline that was certified, so willump serves the full "
            "pipeline (make it deterministic, e.g. seed it, to allow cascades)"
        )
        graph.notes.append(msg)
        warnings.warn(msg, stacklevel=3)
    return same


def _check_skipping(pipeline, graph: Graph, sample, blocks, deterministic: set[str]) -> None:
    """Each group computed alone must equal its value in the full run; else stop skipping."""
    from ._capture import SkippedUseError

    rows = n_rows(sample)
    for attempt in ("precise", "conservative"):
        graph.conservative = attempt == "conservative"
        failures = []
        for g in graph.groups:
            try:
                res = pipeline.execute(sample, needed=graph.needed_nodes([g]))
                value = to_block(res.outputs[graph.position[g]], rows, g)
            except SkippedUseError as exc:
                failures.append(f"{g}: {exc}")
                continue
            if g in deterministic and not _close(value, blocks[g], graph.tolerance_of(g)):
                failures.append(f"{g}: value differs when computed alone")
        if not failures:
            if graph.conservative:
                graph.notes.append(
                    "the body passes derived values between feature calls; top-level helper "
                    "features are computed at every cascade level"
                )
            return
    raise PipelineError(
        "feature groups cannot be computed separately: " + "; ".join(failures)
    )


def _check_rowwise(pipeline, graph: Graph, sample, blocks, deterministic: set[str]) -> None:
    """A group's row must not depend on the other rows in the batch (cascades split batches)."""
    rows = n_rows(sample)
    if rows < 2:
        return
    half = np.arange(0, rows, 2)
    subset_blocks, _ = pipeline.compute(take(sample, half), graph.groups)
    bad = [
        g
        for g in graph.groups
        if g in deterministic and not _close(subset_blocks[g], blocks[g][half], graph.tolerance_of(g))
    ]
    if bad:
        raise PipelineError(
            f"feature group(s) {bad} give a row different values depending on the other rows in "
            "the batch (for example by fitting on the batch); fit such steps beforehand so that "
            "each row's features depend on that row alone"
        )


#: threads used to check that a body's groups can run concurrently
CHECK_WORKERS = 2


def _check_concurrent(pipeline, graph: Graph, sample, blocks, deterministic: set[str]) -> bool:
    """True when the body gives the same blocks with its top-level calls in a thread pool."""
    from ._concurrent import ConcurrentUseError

    if len(graph.depth0) < 2:
        return False
    graph.concurrent = True
    rows = n_rows(sample)
    try:
        result = pipeline.execute(sample, workers=CHECK_WORKERS)
        same = all(_close(to_block(result.outputs[graph.position[g]], rows, g), blocks[g], graph.tolerance_of(g))
                   for g in graph.groups if g in deterministic)
    except ConcurrentUseError as exc:
        graph.notes.append(f"groups run one after another: {exc}")
        return False
    except Exception as exc:  # the body is not safe to run this way
        graph.notes.append(f"groups run one after another: running them concurrently failed ({exc})")
        return False
    if not same:
        graph.notes.append("groups run one after another: running them concurrently changed their values")
    return same


def _check_cacheable(pipeline, graph: Graph, sample, blocks, deterministic: set[str], functions) -> list[str]:
    """Groups declared with a row cache that may use it: dense, deterministic, with every input
    column they were seen to read in their key, and serving the sample from a cold and then a
    warm cache with the values computed without it."""
    declared = [g for g in graph.groups if getattr(functions.get(g), "cache", None) is not None]
    ok = []
    for g in declared:
        if g not in deterministic or graph.sparse[g] or list(graph.columns.get(g, [])) == ["<input>"]:
            graph.notes.append(f"group '{g}' declares a row cache but is not a dense, deterministic "
                               "group of input columns: it is not cached")
            continue
        key = functions[g].cache_key
        unkeyed = sorted(set(graph.columns.get(g, [])) - {str(c) for c in key}) if key is not None else []
        if unkeyed:
            graph.notes.append(f"group '{g}' reads column(s) {unkeyed} that are not in its cache_key "
                               f"{key}: it is not cached")
            continue
        ok.append(g)
    if not ok:
        return []
    graph.cacheable = ok
    rows = n_rows(sample)
    half = take(sample, np.arange(0, rows, 2))
    try:
        for part in (half, sample, sample):  # cold, partly warm, warm
            result, _ = pipeline.compute(part, ok, cache=True)
        same = [g for g in ok if _close(result[g], blocks[g], graph.tolerance_of(g))]
    except Exception as exc:  # e.g. a cache_key naming no column, unhashable cells
        graph.notes.append(f"row caches are off: serving the sample through them failed ({exc})")
        return []
    finally:
        for g in ok:
            functions[g].cache.clear()
    for g in set(ok) - set(same):
        graph.notes.append(f"group '{g}' gave other values from its row cache: it is not cached")
    return same


def _columns_read(pipeline, graph: Graph, sample, blocks, deterministic: set[str]) -> dict:
    """Input columns each group reads, found by shifting one column at a time."""
    columns: dict[str, list[str]] = {g: [] for g in graph.groups}
    if not isinstance(sample, pd.DataFrame) or len(sample) < 2:
        return {g: list(graph.input_columns) for g in graph.groups}
    rows = len(sample)
    for col in sample.columns:
        values = sample[col].to_numpy()
        shifted = np.roll(values, 1)
        if _same_values(values, shifted):
            # constant in the sample: shifting cannot tell, so drop it and see who fails
            for g in _groups_failing_without(pipeline, graph, sample.drop(columns=[col]), blocks):
                columns[g].append(str(col))
            continue
        perturbed = sample.copy()
        perturbed[col] = pd.Series(shifted, index=sample.index, dtype=sample[col].dtype)
        try:
            res = pipeline.execute(perturbed)
            changed = [
                g
                for g in graph.groups
                if not _close(to_block(res.outputs[graph.position[g]], rows, g), blocks[g], graph.tolerance_of(g))
            ]
        except Exception:
            changed = list(graph.groups)
        for g in changed:
            if g in deterministic:
                columns[g].append(str(col))
    return columns


def _groups_failing_without(pipeline, graph: Graph, reduced: pd.DataFrame, blocks) -> list[str]:
    """Groups that raise or change when computed alone on rows lacking a column."""
    failing = []
    rows = len(reduced)
    for g in graph.groups:
        try:
            res = pipeline.execute(reduced, needed=graph.needed_nodes([g]))
            if not _close(to_block(res.outputs[graph.position[g]], rows, g), blocks[g], graph.tolerance_of(g)):
                failing.append(g)
        except Exception:  # any failure means the group needs the column
            failing.append(g)
    return failing


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        return bool(pd.Series(a).equals(pd.Series(b)))
    except Exception:
        return False
