"""Capture: the @feature and @pipeline decorators and the run context behind them.

A pipeline body is ordinary Python that calls feature functions and returns the
list of their outputs. Willump re-runs that body under a *run context* which
 - memoizes feature calls within one run, so work shared by two groups runs once;
 - times every feature call (exclusive of nested feature calls), for profiling;
 - skips top-level feature calls that the requested groups do not need, which is
   how a cascade computes only the cheap groups first;
 - records who called whom and whose output fed whom, which is the graph.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ._blocks import Block, to_block
from ._concurrent import Pending, pool, resolved
from ._rowcache import RowCache, row_keys
from ._rows import n_rows, take
from .errors import PipelineError, WillumpError

if TYPE_CHECKING:
    from ._graph import Graph

_ACTIVE_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "willump_active_run", default=None
)

BODY = "<body>"  # pseudo-node: the pipeline body's own work outside feature calls

#: feature groups with a row cache, so that refitting feature state can clear them
_CACHED_GROUPS: weakref.WeakSet = weakref.WeakSet()


class Skipped:
    """Stand-in for a feature output a run did not compute; any use raises."""

    __slots__ = ("node",)

    def __init__(self, node: str):
        object.__setattr__(self, "node", node)

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise SkippedUseError(self.node)

    __getattr__ = _fail
    __getitem__ = _fail
    __iter__ = _fail
    __len__ = _fail
    __array__ = _fail
    __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = _fail

    def __setattr__(self, *_: Any) -> None:
        raise SkippedUseError(self.node)

    def __repr__(self) -> str:
        return f"<skipped feature output {self.node!r}>"


class SkippedUseError(PipelineError):
    """Raised when code uses the output of a feature call the run skipped."""

    def __init__(self, node: str):
        super().__init__(
            f"the output of feature '{node}' was used although this run skipped it; "
            "willump could not see that dependency"
        )
        self.node = node


class FeatureError(PipelineError):
    """A feature group's own code raised: names the group; the original is the ``__cause__``."""

    def __init__(self, group: str, error: BaseException):
        super().__init__(f"feature group '{group}' raised {type(error).__name__}: {error}")
        self.group = group
        self.error = error


class _FunctionRef:
    """A module-level function pickled by name when the module's attribute of that name is
    willump's wrapper of it (``@willump.feature`` / ``@willump.pipeline`` shadow the function,
    so pickle's own lookup by name finds the wrapper and refuses)."""

    def __init__(self, module: str, qualname: str):
        self.module, self.qualname = module, qualname

    def resolve(self) -> Any:
        import importlib

        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return getattr(obj, "fn", obj)


def _pickle_function(fn: Any) -> Any:
    """``fn``, or a by-name stand-in when pickle could not look it up by name itself (see
    _FunctionRef). Modules cloudpickle stores by value (artifacts) and ``__main__`` keep ``fn``."""
    import cloudpickle

    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module_name or module_name == "__main__" or "<locals>" in qualname \
            or module_name in cloudpickle.list_registry_pickle_by_value():
        return fn
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn and getattr(obj, "fn", None) is fn:
        return _FunctionRef(module_name, qualname)
    return fn


def _unpickle_function(value: Any) -> Any:
    return value.resolve() if isinstance(value, _FunctionRef) else value


