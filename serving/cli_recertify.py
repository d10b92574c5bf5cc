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
import sys
from pathlib import Path

from serving.core.constants import EXIT_NOT_CERTIFIED


def add_parser(sub: argparse._SubParsersAction) -> None:
    recertify = sub.add_parser("recertify", help="bound the certified plan again on fresh labelled rows")
    recertify.add_argument("artifact", help="directory written by OptimizedPipeline.save")
    recertify.add_argument("--labels", required=True, metavar="FILE",
                           help="the rows and their labels: CSV (.csv, .csv.gz) or JSON lines (.jsonl)")
    recertify.add_argument("--label-column", default="label", help="the column holding the labels (default %(default)s)")
    recertify.add_argument("-o", "--output", help="write the re-certified artifact here (when every gear holds)")
    recertify.add_argument("--config", metavar="SERVE_CONFIG",
                           help="a Serve config `willump build` wrote: point it at the -o artifact, for "
                                "`serve deploy SERVE_CONFIG` to hand it to the running app without downtime "
                                "(the file is rewritten: its YAML comments are not kept)")
    recertify.add_argument("--json", action="store_true", help="print the result as JSON")


def read_rows(path: str, label_column: str):
    import pandas as pd

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--labels {path}: no such file")
    name = file.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        frame = pd.read_csv(file)
    elif name.endswith((".jsonl", ".json")):
        frame = pd.read_json(file, lines=True)
    else:
        raise ValueError(f"--labels {path}: a .csv, .csv.gz or .jsonl file, please")
    if label_column not in frame:
        raise ValueError(f"--label-column {label_column!r} is not a column of {path}: {list(frame.columns)[:20]}")
    return frame.drop(columns=[label_column]), frame[label_column].to_numpy()


def cmd_recertify(args: argparse.Namespace) -> int:
    import willump

    if args.config and not args.output:
        raise ValueError("--config points a Serve config at the re-certified artifact: give -o PATH to write it")
    if args.config and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file")
    opt = willump.load(args.artifact)
    X, y = read_rows(args.labels, args.label_column)
    result = opt.recertify(X, y)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=float))
    else:
        for g in result.gears:
            verdict = "holds" if g.certified else "EXCEEDS max_loss"
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
        print(f"willump: {args.config} now serves {args.output} ({', '.join(apps)}); `serve deploy {args.config}` "
              "hands it to the running app (a rolling update, no request lost)", file=sys.stderr)
    return 0
