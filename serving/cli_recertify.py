"""``willump recertify ARTIFACT --labels FILE``: the certified plan bounded again on fresh
labelled rows (``OptimizedPipeline.recertify``), written as a new artifact when every gear holds;
with ``--config SERVE_CONFIG`` (a config `willump build` wrote), that config then serves the new
artifact, and ``serve deploy SERVE_CONFIG`` hands it to the running app (Serve's rolling update:
the new replicas start before the old ones stop, so no request is lost).

The labels file holds the pipeline's input columns and a label column (CSV, optionally gzipped,
or JSON lines). Exit code 0 when the plan is re-certified (and ``-o`` written), 4 when a gear's
new bound exceeds its max_loss (nothing written: serve the full pipeline or re-optimize), 1 for
an error the message names.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from serving.core.constants import EXIT_NOT_CERTIFIED
from serving.core.jsonsafe import clean


def add_parser(sub: argparse._SubParsersAction) -> None:
    recertify = sub.add_parser("recertify", help="bound the certified plan again on fresh labelled rows")
    recertify.add_argument("artifact", help="directory written by OptimizedPipeline.save")
    recertify.add_argument("--labels", required=True, metavar="FILE",
                           help="the rows and their labels: CSV (.csv, .csv.gz), JSON lines (.jsonl) or a JSON "
                                "array of row objects (.json)")
    recertify.add_argument("--label-column", default="label", help="the column holding the labels (default %(default)s)")
    recertify.add_argument("-o", "--output", help="write the re-certified artifact here (when every gear holds)")
    recertify.add_argument("--config", metavar="SERVE_CONFIG",
                           help="a Serve config `willump build` wrote: point it at the -o artifact, for "
                                "`serve deploy SERVE_CONFIG` to hand it to the running app without downtime "
                                "(the file is rewritten: its YAML comments are not kept)")
    recertify.add_argument("--segments", metavar="COLUMN",
                           help="a plan certified per segment: the column of the labels file holding each row's "
                                "segment (default: the column optimize's segments= named)")
    recertify.add_argument("--json", action="store_true", help="print the result as JSON")


def read_rows(path: str, label_column: str, sample=None):
    """The rows and labels of the ``--labels`` file. With ``sample`` (the plan's sample rows, a
    DataFrame), its text columns are read as text, as the served app takes them ("02139" stays
    "02139", "NA" stays "NA"; an empty cell is missing); the labels are read as written (text in
    CSV, JSON's own types in JSON) and matched to the plan's classes by :func:`as_classes`."""
    import pandas as pd
    from pandas._libs.parsers import STR_NA_VALUES

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--labels {path}: no such file")
    name = file.name.lower()
    columns = getattr(sample, "columns", None)
    text = [] if columns is None else [c for c in columns if not pd.api.types.is_numeric_dtype(sample[c])
                                       and not pd.api.types.is_bool_dtype(sample[c])]
    if name.endswith((".csv", ".csv.gz")):
        as_text = [*text, label_column]
        header = pd.read_csv(file, nrows=0).columns
        # pandas' missing-value words ("NA", "None", "null", ...) only where a number is read
        missing = {c: [""] if c in as_text else sorted(STR_NA_VALUES) for c in header}
        frame = pd.read_csv(file, dtype={c: str for c in as_text}, keep_default_na=False, na_values=missing)
    elif name.endswith((".jsonl", ".json")):  # JSON lines, or one JSON array of row objects
        try:
            frame = pd.read_json(file, lines=name.endswith(".jsonl"), dtype=False, convert_dates=False)
        except ValueError as exc:
            shape = "JSON lines" if name.endswith(".jsonl") else "a JSON array of row objects"
            raise ValueError(f"--labels {path}: not {shape}: {exc}") from exc
    else:
        raise ValueError(f"--labels {path}: a .csv, .csv.gz, .jsonl or .json file, please")
    if label_column not in frame:
        raise ValueError(f"--label-column {label_column!r} is not a column of {path}: {list(frame.columns)[:20]}")
    return frame.drop(columns=[label_column]), frame[label_column].to_numpy()


def as_classes(labels, classes):
    """Each label as the plan's class it names, matched as the served app's labels route matches
    (``drift``'s label key: ``1``, ``"1"``, ``1.0`` and ``True`` name one class), and a label
    written as text matched by its number or, for true/false classes, its word; ValueError naming
    the labels that name no class."""
    import numpy as np

    from drift._labels import _key

    def key(value) -> str:
        return _key(value.item() if isinstance(value, np.generic) else value)

    by_text = {key(c): c for c in classes}
    if all(isinstance(c, (bool, np.bool_)) for c in classes):  # "True"/"False" as pandas writes them
        by_text.update({str(bool(c)).lower(): c for c in classes})
    out, unknown = [], []
    for value in labels:
        text = key(value)
        if text not in by_text and isinstance(value, str):
            words = value.strip().lower()
            try:
                text = words if words in by_text else key(float(value))
            except ValueError:
                pass
        if text not in by_text:
            unknown.append(value)
        out.append(by_text.get(text, value))
    if unknown:
        shown = sorted({repr(v) for v in unknown})[:5]
        raise ValueError(f"--labels: {len(unknown)} label(s) name no class of the plan ({list(classes)}): {shown}")
    return np.asarray(out, dtype=np.asarray(classes).dtype)


def cmd_recertify(args: argparse.Namespace) -> int:
    import willump

    if args.config and not args.output:
        raise ValueError("--config points a Serve config at the re-certified artifact: give -o PATH to write it")
    if args.config and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file")
    if args.output and Path(args.output).resolve() == Path(args.artifact).resolve():
        raise ValueError(f"-o {args.output} is the artifact being re-certified: the running app's replicas load it "
                         "(a restart or scale-up would find another version, and nothing would be left to roll "
                         "back to); write the new artifact elsewhere")
    opt = willump.load(args.artifact)
    X, y = read_rows(args.labels, args.label_column, getattr(opt, "sample_rows_", None))
    result = opt.recertify(X, as_classes(y, opt.classes_), segments=args.segments)
    if args.json:
        print(json.dumps(clean(result.to_dict()), indent=2, allow_nan=False))
    else:
        for g in result.gears:
            verdict = "holds" if g.certified else (
                "EXCEEDS max_loss" if math.isfinite(g.loss_bound) else "NOT BOUNDED (too few rows differ to bound it)")
            print(f"gear {g.gear}: loss {g.loss:+.4f}, bound {g.loss_bound:.4f} ({g.method}) vs max_loss {g.max_loss}: "
                  f"{verdict}; {g.disagreed} of {g.rows} rows answered otherwise than the full pipeline")
    if not result.certified:
        print("willump: the plan is not re-certified on these rows; nothing written", file=sys.stderr)
        return EXIT_NOT_CERTIFIED
    if args.output:
        result.pipeline().save(args.output)
        print(f"willump: wrote {args.output} (serve it to replace the running app's artifact)", file=sys.stderr)
    if args.config:
        import yaml

        from serving.launch.config import retarget_config, write_serve_config

        config, apps = retarget_config(yaml.safe_load(Path(args.config).read_text()), args.output)
        write_serve_config(config, args.config)
        # Serve's rolling update starts new replicas beside the old only with room for them
        # (surge); without it a deployment of one replica answers nothing while its successor starts
        no_surge = [a.get("name") for a in config.get("applications") or []
                    if isinstance(a.get("args"), dict) and a["args"].get("surge_percent") == 0]
        how = ("a rolling update, no request lost" if not no_surge else
               f"a rolling update; {', '.join(map(str, no_surge))} had no room for a replica beside the plan's "
               "(surge 0): a deployment of one replica answers nothing while its successor starts")
        print(f"willump: {args.config} now serves {args.output} ({', '.join(apps)}); `serve deploy {args.config}` "
              f"hands it to the running app ({how})", file=sys.stderr)
    return 0

