"""The whole cascade exported to ONNX (willump.export_onnx's cascade.onnx) against the same
cascade in willump and the original scikit-learn pipeline, on real text: what a runtime without
Python gets.

    python -m benchmarks.onnx_cascade [--repeats 5] [--single-rows 200] [--json PATH]

SMS spam (pipelines/data): a ``from_sklearn`` pipeline of two TF-IDF branches (words; character
2-4-grams, the expensive one) into a logistic regression, optimized by willump on 70% of the
rows, exported, and run on the other 30%: the held-out rows as one batch and one row at a time,
medians of ``--repeats``. Printed beside the speeds: the export's own check (largest difference
from willump's probabilities on rows routed alike, the share routed to the same level) and the
share of rows each level answers. In process, one thread; the ONNX session with ONNX Runtime's
defaults.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

from benchmarks._timing import medians, side_by_side

#: share of the rows the optimizer and the pipeline are fitted on (the rest are measured)
TRAIN_SHARE = 0.7
#: the certified loss of the cascade
MAX_LOSS = 0.01


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    import willump
    from pipelines.datasets import load_sms_spam
    from willump._onnx import inference_session
    from willump._onnx_cascade import feeds

    frame = load_sms_spam()
    X, y = frame[["text"]], (frame["label"] == "spam").astype(int).to_numpy()
    cut = int(len(X) * TRAIN_SHARE)

    def pipeline() -> Any:
        union = ColumnTransformer([("words", TfidfVectorizer(), "text"),
                                   ("chars", TfidfVectorizer(analyzer="char", ngram_range=(2, 4), max_features=20000),
                                    "text")])
        return Pipeline([("features", union), ("model", LogisticRegression(max_iter=1000))])

    opt = willump.optimize(willump.from_sklearn(pipeline()), X=X.iloc[:cut], y=y[:cut], max_loss=MAX_LOSS,
                           seed=args.seed, verbose=False)
    held = X.iloc[cut:].reset_index(drop=True)
    directory = tempfile.mkdtemp(prefix="willump-onnx-cascade-")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = willump.export_onnx(opt, directory, held)
    check = summary["cascade"]
    if not check.get("exported"):
        return {"error": f"not exported: {check.get('why')}"}
    data = open(f"{directory}/cascade.onnx", "rb").read()
    model, session = onnx.load_from_string(data), inference_session(data)
    original = pipeline().fit(X.iloc[:cut], y[:cut])
    batch = feeds(model, held)
    rows = [held.iloc[i:i + 1] for i in range(min(args.single_rows, len(held)))]
    one = [feeds(model, r) for r in rows]
    sides = {
        "willump": (lambda: opt.predict_proba(held), lambda: [opt.predict_proba(r) for r in rows]),
        "onnx_cascade": (lambda: session.run(None, batch), lambda: [session.run(None, f) for f in one]),
        "sklearn_original": (lambda: original.predict_proba(held), lambda: [original.predict_proba(r) for r in rows]),
    }
    out: dict[str, Any] = {"rows": len(held), "single_rows": len(rows), "repeats": args.repeats,
                           "levels": [list(level.groups) for level in opt.levels],
                           "level_shares": (np.bincount(opt.predict_with_levels(held)[1], minlength=len(opt.levels))
                                            / len(held)).tolist(),
                           "export_check": {k: check[k] for k in ("max_abs_diff", "same_level_share",
                                                                  "rows_routed_differently", "approximate")},
                           "warnings": [str(w.message)[:200] for w in caught]}
    batch_s = medians(side_by_side({name: whole for name, (whole, _) in sides.items()}, args.repeats))
    one_s = medians(side_by_side({name: single for name, (_, single) in sides.items()}, args.repeats))
    for name in sides:
        out[name] = {"batch_rows_per_s": len(held) / batch_s[name], "one_row_ms": 1000.0 * one_s[name] / len(rows)}
    out["onnx_vs_willump_batch"] = out["onnx_cascade"]["batch_rows_per_s"] / out["willump"]["batch_rows_per_s"]
    out["onnx_vs_willump_one_row"] = out["willump"]["one_row_ms"] / out["onnx_cascade"]["one_row_ms"]
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--single-rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.single_rows < 1:
        parser.error("--repeats and --single-rows must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    if "error" in result:
        print(f"benchmarks.onnx_cascade: {result['error']}")
        return 1
    print(f"SMS spam, {result['rows']} held-out rows; levels {result['levels']} answer "
          f"{[round(s, 3) for s in result['level_shares']]}; export check: {result['export_check']}")
    for name in ("willump", "onnx_cascade", "sklearn_original"):
        side = result[name]
        print(f"  {name:17s} batch {side['batch_rows_per_s']:10,.0f} rows/s   one row {side['one_row_ms']:.3f} ms")
    print(f"  cascade.onnx / willump: batch {result['onnx_vs_willump_batch']:.2f}x, one row "
          f"{result['onnx_vs_willump_one_row']:.1f}x faster")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
