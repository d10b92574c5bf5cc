"""Figures every wing of serving reads: how replicas batch and how large a request may be.

They live here, not with the planner, so the request path (``serving.runtime.stage_runner``) reads them
without importing planning.
"""

#: batches a stage replica runs at once (``@serve.batch(max_concurrent_batches=...)``, in
#: threads, so remote feature lookups overlap); the ingress keeps this many calls in flight
#: per running replica of a stage, and the cost model counts them
CONCURRENT_BATCHES = 4
#: a stage whose profiled CPU time is at least this share of its batch time (it waits for
#: nothing: no remote lookups, no device) runs its batches on its replica's event loop rather
#: than in threads: under the GIL threads overlap only waits, and the hand-offs cost about 0.8 ms
#: of the ingress's and 0.3 ms of a stage's CPU per 32-row request (docs/benchmarks.md, the
#: request path, served)
INLINE_CPU_SHARE = 0.8
#: ... and only while its largest profiled batch takes at most this many seconds: an inline batch
#: holds the replica's event loop (Serve's gRPC handling, health checks, deadlines and the
#: ingress's hops wait for it), so a long one (a deep model on CPU) runs in a thread instead
INLINE_MAX_BATCH_S = 0.1
#: most rows the ingress merges into one stage call
INGRESS_BATCH_ROWS = 256
#: largest accepted request body, in bytes (overridable per deployment)
MAX_BODY_BYTES = 4 * 1024 * 1024
#: most rows accepted in one request (overridable per deployment)
MAX_ROWS = 10_000
#: Host names that mean this machine only: an app bound to one of them answers to no other Host
#: (DNS rebinding), and a Ray started for it keeps every listener on loopback
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: deploy(calibrate=...): measure HTTP/hop costs "auto" (unless cached for this cluster),
#: "always", or "never" (placeholder figures, noted in the plan)
CALIBRATE = ("auto", "always", "never")
#: environment variable `willump serve` reads the API key from by default
API_KEY_ENV = "WILLUMP_API_KEY"
#: deploy(insitu=...): probe the running app and plan again from what it measured (serving.measure.insitu)
#: "auto" (where this machine can read every process of the app), "always" (an error where it
#: cannot), or "never"
INSITU = ("auto", "always", "never")
#: "staged": the ingress calls one deployment per stage; "fused": the first stage runs
#: inside the ingress replicas (no hop for the rows it answers)
LAYOUTS = ("staged", "fused")
#: layouts deploy and ``willump build`` take: the plan's own (:data:`LAYOUTS`), "whole" (a
#: cascade's every level as one stage in the ingress: its unsure rows never leave the process)
#: and "auto" (the better of "fused" and "whole" by the plan's bound;
#: :func:`serving.planning.planner.plan_layouts`)
CASCADE_LAYOUTS = ("auto", *LAYOUTS, "whole")

#: request bodies up to this size are parsed on the ingress's event loop; larger ones in a
#: thread, so that one big request does not stall every other request on the replica
PARSE_INLINE_BYTES = 64 * 1024

#: seconds a stage call may wait on a replica nobody has reported lost (a node cut off, a hung
#: process) before the ingress copies it to another replica, whatever the hedging settings;
#: the capacity router ranks a replica silent this long last (serving.runtime.calls.StageHedge,
#: serving.runtime.routing; deploy(lost_after_s=...))
LOST_AFTER_S = 2.0

#: requests Serve lets into an ingress replica beyond its admission bound (max_ongoing_requests =
#: the bound + this): the ingress answers 503 first; an in-place max_in_flight may not pass it
INGRESS_SERVE_HEADROOM = 64

#: the willump command's exit codes (both the pipeline and the torch-model forms; the README's
#: "Command line" section lists them): done, an error the message on stderr names, argparse's
#: usage error, no plan meets the rate, SLO or memory asked (`plan`), the plan does not hold on
#: the new rows (`recertify`)
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_PLAN = 3
EXIT_NOT_CERTIFIED = 4
#: Serve's ``max_surge_percent`` for the ingress and every model or partition stage (the
#: torch-model app's too): when a redeploy under the same name (a re-certified or retrained
#: artifact, an edited config) replaces their replicas, Serve starts ceil(replicas x this / 100)
#: replicas beyond the target (one, up to 100 replicas) and stops an old one only once the
#: running replicas exceed the target, so the capacity serving never dips below the plan's.
#: Serve's default, 0, stops a fifth of the old replicas (at least one) before it starts their
#: replacements: a deployment of one replica then answers nothing while its replacement starts.
#: deploy() asks for it where the replacements fit beside the running app, else for 0, with a
#: warning (serving.launch.handover). The monitor, one replica holding the window, is replaced
#: without it: two would split its records.
HANDOVER_SURGE_PERCENT = 1
#: what an autoscaled later stage is sized for while a cheaper gear serves (``gear_policy=
#: {"replicas_for": ...}``): the deployed gear's load (the gear steps back once those replicas
#: answer); the served gear's (fewer replicas, and a burst served in the cheaper gear while it
#: lasts, though its first seconds, served in gear 0 until the gear steps, may start replicas);
#: or the cheapest gear's (the busy share read as the cheapest gear the live audit allows would
#: make it: replicas are added for load that gear would not hold, or for the rows a burst's first
#: seconds queue before the gear steps, which the queue rule counts as served; a burst, or a lasting
#: rise, is served in cheaper gears, within their certificates, for as long as it lasts: the fewest
#: replica-seconds)
REPLICAS_FOR = ("deployed", "served", "cheapest")
