"""The peer row of the serving benchmark: the same pipeline served as a user would write it
with stock Ray Serve and none of this project: one deployment, a FastAPI ingress, ``@serve.batch``
merging concurrent requests, the original (unoptimized) pipeline. What the table shows beside it
is what this project adds over plain Ray Serve.

The body is the same ``{"rows": [...]}`` the project's apps take; the answer carries predictions
and probabilities. Its replicas load the artifact from a path, as a user's would load a model.

No ``from __future__ import annotations``: FastAPI reads the route annotations of the class
Serve pickles by value, so they must be real objects.
"""

import itertools
import json

import numpy as np
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

#: rows one batch of the peer may merge (Serve's own knob, a user's usual setting)
PEER_MAX_BATCH_SIZE = 256
#: seconds the peer's batcher waits for more requests (Serve's default is 0.01)
PEER_BATCH_WAIT_S = 0.002

peer_app = FastAPI()


@serve.deployment
@serve.ingress(peer_app)
class PeerPipeline:
    """The original pipeline behind FastAPI, batched by Serve."""

    def __init__(self, artifact: str):
        import willump

        opt = willump.load(artifact)
        self.pipeline = opt.baseline  # the user's own pipeline, unoptimized
        self.classes = np.asarray(opt.classes_, dtype=object)

    @serve.batch(max_batch_size=PEER_MAX_BATCH_SIZE, batch_wait_timeout_s=PEER_BATCH_WAIT_S,
                 batch_size_fn=lambda frames: sum(len(f) for f in frames))
    async def predict_batch(self, frames: list[pd.DataFrame]) -> list[np.ndarray]:
        proba = self.pipeline.predict_proba(pd.concat(frames, ignore_index=True))
        edges = np.cumsum([0, *(len(f) for f in frames)])
        return [proba[a:b] for a, b in itertools.pairwise(edges)]

    @peer_app.post("/predict")
    async def predict(self, request: Request) -> Response:
        try:
            rows = json.loads(await request.body())["rows"]
            frame = pd.DataFrame(rows)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        proba = await self.predict_batch(frame)
        labels = self.classes[np.argmax(proba, axis=1)]
        return JSONResponse({"predictions": [x.item() if hasattr(x, "item") else x for x in labels],
                             "probabilities": proba.tolist()})


def deploy_peer(artifact: str, *, name: str, replicas: int, cpus_each: float) -> str:
    """Run the peer app (``replicas`` replicas of ``cpus_each`` logical CPUs) on the running
    Serve; its /predict URL path prefix."""
    app = PeerPipeline.options(num_replicas=replicas, ray_actor_options={"num_cpus": cpus_each}).bind(artifact)
    serve.run(app, name=name, route_prefix=f"/{name}")
    return f"/{name}"

