"""The floor: one trivial Ray Serve deployment behind Serve's HTTP proxy, no model, no other stage.

Measured beside the service, it shows what Ray Serve's per-request path alone costs on the machine:
no graph built on that path can answer single-text requests faster than this.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations on the methods.
import orjson
from fastapi import FastAPI, Request
from ray import serve
from starlette.responses import Response

api = FastAPI()
_UNIT_VECTOR = [0.0] * 383 + [1.0]


@serve.deployment(name="Floor", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=1024)
@serve.ingress(api)
class Floor:
    @api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        n = 1 if isinstance(body["input"], str) else len(body["input"])
        data = [{"object": "embedding", "index": i, "embedding": _UNIT_VECTOR} for i in range(n)]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        payload = {"object": "list", "data": data, "model": "floor", "usage": usage}
        return Response(orjson.dumps(payload), media_type="application/json")

    @api.get("/healthz")
    async def healthz(self) -> Response:
        return Response(b'{"status":"ready"}', media_type="application/json")


app = Floor.bind()
