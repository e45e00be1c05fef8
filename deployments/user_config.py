"""The ``user_config`` blocks of ``serve_config.yaml``: ``BatchingConfig`` (Inference), ``IngressConfig``
(the router) and ``PipelineConfig`` (a model's ``Model``). Ray Serve hands them to ``reconfigure()``, so a
change in the config file takes effect without restarting replicas. The ``args`` blocks, fixed for a
deployment's life, are in ``deployments/config.py``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from deployments.config import _Frozen


class BatchingConfig(_Frozen):
    """Inference ``user_config``: the dynamic-batching knobs, tunable at run time."""

    max_batch_size: int = Field(default=64, ge=1, le=4096, description="Sequences per batch.")
    max_batch_tokens: int = Field(
        default=16384,
        ge=1,
        description="Padded tokens per batch (longest x count); a longer item runs alone.",
    )
    # Per forward pass: on a CPU small passes win (their activations stay in cache); a GPU wants large ones.
    micro_batch_size: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="Sequences per forward pass; on a GPU, raise it with max_batch_size.",
    )
    micro_batch_tokens: int = Field(
        default=256,
        ge=1,
        description="Padded tokens per forward pass (a longer sequence runs alone); on a GPU raise it to "
        "max_batch_tokens, on a CPU keep passes small.",
    )
    batch_wait_timeout_s: float = Field(
        default=0.005,
        ge=0.0,
        le=1.0,
        description="While a batch is on the model, how long the next one may wait to fill (at most: a full "
        "batch leaves at once); a group that finds the model idle never waits. Raise it when batches stay "
        "small under load; lower it when latency under load matters more than throughput.",
    )
    adaptive_wait: bool = Field(
        default=True, description="Shrink the wait when batches stay small, grow it when they hit the cap."
    )
    min_wait_s: float = Field(
        default=0.0005, ge=0.0, le=1.0, description="The adaptive window's floor (adaptive_wait)."
    )
    max_wait_s: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="The adaptive window's ceiling (adaptive_wait): the longest a batch waits to fill.",
    )

    @model_validator(mode="after")
    def _window_in_bounds(self) -> BatchingConfig:
        if self.min_wait_s > self.max_wait_s:
            raise ValueError("min_wait_s must not exceed max_wait_s")
        return self


class IngressConfig(_Frozen):
    """Ingress ``user_config``: admission, deadlines and the degraded-answer cache. The ingress routes
    each request on its own; batching happens in each model's inference deployment."""

    max_in_flight: int = Field(
        default=512,
        ge=1,
        description="Requests inside one ingress replica; past it: 503 + Retry-After at once.",
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Default deadline; a client may ask for less with X-Request-Timeout."
    )
    fallback_cache_mb: float = Field(
        default=64.0,
        ge=0.0,
        description="LRU of recent answers served, marked degraded, when the model path "
        "fails or times out; 0 turns it off.",
    )
    # The link (deployments/link/) saves Serve's handle hop for a pipeline replica on the router's node.
    # Past the cap the handle's replica choice and queue bounds take over; and for a model with a replica on
    # another node the handle takes every request (deployments/link/client.py), so one node's replica is not
    # the only one loaded.
    local_link_max_in_flight: int = Field(
        default=64,
        ge=0,
        description="Requests this ingress replica sends at once to one pipeline replica on its own node "
        "over a Unix socket, instead of Serve's handle; 0: always the handle.",
    )


class PipelineConfig(_Frozen):
    """``user_config`` of a model application's ``Model`` deployment: its pipeline and its card.

    Concurrent requests for the model travel its stages (tokenize, infer, serialize) as one group per call,
    so the per-call cost of a hop is shared; the model's batches form in Inference."""

    max_group_size: int = Field(default=64, ge=1, le=1024, description="Requests per group.")
    max_group_inputs: int = Field(
        default=512,
        ge=1,
        le=4096,
        description="Inputs (texts, documents, a rerank's query) per group, beside max_group_size: bounds "
        "what one call between the model's replicas carries and how long a group's requests wait for each "
        "other. A request with more inputs still runs, in a group of its own. Raise it with the inputs per "
        "request (the router's limits.max_inputs_per_request) or on a GPU that takes larger batches.",
    )
    # A maximum, never a minimum: a group forms when a slot is free and takes what is queued; at 0 a request
    # with a free slot leaves at once, and requests that arrive while both slots run join the next group.
    group_wait_timeout_s: float = Field(
        default=0.0, ge=0.0, le=1.0, description="The longest a group's first request waits for company."
    )

    candidate_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of requests that name no version sent to the candidate version (canary).",
    )
    # The one size-based shortcut (docs/architecture.md, "The paths a request can take"): a small
    # group's tokenizing and serializing cost less than the two hops to the stage replicas. Larger groups
    # (bulk) go to the stages, which work beside the pipeline. Its inference runs in Inference either way.
    inline_chars: int = Field(
        default=8192,
        ge=0,
        le=1_000_000,
        description="Groups with at most this many characters are tokenized and serialized in the Model "
        "replica itself, skipping the Tokenizer and Serializer deployments (0: every group goes through "
        "them). Lower it when the Model replica's CPU is the bottleneck; raise it when the stages' hops show "
        "in the latency of mid-sized requests.",
    )
    inference_link: bool = Field(
        default=True,
        description="Send groups to an Inference replica on this node over a Unix socket instead of Serve's "
        "handle (deployments/link/; the handle still carries them while any replica runs on another node). "
        "Turn it off to compare the two, or where Inference autoscales with a policy other than "
        "deployments.link.autoscaling's, which counts the groups that came this way.",
    )
    float_decimals: int | None = Field(
        default=6, ge=0, le=9, description="Round JSON floats to this many decimals; null keeps all."
    )
    batch_min_share: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="The share of recent busy time that bulk (batch-priority) tenants keep while "
        "interactive work waits too, in the pipeline's groups and at Inference's batch queue: interactive "
        "work goes first, bulk is never starved. Raise it when bulk jobs must finish in a window; lower it "
        "for interactive tails.",
    )
