"""Layer profiles as plain data, and the profiler that measures them.

A :class:`Profile` is what the planner reads (PipeDream's optimizer style: data in, plan
out): per block and batch size the compute time, per cut the bytes crossing it, per
block the parameter bytes and an activation workspace, and the transport's cost per hop.
It round-trips through JSON (:func:`save_profile`, :func:`load_profile`), so a profile
taken on one machine (a GPU node) can be planned on another.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx
from torch.utils import _pytree as pytree

from .capture import Graph
from .device import as_device, on_device
from .split import split

#: batch sizes profiled when none are given
DEFAULT_BATCH_SIZES = (1, 4, 16, 64)
#: timed repetitions per block and batch size (the median is kept)
DEFAULT_REPEATS = 7
#: untimed runs before timing (allocator, caches, lazy init)
DEFAULT_WARMUP = 2


@dataclass
class Transport:
    """Cost of one hop between stages: ``fixed_ms + bytes / bytes_per_s`` (seconds -> ms)."""

    fixed_ms: float = 0.0
    bytes_per_s: float = float("inf")
    #: how it was obtained: "serve-handle" (calibrated through Serve), "pipedream", "none", ...
    source: str = "none"
    #: the calibration points (payload bytes, median ms) the line was fitted to
    points: list[list[float]] = field(default_factory=list)

    def hop_ms(self, nbytes: float) -> float:
        if nbytes <= 0 and self.fixed_ms == 0:
            return 0.0
        per_byte = 0.0 if self.bytes_per_s == float("inf") else 1000.0 / self.bytes_per_s
        return self.fixed_ms + nbytes * per_byte

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["bytes_per_s"] == float("inf"):
            d["bytes_per_s"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Transport:
        d = dict(d)
        if d.get("bytes_per_s") is None:
            d["bytes_per_s"] = float("inf")
        return cls(**d)


@dataclass
class Profile:
    """Per-block measurements of one model on one kind of device.

    ``compute_ms[k][j]`` is block ``k``'s time at ``batch_sizes[j]``; ``cut_bytes[c][j]``
    the bytes crossing cut ``c`` (before block ``c``: ``cut_bytes[0]`` is the input,
    ``cut_bytes[n]`` the output); ``workspace_bytes[k][j]`` the activation memory block
    ``k`` needs while it runs; ``param_bytes[k]`` its weights.
    """

    name: str
    device: str
    batch_sizes: list[int]
    block_names: list[str]
    compute_ms: list[list[float]]
    cut_bytes: list[list[float]]
    param_bytes: list[float]
    workspace_bytes: list[list[float]]
    transport: Transport = field(default_factory=Transport)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, b = len(self.block_names), len(self.batch_sizes)
        if n == 0 or b == 0:
            raise ValueError("a profile needs at least one block and one batch size")
        if sorted(self.batch_sizes) != list(self.batch_sizes) or len(set(self.batch_sizes)) != b:
            raise ValueError(f"batch_sizes must be increasing, got {self.batch_sizes}")
        shapes = {"compute_ms": (self.compute_ms, n), "cut_bytes": (self.cut_bytes, n + 1),
                  "workspace_bytes": (self.workspace_bytes, n)}
        for key, (rows, want) in shapes.items():
            if len(rows) != want or any(len(r) != b for r in rows):
                raise ValueError(f"{key} must be {want} rows of {b} values")
        if len(self.param_bytes) != n:
            raise ValueError(f"param_bytes must have {n} values")

    def __len__(self) -> int:
        return len(self.block_names)

    # --- arrays the planner works on (prefix sums over blocks) ----------------------------
    def batch_index(self, batch_size: int) -> int:
        if batch_size not in self.batch_sizes:
            raise ValueError(f"batch size {batch_size} was not profiled; profiled: {self.batch_sizes}")
        return self.batch_sizes.index(batch_size)

    def compute(self, batch_size: int) -> np.ndarray:
        return np.asarray(self.compute_ms, dtype=float)[:, self.batch_index(batch_size)]

    def cuts(self, batch_size: int) -> np.ndarray:
        return np.asarray(self.cut_bytes, dtype=float)[:, self.batch_index(batch_size)]

    def workspace(self, batch_size: int) -> np.ndarray:
        return np.asarray(self.workspace_bytes, dtype=float)[:, self.batch_index(batch_size)]

    def params(self) -> np.ndarray:
        return np.asarray(self.param_bytes, dtype=float)

    @property
    def model_bytes(self) -> float:
        return float(sum(self.param_bytes))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["transport"] = self.transport.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        d = dict(d)
        d["transport"] = Transport.from_dict(d.get("transport") or {})
        return cls(**d)

    def with_transport(self, transport: Transport) -> Profile:
        return Profile.from_dict({**self.to_dict(), "transport": transport.to_dict()})


def save_profile(profile: Profile, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1))


def load_profile(path: str | os.PathLike) -> Profile:
    return Profile.from_dict(json.loads(Path(path).read_text()))


#: format tag of a model file written by :func:`save_model`
MODEL_FORMAT = "willump-torch-model"


def save_model(module: torch.nn.Module, example: Any, path: str | os.PathLike) -> None:
    """A torch module and its example input in one file, for ``willump plan`` / ``willump
    serve`` (pickled with torch.save: load only files you trust)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    torch.save({"format": MODEL_FORMAT, "version": 1, "module": module, "example": example}, Path(path))


