"""The ingress's own request path, old against new, side by side in one process: what each
change to the lean path saves per request, free of the served benchmark's noise (on the
2-core machine a served phase moves by 10-20% from round to round, more than these savings).

    python -m benchmarks.request_path [--workload toxic] [--rows-per-request 32] [--repeats 7] [--n-rows N] [--json PATH]

Four steps of ``POST /predict``, each timed as CPU per request (``time.process_time`` over a
block of requests), old and new alternating block by block, medians over ``--repeats`` blocks:

- **dispatch**: the ASGI app from the first byte of the request to the last of the answer, for a
  route that reads the body and answers a ready response. Old: the route through FastAPI (its
  middleware, router, endpoint wrapper); new: :class:`serving.runtime.front.LeanFastAPI`'s hot
  route.
- **parse**: the body to the validated request and its frame. Old: ``json`` and the per-value
  checks; new: :func:`serving.core.schema.parse_request` (msgspec, column-at-a-time checks).
- **encode**: the answer to bytes. Old: ``json.dumps``; new:
  :func:`serving.core.schema.predict_answer` (msgspec).
- **predict**: the optimized cascade on the request's rows (the workload optimized here, on
  ``--n-rows`` of it), as a fitted plan runs it (scikit-learn's checks of its own arguments
  off: ``willump._models.fitted_calls``). Old: every model called through its own
  ``predict_proba``; new: logistic regressions and LightGBM classifiers on plain arrays compute
  the same numbers without their per-call input checks (``willump._fast_proba``).

The served figures (everything around these steps too: uvicorn, Serve's replica, Ray's
processes, HAProxy) are ``python -m benchmarks.serving``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from serving.core.schema import PredictRequest, RowSchema, parse_request, predict_answer
from serving.measure.loadgen import payloads
from willump import _fast_proba as fast_proba

#: requests per timed block
BLOCK = 400
#: blocks per side (old, new alternate)
REPEATS = 7


class _Checked(RowSchema):
    """The row schema as it was: every value checked on its own (the fast path switched off)."""

    def _fast_frame(self, rows: list[dict[str, Any]], required: set[str] | None = None) -> None:
        return None


def _old_parse(body: bytes, schema: RowSchema) -> Any:
    data = json.loads(body)
    parsed = PredictRequest.model_validate(data)
    return parsed, schema.to_frame(parsed.rows)


def _old_encode(classes: np.ndarray, proba: np.ndarray, level: np.ndarray, degraded: np.ndarray) -> bytes:
    from serving.core.jsonsafe import clean

    body = {"predictions": clean(list(classes[np.argmax(proba, axis=1)]), infinity="null"),
            "probabilities": np.round(proba, 12).tolist(), "level": level.tolist(), "degraded": degraded.tolist(),
            "model_version": "v1", "gear": 0}
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _apps(answer: bytes) -> tuple[Any, Any]:
    """The same route, behind FastAPI (old) and as LeanFastAPI's hot route (new)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    import serving.runtime.front as front

    class Owner:
        async def predict(self, request: Request) -> Response:
            await request.body()
            return Response(answer, media_type="application/json")

    owner = Owner()
    old = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    old.add_api_route("/predict", owner.predict, methods=["POST"])
    new = front.LeanFastAPI(openapi_url=None, docs_url=None, redoc_url=None, hot_routes={("POST", "/predict"): "predict"},
                            owner=lambda: owner)  # this process plays the replica
    new.add_api_route("/predict", owner.predict, methods=["POST"])
    return old, new