class _FitState:
    """Version of the feature state a fit hook fitted. Copies of a pipeline share it: the hook
    fits state outside the pipeline object (globals, closures), so a refit through one copy
    changes what every copy computes."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = 0


@dataclass
class _Frame:
    key: str
    child_seconds: float = 0.0


@dataclass
class _Run:
    """State of one execution of a pipeline body."""

    needed: frozenset[str] | None  # nodes to compute when called from the body; None = all
    #: call-site path -> node key, learned when the graph was captured (None while capturing)
    known_sites: dict[str, str] | None = None
    graph: Graph | None = None
    rows: Any = None  # the body's input rows (row caches key on them)
    workers: int = 1  # > 1: top-level calls run in a thread pool
    use_cache: bool = False  # row caches of lookup-style groups (the optimized serving path)
    pending: list[Pending] = field(default_factory=list)
    local: threading.local = field(default_factory=threading.local)  # per-thread call stack
    memo: dict[Any, tuple[str, Any]] = field(default_factory=dict)
    #: arguments of every computed call, kept alive for the run: the memo keys data by buffer
    #: address and id(), which a freed temporary could hand to the next temporary
    keepalive: list[Any] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    site_counts: Counter = field(default_factory=Counter)
    sites: dict[str, str] = field(default_factory=dict)  # call-site path -> node key, this run
    exclusive: defaultdict = field(default_factory=lambda: defaultdict(float))
    order: list[str] = field(default_factory=list)  # node keys in first-call order
    depth0: set[str] = field(default_factory=set)  # nodes called directly by the body
    parents: defaultdict = field(default_factory=lambda: defaultdict(set))  # node -> upstream
    output_owner: dict[int, str] = field(default_factory=dict)  # id(output) -> node key
    functions: dict[str, FeatureGroup] = field(default_factory=dict)  # node key -> feature

    @property
    def stack(self) -> list[_Frame]:
        """The feature calls open in this thread (a worker thread starts with its own)."""
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def note_dependency(self, upstream: str) -> None:
        if self.stack:
            self.parents[self.stack[-1].key].add(upstream)


class FeatureGroup:
    """A feature function: input rows (or something derived from them) -> 2-D features.

    Outside a pipeline run it is the plain function. Inside a run it is memoized,
    timed, and skippable.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None, cache: int | None = None,
                 cache_ttl: float | None = None, tolerance: tuple[float, float] | None = None,
                 cache_key: Sequence[Any] | None = None):
        if not callable(fn):
            raise TypeError(f"@willump.feature needs a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        if cache is None and (cache_ttl is not None or cache_key is not None):
            raise ValueError("cache_ttl and cache_key need cache= (the number of rows to keep)")
        if cache_key is not None and (isinstance(cache_key, (str, bytes)) or not len(cache_key)):
            raise ValueError(f"cache_key must be a non-empty list of input columns, got {cache_key!r}")
        self.cache_key = None if cache_key is None else list(cache_key)
        self.cache = None if cache is None else RowCache(cache, cache_ttl)
        if tolerance is not None and not (len(tolerance) == 2 and all(t >= 0 for t in tolerance)):
            raise ValueError(f"tolerance must be (rtol, atol), both >= 0; got {tolerance!r}")
        self.tolerance = None if tolerance is None else (float(tolerance[0]), float(tolerance[1]))
        if self.cache is not None:
            _CACHED_GROUPS.add(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["fn"] = _pickle_function(self.fn)
        state.pop("__wrapped__", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["fn"] = _unpickle_function(state["fn"])
        state["__wrapped__"] = state["fn"]
        self.__dict__.update(state)
        if self.cache is not None:
            _CACHED_GROUPS.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = _ACTIVE_RUN.get()
        if run is None:
            return self.fn(*args, **kwargs)
        dispatch = run.workers > 1 and not run.stack
        if dispatch:  # inputs computed by other groups' threads: wait for them here
            args = tuple(resolved(a) for a in args)
            kwargs = {k: resolved(v) for k, v in kwargs.items()}
        path = self._site_path(run, sys._getframe(1))
        fingerprint = (id(self), _fingerprint(args), _fingerprint(tuple(sorted(kwargs.items()))))
        hit = run.memo.get(fingerprint)
        if hit is not None:
            run.sites.setdefault(path, hit[0])
        if hit is not None and not (run.stack and isinstance(hit[1], Skipped)):
            key, out = hit
            run.note_dependency(key)
            if run.stack and isinstance(out, Pending):  # inside a group: wait for the other thread
                out = out.result()
            return out
        if hit is not None:  # skipped at the top level, but a computed group needs it now
            key = hit[0]
        else:
            key = self._node_key(run, path)
            run.sites[path] = key
            if not run.stack:
                run.depth0.add(key)
            run.order.append(key)
            run.functions[key] = self
        run.keepalive.append((args, kwargs))
        if not run.stack and run.needed is not None and key not in run.needed:
            out = Skipped(key)
            run.memo[fingerprint] = (key, out)
            return out
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, Skipped):
                raise SkippedUseError(arg.node)
            owner = run.output_owner.get(id(arg))
            if owner is not None:
                run.parents[key].add(owner)
        run.note_dependency(key)
        if dispatch:
            # the stand-in is in the memo before its work starts: a worker's result (stored by
            # _compute) can never be overwritten by it, and a nested call that finds it waits
            pending = Pending(key)
            run.pending.append(pending)
            run.memo[fingerprint] = (key, pending)
            run.output_owner[id(pending)] = key
            context = contextvars.copy_context()
            pool(run.workers).submit(context.run, pending.run, self._compute, run, key, fingerprint,
                                     args, kwargs)
            return pending
        return self._compute(run, key, fingerprint, args, kwargs)

    def _compute(self, run: _Run, key: str, fingerprint: Any, args: tuple, kwargs: dict) -> Any:
        frame = _Frame(key)
        run.stack.append(frame)
        start = time.perf_counter()
        try:
            out = self._call(run, key, args, kwargs)
        except WillumpError:
            raise
        except Exception as exc:
            raise FeatureError(key, exc) from exc
        finally:
            elapsed = time.perf_counter() - start
            run.stack.pop()
            run.exclusive[key] += elapsed - frame.child_seconds
            if run.stack:
                run.stack[-1].child_seconds += elapsed
        run.memo[fingerprint] = (key, out)
        run.output_owner[id(out)] = key
        return out

    def _call(self, run: _Run, key: str, args: tuple, kwargs: dict) -> Any:
        """The function, or its row cache when this run may use it and capture allowed it."""
        graph = run.graph
        if (self.cache is None or not run.use_cache or graph is None or kwargs or len(args) != 1
                or args[0] is not run.rows or key not in getattr(graph, "cacheable", ())):
            return self.fn(*args, **kwargs)
        rows = args[0]
        generation = self.cache.generation
        columns = self.cache_key if self.cache_key is not None else list(rows.columns)
        keys = row_keys(rows, columns)
        hit, hit_rows = self.cache.lookup(keys)
        if hit.all():
            self.cache.record(len(keys), 0)
            return hit_rows if hit_rows is not None else np.zeros((0, graph.widths[key]))
        first: dict[Any, int] = {}  # each missing key is computed once, on its first row
        missing = np.flatnonzero(~hit)
        for i in missing:
            first.setdefault(keys[i], int(i))
        distinct = np.fromiter(first.values(), dtype=np.intp, count=len(first))
        computed = to_block(self.fn(take(rows, distinct)), len(distinct), key)
        if not isinstance(computed, np.ndarray):  # capture saw dense output; be safe anyway
            return self.fn(*args, **kwargs)
        computed = computed.astype(np.float64, copy=False)  # one dtype whatever the batch gave
        self.cache.store(list(first), computed, generation)
        self.cache.record(len(keys), len(distinct))
        if len(distinct) == len(keys):
            return computed
        slot = {k: j for j, k in enumerate(first)}
        out = np.empty((len(keys), computed.shape[1]), dtype=computed.dtype)
        out[missing] = computed[[slot[keys[i]] for i in missing]]
        if hit_rows is not None:
            out[hit] = hit_rows
        return out

    def _site_path(self, run: _Run, caller: Any) -> str:
        """Where this call comes from: the calling node (or the body), the source line, the
        feature, and its occurrence there. Stable across runs whichever groups are skipped,
        so a node keeps its key when an earlier group's nested calls do not happen."""
        parent = run.stack[-1].key if run.stack else ""
        code = caller.f_code  # the line relative to the function: the same after pickling by value
        base = f"{parent}>{self.name}@{code.co_name}+{caller.f_lineno - code.co_firstlineno}"
        run.site_counts[base] += 1
        return f"{base}#{run.site_counts[base]}"

    def _node_key(self, run: _Run, path: str) -> str:
        """The key of a newly computed node: the one the capture gave this call site, else
        the feature's name, numbered when the name is taken."""
        if run.known_sites is not None and path in run.known_sites:
            return run.known_sites[path]
        taken = set(run.functions) | set((run.known_sites or {}).values())
        run.calls[self.name] += 1
        key = self.name if run.calls[self.name] == 1 else f"{self.name}#{run.calls[self.name]}"
        while key in taken:
            run.calls[self.name] += 1
            key = f"{self.name}#{run.calls[self.name]}"
        return key

    def __repr__(self) -> str:
        return f"<willump.feature {self.name}>"


def feature(fn: Callable[..., Any] | None = None, *, name: str | None = None,
            cache: int | None = None, cache_ttl: float | None = None,
            cache_key: Sequence[Any] | None = None,
            tolerance: tuple[float, float] | None = None) -> Any:
    """Mark a function as a feature group: rows -> 2-D array, sparse matrix or DataFrame.

    Usable bare (``@willump.feature``) or with options (``@willump.feature(name="w")``).
    ``cache=N`` keeps up to N output rows of a lookup-style group (see ``willump._rowcache``),
    keyed by the row's values in ``cache_key`` (default: every input column; name the lookup's
    key columns, which must hold everything the output depends on), ``cache_ttl`` seconds each
    at most.
    ``tolerance=(rtol, atol)``: how much the group's values may differ between runs (or with
    the batch they run in) and still count as equal in capture's checks (float32 work).
    """
    options = dict(name=name, cache=cache, cache_ttl=cache_ttl, cache_key=cache_key, tolerance=tolerance)
    if fn is None:
        return lambda f: FeatureGroup(f, **options)
    return FeatureGroup(fn, **options)


def _fingerprint(value: Any) -> Any:
    """A hashable key that is equal for the same data within one run.

    Same object -> same key. A pandas Series taken twice from one frame
    (``df["text"]``) shares memory and index, so it gets the same key too.
    Anything unrecognised is keyed by identity, which is always safe.
    """
    if isinstance(value, Skipped):
        return ("skipped", value.node)
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, tuple):
        return ("tuple", *(_fingerprint(v) for v in value))
    if isinstance(value, np.ndarray):
        iface = value.__array_interface__
        return ("nd", iface["data"][0], value.shape, value.strides, value.dtype.str)
    if isinstance(value, pd.Series):
        pointer = _pandas_pointer(value)
        index = _index_key(value.index)
        if pointer is not None and index is not None:
            return ("series", pointer, len(value), str(value.dtype), value.name, index)
    return ("id", id(value))


def _pandas_pointer(obj: pd.Series | pd.Index) -> int | None:
    """Address of the memory behind a Series or Index, when it is one numpy buffer."""
    backing = getattr(obj.array, "_ndarray", None)
    if isinstance(backing, np.ndarray):
        return int(backing.__array_interface__["data"][0])
    if isinstance(obj.dtype, np.dtype) and obj.dtype != object:
        values = obj.to_numpy(copy=False)
        return int(values.__array_interface__["data"][0])
    return None


def _index_key(index: pd.Index) -> Any:
    if isinstance(index, pd.RangeIndex):
        return ("range", index.start, index.stop, index.step)
    pointer = _pandas_pointer(index)
    return None if pointer is None else ("index", pointer, len(index), str(index.dtype))


@dataclass
class RunResult:
    """What one run of a pipeline body produced."""

    outputs: list[Any]
    node_seconds: dict[str, float]
    body_seconds: float
    run: _Run


class Pipeline:
    """A decorated pipeline: rows -> list of feature-group outputs, in model order.

    Calling it returns that list, as the undecorated function would (with shared
    feature work computed once). The optimizer uses :meth:`compute` to run only
    some groups and :meth:`capture` to learn the graph.
    """

    model: Any = None  # a default model, set by from_sklearn

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None,
                 fit: Callable[[Any, Any], Any] | None = None):
        if not callable(fn):
            raise TypeError(f"@willump.pipeline needs a function, got {type(fn).__name__}")
        if fit is not None and not callable(fit):
            raise TypeError(f"fit must be a function (X, y) -> None, got {type(fit).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "pipeline")
        self.fit_fn = fit
        self._fit_state = _FitState()
        self._graph_version = 0
        self.graph_: Graph | None = None
        self.code_modules: set[str] = set()  # modules defining its feature code (for artifacts)

    def __call__(self, rows: Any) -> list[Any]:
        return self.execute(rows).outputs

    @property
    def state_version(self) -> tuple[int, int]:
        """Changes when feature state is refitted (through this pipeline or a copy sharing its
        fit hook) or the graph recaptured differently: an optimized pipeline built on one version
        refuses to serve another (its certificate was for that one)."""
        return (self._fit_state.version, self._graph_version)

    def detached(self) -> Pipeline:
        """A copy that ``willump.optimize`` fits and captures, so the caller's object is left as
        it was. Feature state fitted by a hook lives outside the object and stays shared (so is
        its version: a refit through either copy is seen by both)."""
        other = object.__new__(type(self))  # not copy.copy: pickling state drops the fit hook
        other.__dict__.update(self.__dict__)
        other.code_modules = set(self.code_modules)
        if hasattr(self, "features_"):
            other.features_ = dict(self.features_)
        return other

    def fit(self, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """Register the pipeline's fit hook (a decorator)::

            @willump.pipeline
            def flights(df): ...

            @flights.fit
            def fit_tables(X, y):   # build vocabularies, lookup tables, ... from X, y only
                ...

        ``willump.optimize`` calls it with its own train split, never with the rows that
        choose or certify the plan, so feature state cannot leak their labels.
        """
        if not callable(fn):
            raise TypeError(f"fit must be a function (X, y) -> None, got {type(fn).__name__}")
        self.fit_fn = fn
        return fn

    @property
    def has_feature_state(self) -> bool | None:
        """True when feature state is fitted through willump (a fit hook), None when
        willump cannot tell (a decorated pipeline without one)."""
        return True if self.fit_fn is not None else None

    def fit_features(self, X: Any, y: Any) -> None:
        """Fit feature state on training rows: calls the fit hook, if any. Row caches are
        cleared: rows computed from the old state must not be served."""
        clear_row_caches()
        if self.fit_fn is not None:
            self._fit_state.version += 1
            self.fit_fn(X, y)

    def __getstate__(self) -> dict[str, Any]:
        # a pickled pipeline (an artifact) carries its fitted state, not the hook that fitted
        # it: the hook may close over training data (labels, outcomes) that must not ship
        state = self.__dict__.copy()
        state["fit_fn"] = None
        state["fn"] = _pickle_function(self.fn)
        state.pop("__wrapped__", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["fn"] = _unpickle_function(state["fn"])
        state["__wrapped__"] = state["fn"]
        self.__dict__.update(state)

    def execute(self, rows: Any, needed: Iterable[str] | None = None, *, workers: int = 1,
                cache: bool = False) -> RunResult:
        """Run the body once; calls from the body to nodes outside ``needed`` are skipped.

        ``workers > 1`` runs the body's top-level feature calls in a thread pool (when capture
        found the body allows it); ``cache`` lets lookup-style groups use their row caches."""
        graph = self.graph_
        concurrent = workers > 1 and graph is not None and getattr(graph, "concurrent", False)
        run = _Run(needed=None if needed is None else frozenset(needed),
                   known_sites=None if graph is None else getattr(graph, "sites", None),
                   graph=graph, rows=rows, workers=workers if concurrent or graph is None else 1,
                   use_cache=cache)
        token = _ACTIVE_RUN.set(run)
        start = time.perf_counter()
        try:
            outputs = self.fn(rows)
            if run.pending:
                outputs = resolved(outputs)
        finally:
            for pending in run.pending:  # no work outlives the run, whatever the body did
                pending.wait()
            total = time.perf_counter() - start
            _ACTIVE_RUN.reset(token)
        for pending in run.pending:
            pending.result()  # a worker's error is the run's error
        if outputs is None:
            raise PipelineError(
                f"pipeline '{self.name}' returned None; it must return the list of "
                "feature-group outputs the model consumes"
            )
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        if len(outputs) == 0:
            raise PipelineError(f"pipeline '{self.name}' returned an empty list of feature groups")
        node_seconds = dict(run.exclusive)
        body = max(total - sum(node_seconds.values()), 0.0)
        return RunResult(list(outputs), node_seconds, body, run)

    # --- graph -----------------------------------------------------------------------
    def capture(self, sample: Any) -> Graph:
        """Learn the graph from a sample of rows; validates every group's output."""
        from ._graph import capture_graph

        previous = self.graph_
        self.graph_ = capture_graph(self, sample)
        if previous is not None and _shape(previous) != _shape(self.graph_):
            self._graph_version += 1  # nodes mean other things now
        return self.graph_

    def graph_features(self) -> dict[str, FeatureGroup]:
        """The feature group behind each node of the captured graph."""
        self.graph  # noqa: B018 - raises a clear error before capture
        return dict(getattr(self, "features_", {}))

    @property
    def graph(self) -> Graph:
        if self.graph_ is None:
            raise PipelineError(
                f"pipeline '{self.name}' has not been captured yet; call willump.optimize "
                "or pipeline.capture(sample_rows) first"
            )
        return self.graph_

    def compute(self, rows: Any, groups: Iterable[str], *, workers: int = 1,
                cache: bool = False) -> tuple[dict[str, Block], RunResult]:
        """Blocks of the named groups for ``rows``, computing only what they need."""
        graph = self.graph
        groups = list(groups)
        result = self.execute(rows, needed=graph.needed_nodes(groups), workers=workers, cache=cache)
        expected = n_rows(rows)
        blocks = {
            g: to_block(result.outputs[graph.position[g]], expected, g) for g in groups
        }
        return blocks, result

    def __repr__(self) -> str:
        return f"<willump.pipeline {self.name}>"


def _shape(graph: Graph) -> tuple:
    """What a graph's node keys mean: a recapture that changes it changes what runs."""
    return (tuple(graph.groups), tuple(graph.nodes), tuple(sorted(getattr(graph, "sites", {}).items())),
            tuple(sorted((k, tuple(sorted(v))) for k, v in graph.upstream.items())), graph.conservative)


def clear_row_caches() -> None:
    """Empty every feature group's row cache in this process."""
    for group in list(_CACHED_GROUPS):
        if group.cache is not None:
            group.cache.clear()


def pipeline(fn: Callable[[Any], Any] | None = None, *, name: str | None = None,
             fit: Callable[[Any, Any], Any] | None = None) -> Any:
    """Mark a function returning the list of feature-group outputs the model consumes.

    ``fit(X, y)``, if given (or registered later with ``@my_pipeline.fit``), fits the
    feature state (vocabularies, lookup tables) on the rows willump trains on.
    """
    if fn is None:
        return lambda f: Pipeline(f, name=name, fit=fit)
    return Pipeline(fn, name=name, fit=fit)