def load_model(path: str | os.PathLike) -> tuple[torch.nn.Module, Any]:
    """``(module, example)`` from a file written by :func:`save_model`."""
    try:
        d = torch.load(Path(path), weights_only=False, map_location="cpu")
    except Exception as exc:
        raise ValueError(f"{path} is not a model file written by serving.partition.save_model: {exc}") from exc
    if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path} is not a model file written by serving.partition.save_model")
    return d["module"], d["example"]


def nbytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) value; Python scalars count 8."""
    total = 0
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
        elif isinstance(leaf, (int, float, bool)):
            total += 8
    return total


def batch_of(example: tuple, batch_size: int) -> tuple:
    """The example's rows repeated (or cut) to ``batch_size`` along dimension 0."""
    out = []
    for a in example:
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            out.append(a)
            continue
        reps = -(-batch_size // a.shape[0])
        out.append(a.repeat(reps, *([1] * (a.dim() - 1)))[:batch_size].contiguous())
    return tuple(out)


def _param_bytes(module: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


class _Clock:
    """Marks along one run of the model: CUDA events on a GPU (the GPU's own timeline,
    nothing synchronized between blocks, so kernel launches overlap as they do when a stage
    runs its blocks back to back), ``perf_counter`` on the CPU. Events are made before a
    run (``reset``), so that a mark costs one record call."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events: list[Any] = []
        self._next = 0

    def reset(self, marks: int) -> None:
        if self.cuda:
            while len(self._events) < marks:
                self._events.append(torch.cuda.Event(enable_timing=True))
        self._next = 0

    def mark(self) -> Any:
        if self.cuda:
            if self._next >= len(self._events):
                self._events.append(torch.cuda.Event(enable_timing=True))
            event = self._events[self._next]
            self._next += 1
            event.record()
            return event
        return time.perf_counter()

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1000.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def isolated(self, block: torch.nn.Module, args: tuple) -> tuple[Any, int]:
        """One run of ``block`` alone: its output and, on a GPU, the peak memory it allocated."""
        if not self.cuda:
            return block(*args), 0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = block(*args)
        torch.cuda.synchronize()
        return out, int(torch.cuda.max_memory_allocated() - base)


#: the marks a fused run records (profiling is single-threaded; see :func:`_fused_with_marks`)
_MARKS: list[Any] = []
_MARK_CLOCK: list[_Clock] = []


def _mark(_k: int) -> None:
    _MARKS.append(_MARK_CLOCK[-1].mark())


def _fused_with_marks(graph: Graph) -> fx.GraphModule:
    """The whole traced graph as one module with a clock mark before each block and after
    the last: blocks timed as they run inside a fused stage (one Python call, launches back
    to back), without the per-block call and tuple overhead that timing blocks as separate
    modules adds (MiniLM on an H200 at batch 32: 91 separate blocks summed to 3.2x the
    module's own time; a GPU model this small is bound by launches, not by kernels)."""
    assert graph.gm is not None
    first_of = {graph.nodes[min(b.nodes)]: k for k, b in enumerate(graph.blocks)}
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in graph.gm.graph.nodes:
        if node in first_of:
            g.call_function(_mark, (first_of[node],))
        if node.op == "output":
            g.call_function(_mark, (len(graph.blocks),))
        env[node] = g.node_copy(node, lambda a: env[a])
    return fx.GraphModule(graph.gm, g)


def _to(value: Any, device: torch.device) -> Any:
    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def profile(
    graph: Graph,
    batch_sizes: tuple[int, ...] | list[int] = DEFAULT_BATCH_SIZES,
    device: str = "cpu",
    *,
    threads: int | None = 1,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    transport: Transport | None = None,
    name: str | None = None,
) -> Profile:
    """Time every block at every batch size on ``device`` (median of ``repeats``).

    Blocks are timed *inside* runs of the whole model (a clock mark between consecutive
    blocks of one fused module, :func:`_fused_with_marks`), not one by one: timed alone,
    each of a GPU model's ~100 small blocks paid its own launch, synchronization and Python
    call, and their sum overstated a stage's time 1.7-3.2x (MiniLM on an H200, batch 32).
    The marks' own cost is taken out and the blocks scaled to add up to an unmarked run;
    a stage's predicted time is the sum of its blocks' times (on the H200 within 3% for a
    74-block stage, a third over for a 17-block one).

    CPU: under ``torch.inference_mode`` with ``threads`` intra-op threads (1 by default:
    one stage replica per core is the unit the planner places), after ``warmup`` runs.
    CUDA: CUDA events and the peak memory allocated while the block runs (the workspace),
    on a copy of the graph moved there (:func:`serving.partition.device.to_device`: the
    caller's module stays where it is). On CPU the workspace is estimated
    as the bytes in + out of the block. ``transport`` (e.g. from
    :func:`serving.calibrate_transport`) is stored with the profile.
    """
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive ints, got {batch_sizes!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    dev = as_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no GPU here")
    # a copy on the device (device constants rewritten, the caller's module left where it is)
    graph = on_device(graph, dev, check=False)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    clock = _Clock(dev)
    blocks = split(graph, list(range(1, len(graph))))
    n = len(blocks)
    compute = [[0.0] * len(sizes) for _ in range(n)]
    cut_bytes = [[0.0] * len(sizes) for _ in range(n + 1)]
    work = [[0.0] * len(sizes) for _ in range(n)]

    fused = _fused_with_marks(graph) if graph.kind != "sequential" else None

    def chain(args: tuple) -> list[Any]:
        """One run of every block in order; the clock's marks before, between and after.
        A traced graph runs fused (marks inside one module); an nn.Sequential's children run
        one after the other, as its stages run them."""
        clock.reset(n + 1)
        if fused is not None:
            _MARKS.clear()
            _MARK_CLOCK.append(clock)
            try:
                fused(*args)
            finally:
                _MARK_CLOCK.pop()
            return list(_MARKS)
        marks = [clock.mark()]
        x: Any = args
        for block in blocks:  # every block but the last returns a tuple (the next one's args)
            x = block(*x)
            marks.append(clock.mark())
        return marks

    def unmarked_ms(args: tuple) -> float:
        """The whole model once with no marks inside: what the marks themselves cost is the
        difference (a mark is a Python call and, on a GPU, an event record: ~30 us against a
        launch-bound block of ~20 us). Traced graphs only (a Sequential's blocks are unmarked)."""
        clock.reset(2)
        clock.sync()
        start = clock.mark()
        graph.gm(*args)
        end = clock.mark()
        clock.sync()
        return clock.elapsed_ms(start, end)

    try:
        with torch.inference_mode():
            for j, b in enumerate(sizes):
                args: Any = _to(batch_of(graph.example, b), dev)
                cut_bytes[0][j] = nbytes(args)
                for _ in range(warmup):
                    chain(args)
                # each block alone once: the bytes crossing each cut and (GPU) its workspace
                x = args
                for k, block in enumerate(blocks):
                    out, peak = clock.isolated(block, x)
                    cut_bytes[k + 1][j] = nbytes(out)
                    work[k][j] = peak if clock.cuda else cut_bytes[k][j] + cut_bytes[k + 1][j]
                    x = out
                # times: each block inside runs of the whole chain (median over the runs)
                samples: list[list[float]] = [[] for _ in range(n)]
                for _ in range(repeats):
                    clock.sync()
                    marks = chain(args)
                    clock.sync()
                    for k in range(n):
                        samples[k].append(clock.elapsed_ms(marks[k], marks[k + 1]))
                medians = [statistics.median(samples[k]) for k in range(n)]
                if fused is not None:
                    # the marks' own cost, spread evenly over the blocks (never below a tenth of
                    # a block), then the blocks scaled so that they add up to the unmarked run
                    plain = statistics.median(unmarked_ms(args) for _ in range(repeats))
                    overhead = max(0.0, (sum(medians) - plain) / n)
                    medians = [max(m - overhead, 0.1 * m) for m in medians]
                    total = sum(medians)
                    medians = [m * plain / total for m in medians] if total > 0 else medians
                for k in range(n):
                    compute[k][j] = medians[k]
    finally:
        torch.set_num_threads(old_threads)
    params = [float(_param_bytes(b)) for b in blocks]
    meta = {
        "torch": torch.__version__, "threads": threads, "repeats": repeats, "warmup": warmup, "timing": "chained",
        "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "kind": graph.kind, "taken": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if dev.type == "cuda":  # pragma: no cover
        meta["gpu"] = torch.cuda.get_device_name(dev)
    return Profile(
        name=name or type(graph.module).__name__, device=dev.type, batch_sizes=sizes,
        block_names=graph.names, compute_ms=compute, cut_bytes=cut_bytes, param_bytes=params,
        workspace_bytes=work, transport=transport or Transport(), meta=meta,
    )