def _asgi_block(app: Any, body: bytes, n: int) -> None:
    scope = {"type": "http", "method": "POST", "path": "/app/predict", "root_path": "/app", "raw_path": b"/app/predict",
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 5), "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                                      (b"content-length", str(len(body)).encode())]}

    async def many() -> None:
        for _ in range(n):
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive(messages: list = messages) -> dict[str, Any]:
                return messages.pop() if messages else {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                pass

            await app(dict(scope), receive, send)

    asyncio.run(many())


def paired(old: Callable[[int], None], new: Callable[[int], None], *, block: int, repeats: int) -> dict[str, float]:
    """CPU ms per request of ``old`` and ``new`` (each runs ``block`` requests per call),
    alternating, medians over ``repeats`` blocks each."""
    old(block // 4)
    new(block // 4)  # warm-up
    times: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(repeats):
        for name, fn in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
            c0 = time.process_time()
            fn(block)
            times[name].append(1000.0 * (time.process_time() - c0) / block)
    out = {f"{k}_ms": statistics.median(v) for k, v in times.items()}
    out["saved_ms"] = out["old_ms"] - out["new_ms"]
    out["ratio"] = out["old_ms"] / out["new_ms"] if out["new_ms"] > 0 else float("inf")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pipelines

    workload = pipelines.build(args.workload, seed=args.seed, n_rows=args.n_rows)
    X = workload.X_test
    schema = RowSchema.from_sample(X, list(X.columns))
    checked = _Checked(schema.columns, schema.optional)
    bodies, _ = payloads(X, args.rows_per_request, limit=50)
    rng = np.random.default_rng(args.seed)
    proba = rng.dirichlet([1.0, 1.0], size=args.rows_per_request)
    level = rng.integers(0, 2, size=args.rows_per_request)
    degraded = np.zeros(args.rows_per_request, dtype=bool)
    classes = np.asarray([0, 1], dtype=object)
    answer = predict_answer(classes, proba, level, degraded, "v1", {"gear": 0})
    old_app, new_app = _apps(answer)

    def cycle(fn: Callable[[bytes], Any]) -> Callable[[int], None]:
        def block(n: int) -> None:
            for i in range(n):
                fn(bodies[i % len(bodies)])
        return block

    steps = {
        "dispatch": paired(lambda n: _asgi_block(old_app, bodies[0], n), lambda n: _asgi_block(new_app, bodies[0], n),
                           block=args.block, repeats=args.repeats),
        "parse": paired(cycle(lambda b: _old_parse(b, checked)),
                        cycle(lambda b: parse_request(b, PredictRequest, schema)), block=args.block, repeats=args.repeats),
        "encode": paired(cycle(lambda b: _old_encode(classes, proba, level, degraded)),
                         cycle(lambda b: predict_answer(classes, proba, level, degraded, "v1", {"gear": 0})),
                         block=args.block, repeats=args.repeats),
    }
    opt = workload.optimize(verbose=False)
    frames = [X.iloc[i:i + args.rows_per_request] for i in range(0, len(X) - args.rows_per_request + 1,
                                                                 args.rows_per_request)][:50]

    def predict(run: Callable[[Any], Any]) -> Callable[[int], None]:
        def block(n: int) -> None:
            for i in range(n):
                run(frames[i % len(frames)])
        return block

    def models_own_calls(rows: Any) -> Any:  # run_levels as it was: every model through its own predict_proba
        fast_proba.ENABLED = False
        try:
            return opt.run_levels(rows)
        finally:
            fast_proba.ENABLED = True

    steps["predict"] = paired(predict(models_own_calls), predict(opt.run_levels),
                              block=args.block, repeats=args.repeats)
    total = {k: sum(s[k] for s in steps.values()) for k in ("old_ms", "new_ms", "saved_ms")}
    return {"workload": args.workload, "rows_per_request": args.rows_per_request, "block": args.block,
            "repeats": args.repeats, "date": time.strftime("%Y-%m-%d"), "steps": steps, "total": total}


def report(out: dict[str, Any]) -> str:
    lines = [f"{out['workload']}, {out['rows_per_request']}-row requests; CPU ms per request, medians of "
             f"{out['repeats']} alternating blocks of {out['block']}:",
             f"  {'step':10s} {'old':>8s} {'new':>8s} {'saved':>8s} {'ratio':>7s}"]
    for name, s in (*out["steps"].items(), ("total", out["total"])):
        ratio = s.get("ratio", s["old_ms"] / s["new_ms"])
        lines.append(f"  {name:10s} {s['old_ms']:8.3f} {s['new_ms']:8.3f} {s['saved_ms']:8.3f} {ratio:6.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="toxic")
    parser.add_argument("--rows-per-request", type=int, default=32)
    parser.add_argument("--block", type=int, default=BLOCK, help="requests per timed block")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="blocks per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-rows", type=int, default=None, help="rows of the workload (default: all)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    for name in ("rows_per_request", "block", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    out = run(args)
    print(report(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
