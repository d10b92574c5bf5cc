"""Labels fed back: served rows joined with the labels that arrive later, the served accuracy
with its interval per gear and segment, against the certified bound, and a label-free estimate.

Served rows wait in SQLite (one row per served row: request id, index in the request, gear,
served class, segment values) for ``retention_s`` seconds and at most ``max_rows`` rows, the
oldest dropped first. A label names a served row by request id (the ``X-Request-Id`` of its
answer) and index; it is *accepted* when that row waits unlabelled, a *duplicate* when the row
already has a label (the first label stays), and *unknown* otherwise (a wrong id or index, or a
row past the retention window). What a label teaches is added to running counts at once, so the
counts outlive the served rows they came from, and survive a restart with the file.

The served accuracy's interval is an anytime-valid confidence sequence
(:mod:`drift._confseq`): labels trickle in and the answer is read again and again. It is judged
against the certificate: certification measured the full pipeline's accuracy (``baseline_score``)
and bounded the served loss by ``max_loss``, so on traffic like the certification rows the
served accuracy is at least ``baseline_score - max_loss`` up to the certification's own sampling
error; ``below_certified`` says the served accuracy's upper bound is under that floor.

The label-free estimate is CBPE's (NannyML): the mean over every served row of the chance its
served class is right, read from the served confidence through ``calibration`` (per gear: how
often an answer of that confidence was right on the certification rows, willump's
``Gear.calibration``; the raw confidence where there is none). Its error bars count the sampling
noise of the correct/incorrect outcomes given those chances and the map's own, fitted on its
certification rows (``a(1-a)/rows``: the term that does not shrink as rows are served, and
without which a 95% interval covered the served accuracy in 20-33% of a review's simulations at
20,000-100,000 served rows). They assume an answer of a given confidence is as often right as on
the certification rows; a shift into rows where the map no longer holds (a segment the cheap
level is over-confident on) is beyond them, which is why the labelled figure sits beside it. The
interval is read at one moment, not anytime-valid as the labelled one is.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from drift._confseq import broad_prior, lower_bound, upper_bound

#: seconds a served row waits for its label (a label later than this is counted unknown)
DEFAULT_RETENTION_S = 86_400.0
#: served rows kept waiting at most (the oldest are dropped first beyond it)
DEFAULT_MAX_ROWS = 2_000_000
#: labels one call may carry
MAX_LABELS_PER_CALL = 10_000
#: seconds between two sweeps of rows past the retention window
SWEEP_EVERY_S = 30.0
#: a request id as serving accepts it (serving.runtime.ingress)
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
#: distinct values of a followed attribute counted apart; later values share ``OTHER_VALUE``
#: (the values are the clients', so without a bound every new one grew the counts for good)
DEFAULT_MAX_SEGMENT_VALUES = 1_000
OTHER_VALUE = "<other>"
#: the largest row index (SQLite's integers are 64-bit)
MAX_ROW = 2**63 - 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS served (rid TEXT NOT NULL, row INTEGER NOT NULL, ts REAL NOT NULL, gear INTEGER NOT NULL,
    served INTEGER NOT NULL, seg TEXT NOT NULL, labelled INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (rid, row))
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS served_ts ON served (ts);
CREATE TABLE IF NOT EXISTS counts (gear INTEGER NOT NULL, attribute TEXT NOT NULL, value TEXT NOT NULL,
    served INTEGER NOT NULL DEFAULT 0, conf_sum REAL NOT NULL DEFAULT 0, conf_var REAL NOT NULL DEFAULT 0,
    labelled INTEGER NOT NULL DEFAULT 0, correct INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (gear, attribute, value));
CREATE TABLE IF NOT EXISTS totals (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
#: ``repeated_rows``: served rows whose (request id, index) was already waiting: a batch sent again
#: after the monitor forgot its id, or a client that reused an X-Request-Id (whose later rows
#: cannot be labelled apart from the first's: the first kept)
_TOTALS = ("accepted", "unknown", "duplicate", "expired_rows", "repeated_rows")


class LabelJoin:
    """Served rows waiting for labels, the labels joined to them, and the accuracy they give
    (module docstring). ``path``: the SQLite file (None: in memory). ``classes``: the served
    classes in index order. ``certified``: per gear, ``{"max_loss", "baseline_score"}`` of the
    certificate (None: no comparison). ``segments``: the attributes followed."""

    def __init__(self, path: str | os.PathLike | None, classes: Sequence[Any], *, confidence: float = 0.95,
                 certified: Sequence[Mapping[str, Any]] | None = None, segments: Sequence[str] = (),
                 metric: str = "accuracy", calibration: Sequence[Mapping[str, Sequence[float]] | None] | None = None,
                 retention_s: float = DEFAULT_RETENTION_S,
                 max_rows: int = DEFAULT_MAX_ROWS, clock: Callable[[], float] = time.time,
                 max_segment_values: int = DEFAULT_MAX_SEGMENT_VALUES) -> None:
        if not classes:
            raise ValueError("classes must name the served classes")
        if not 0.5 <= confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
        if not retention_s > 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s!r}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows!r}")
        if max_segment_values < 1:
            raise ValueError(f"max_segment_values must be >= 1, got {max_segment_values!r}")
        self.max_segment_values = int(max_segment_values)
        self.classes = list(classes)
        self._index = {_key(c): i for i, c in enumerate(self.classes)}
        self.confidence = float(confidence)
        self.certified = [dict(c) for c in (certified or [])]
        self.segments = list(segments)
        self.metric = metric
        self.calibration = [None if c is None else (np.asarray(c["x"], dtype=float), np.asarray(c["y"], dtype=float))
                            for c in (calibration or [])]
        #: per gear, the certification rows its map was fitted on (None: unknown)
        self.calibration_rows = [None if c is None or c.get("rows") is None else int(c["rows"])
                                 for c in (calibration or [])]
        self.retention_s, self.max_rows, self.clock = float(retention_s), int(max_rows), clock
        self.path = None if path is None else os.fspath(path)
        self.db = sqlite3.connect(self.path or ":memory:", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL" if self.path else "PRAGMA journal_mode=MEMORY")
        if self.path:  # a process crash loses no commit; as the monitor's own store without fsync
            self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._rows = self.db.execute("SELECT COUNT(*) FROM served").fetchone()[0]
        self._swept = -math.inf
        #: per followed attribute, the values counted apart so far (from the file on a restart)
        self._values: dict[str, set[str]] = {a: set() for a in self.segments}
        for attribute, value in self.db.execute("SELECT DISTINCT attribute, value FROM counts WHERE attribute != ''"):
            self._values.setdefault(attribute, set()).add(value)

    # ------------------------------------------------------------------ served rows
    def served(self, request_id: Sequence[Any], row: Sequence[int], served_class: Sequence[int],
               gear: Sequence[int] | None, confidence: Sequence[float],
               attributes: Mapping[str, Sequence[Any]] | None = None, *, repeat: bool = False) -> int:
        """Keep served rows for their labels and add them to the label-free counts. Rows
        without a request id are counted but cannot be labelled. Their retention counts from
        now on this clock (not the records' timestamps: a replica's skewed clock must not
        expire rows early). A row already waiting is neither kept nor counted again; with
        ``repeat`` (a batch the caller has seen before: sent again after a lost answer) rows
        without a request id are not counted again either. Returns rows kept."""
        n = len(row)
        gear = np.zeros(n, dtype=np.int64) if gear is None else np.asarray(gear, dtype=np.int64)
        # a confidence that is not a number counts as no chance of being right (SQLite would store
        # NaN as NULL and refuse the whole batch); the rest clipped to [0, 1]
        conf = np.clip(np.nan_to_num(np.asarray(confidence, dtype=float), nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
        attrs = {a: self._pooled(a, v) for a, v in (attributes or {}).items() if a in self.segments}
        # the rows of one request share its id and segment: each distinct one is checked or written once
        names = sorted(attrs)
        values = list(zip(*(attrs[a] for a in names), strict=True)) if names else [()] * n
        seg_text = {v: json.dumps({a: str(x) for a, x in zip(names, v, strict=True)}, sort_keys=True)
                    for v in dict.fromkeys(values)}
        valid = {r: r is not None and bool(REQUEST_ID.match(str(r))) for r in dict.fromkeys(request_id)}
        now = float(self.clock())
        keep = [(str(r), int(i), now, int(g), int(c), seg_text[v])
                for r, i, g, c, v in zip(request_id, row, gear, served_class, values, strict=True) if valid[r]]
        with self.db:
            self.db.execute("BEGIN")
            # a row already waiting (its batch sent again after a restart forgot the batch's id)
            # is counted once
            ids = [r for r, ok in valid.items() if ok]
            waiting = set()
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                waiting.update(self.db.execute(f"SELECT rid, row FROM served WHERE rid IN ({','.join('?' * len(part))})",
                                               [str(r) for r in part]).fetchall())
            before = self.db.total_changes
            self.db.executemany("INSERT OR IGNORE INTO served (rid, row, ts, gear, served, seg) VALUES (?,?,?,?,?,?)",
                                keep)
            kept = self.db.total_changes - before
            if waiting or repeat:
                # rows already waiting are counted already; with repeat, so are rows without an id
                already = np.array([(str(r), int(i)) in waiting for r, i in zip(request_id, row, strict=True)],
                                   dtype=bool)
                new = ~already & np.array([valid[r] for r in request_id], dtype=bool) if repeat else ~already
                if not repeat:
                    self._add_total("repeated_rows", int(np.count_nonzero(already)))
                gear, conf = gear[new], conf[new]
                attrs = {a: [v for v, m in zip(values_, new, strict=True) if m] for a, values_ in attrs.items()}
            self._count_served(gear, conf, attrs)
        self._rows += kept
        self._sweep()
        return kept

    def _pooled(self, attribute: str, values: Sequence[Any]) -> list[str]:
        """The values as counted: each as text, those past the first ``max_segment_values``
        distinct ones of the attribute as ``OTHER_VALUE``."""
        known = self._values.setdefault(attribute, set())
        out = []
        for v in values:
            text = str(v)
            if text not in known:
                if len(known) >= self.max_segment_values:
                    text = OTHER_VALUE
                else:
                    known.add(text)
            out.append(text)
        return out

    def _count_served(self, gear: np.ndarray, conf: np.ndarray, attrs: dict[str, list]) -> None:
        conf = conf.copy()
        for g, cal in enumerate(self.calibration):  # the certification rows' confidence -> accuracy map
            m = gear == g
            if cal is not None and m.any():
                conf[m] = np.interp(conf[m], *cal)
        var = conf * (1.0 - conf)
        groups: list[tuple[int, str, str, np.ndarray]] = []
        for g in np.unique(gear):
            m = gear == g
            groups.append((int(g), "", "", m))
            for a, values in attrs.items():
                column = np.asarray([str(v) for v in values], dtype=object)
                for value in dict.fromkeys(column[m].tolist()):
                    groups.append((int(g), a, value, m & (column == value)))
        self.db.executemany(
            "INSERT INTO counts (gear, attribute, value, served, conf_sum, conf_var) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT (gear, attribute, value) DO UPDATE SET served = served + excluded.served, "
            "conf_sum = conf_sum + excluded.conf_sum, conf_var = conf_var + excluded.conf_var",
            [(g, a, v, int(m.sum()), float(conf[m].sum()), float(var[m].sum())) for g, a, v, m in groups])

    def _sweep(self) -> None:
        now = self.clock()
        if now - self._swept < SWEEP_EVERY_S and self._rows <= self.max_rows:
            return
        self._swept = now
        with self.db:
            self.db.execute("BEGIN")
            before = self.db.total_changes
            self.db.execute("DELETE FROM served WHERE ts < ?", (now - self.retention_s,))
            over = self._rows - (self.db.total_changes - before) - self.max_rows
            if over > 0:
                self.db.execute("DELETE FROM served WHERE (rid, row) IN "
                                "(SELECT rid, row FROM served ORDER BY ts LIMIT ?)", (over,))
            dropped = self.db.total_changes - before
            self._add_total("expired_rows", dropped)
        self._rows -= dropped

    # ------------------------------------------------------------------ labels
    def parse(self, body: Any) -> list[tuple[str, int, int]]:
        """``{"labels": [{"request_id", "row", "label"}, ...]}`` as (id, row, class index);
        ValueError naming the field otherwise (the HTTP layer answers it as 422)."""
        if not isinstance(body, Mapping) or set(body) != {"labels"}:
            raise LabelError("body", 'the body must be {"labels": [{"request_id": ..., "row": ..., "label": ...}]}')
        entries = body["labels"]
        if not isinstance(entries, list) or not entries:
            raise LabelError("labels", "labels must be a non-empty list")
        if len(entries) > MAX_LABELS_PER_CALL:
            raise LabelError("labels", f"at most {MAX_LABELS_PER_CALL} labels per call, got {len(entries)}")
        out = []
        for i, e in enumerate(entries):
            if not isinstance(e, Mapping) or set(e) != {"request_id", "row", "label"}:
                raise LabelError(f"labels[{i}]", "each label must be {request_id, row, label} and nothing else")
            rid, row, label = e["request_id"], e["row"], e["label"]
            if not isinstance(rid, str) or not REQUEST_ID.match(rid):
                raise LabelError(f"labels[{i}].request_id", "a request id: 1-64 of A-Z a-z 0-9 . _ : -")
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row <= MAX_ROW:
                raise LabelError(f"labels[{i}].row", f"the row's index in its request: an integer in [0, {MAX_ROW}]")
            index = self._index.get(_key(label))
            if index is None:
                raise LabelError(f"labels[{i}].label", f"not a class; classes: {self.classes}")
            out.append((rid, row, index))
        return out

    def label(self, body: Any) -> dict[str, int]:
        """Join a call's labels (see :meth:`parse`): accepted, unknown and duplicate counts."""
        entries = self.parse(body)
        accepted = unknown = duplicate = 0
        oldest = float(self.clock()) - self.retention_s  # a row past its window is unknown, swept yet or not
        with self.db:
            self.db.execute("BEGIN")
            for rid, row, index in entries:
                found = self.db.execute("SELECT gear, served, seg, labelled FROM served WHERE rid=? AND row=? AND ts >= ?",
                                        (rid, row, oldest)).fetchone()
                if found is None:
                    unknown += 1
                    continue
                gear, served, seg, labelled = found
                if labelled:
                    duplicate += 1
                    continue
                self.db.execute("UPDATE served SET labelled=1 WHERE rid=? AND row=?", (rid, row))
                correct = int(served == index)
                keys = [(gear, "", "")] + [(gear, a, v) for a, v in json.loads(seg).items()]
                self.db.executemany(
                    "INSERT INTO counts (gear, attribute, value, labelled, correct) VALUES (?,?,?,1,?) "
                    "ON CONFLICT (gear, attribute, value) DO UPDATE SET labelled = labelled + 1, "
                    "correct = correct + excluded.correct", [(*k, correct) for k in keys])
                accepted += 1
            for key, n in (("accepted", accepted), ("unknown", unknown), ("duplicate", duplicate)):
                self._add_total(key, n)
        return {"accepted": accepted, "unknown": unknown, "duplicate": duplicate}

    def _add_total(self, key: str, n: int) -> None:
        if n:
            self.db.execute("INSERT INTO totals (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                            "value = value + excluded.value", (key, int(n)))

    # ------------------------------------------------------------------ answers
    def report(self, segment: str | None = None) -> dict[str, Any]:
        """Per gear (and per value of ``segment``): labelled rows, served accuracy with its
        anytime-valid interval, the certified floor, and the label-free estimate."""
        if segment is not None and segment not in self.segments:
            raise ValueError(f"segment must be one of the followed attributes {self.segments}, got {segment!r}")
        rows = self.db.execute("SELECT gear, attribute, value, served, conf_sum, conf_var, labelled, correct "
                               "FROM counts ORDER BY gear, attribute, served DESC").fetchall()
        gears: dict[int, dict[str, Any]] = {}
        for gear, attribute, _value, served, conf_sum, conf_var, labelled, correct in rows:
            if attribute == "":
                gears[gear] = {"gear": gear, **self._figures(gear, served, conf_sum, conf_var, labelled, correct)}
        if segment is not None:
            for gear, attribute, value, served, conf_sum, conf_var, labelled, correct in rows:
                if attribute == segment and gear in gears:
                    gears[gear].setdefault("segments", []).append(
                        {"attribute": attribute, "value": value,
                         **self._figures(gear, served, conf_sum, conf_var, labelled, correct)})
        totals = dict(self.db.execute("SELECT key, value FROM totals").fetchall())
        return {"kind": "accuracy", "metric": "accuracy", "certified_metric": self.metric,
                "confidence": self.confidence, "labelled_rows": sum(g["labelled_rows"] for g in gears.values()),
                "waiting_rows": self._rows, "retention_s": self.retention_s,
                **{k: int(totals.get(k, 0)) for k in _TOTALS}, "gears": [gears[g] for g in sorted(gears)],
                "segments_followed": self.segments}

    def _figures(self, gear: int, served: int, conf_sum: float, conf_var: float, labelled: int,
                 correct: int) -> dict[str, Any]:
        alpha = 1.0 - self.confidence
        # a negative gear: rows the full pipeline answered (no certificate of a gear of its own)
        cert = self.certified[gear] if 0 <= gear < len(self.certified) else {}
        baseline, max_loss = cert.get("baseline_score"), cert.get("max_loss")
        floor = None if baseline is None or max_loss is None or self.metric != "accuracy" else baseline - max_loss
        prior = broad_prior(min(max(floor if floor is not None else 0.5, 0.01), 0.99))
        lower = lower_bound(labelled, correct, alpha / 2, prior) if labelled else None
        upper = upper_bound(labelled, correct, alpha / 2, prior) if labelled else None
        z = float(stats.norm.ppf(1 - alpha / 2))
        estimate = conf_sum / served if served else None
        rows = self.calibration_rows[gear] if 0 <= gear < len(self.calibration_rows) else None
        map_var = 0.0 if estimate is None or not rows else estimate * (1.0 - estimate) / rows
        err = z * math.sqrt(conf_var / served ** 2 + map_var) if served else None
        return {"served_rows": served, "labelled_rows": labelled,
                "estimate_calibrated": 0 <= gear < len(self.calibration) and self.calibration[gear] is not None,
                "accuracy": correct / labelled if labelled else None, "accuracy_lower": lower, "accuracy_upper": upper,
                "certified_bound": {"max_loss": max_loss, "baseline_score": baseline, "floor": floor},
                "below_certified": bool(floor is not None and upper is not None and upper < floor),
                "estimate_without_labels": estimate,
                "estimate_interval": None if estimate is None else [max(estimate - err, 0.0), min(estimate + err, 1.0)]}

    def close(self) -> None:
        self.db.close()


class LabelError(ValueError):
    """A malformed labels body: ``field`` names what is wrong (an HTTP 422's ``fields``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _key(value: Any) -> str:
    """A class or label as a comparable key: 1, 1.0 and "1" name the same class."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, np.integer)) or (isinstance(value, (float, np.floating)) and float(value).is_integer()):
        return str(int(value))
    return str(value)
