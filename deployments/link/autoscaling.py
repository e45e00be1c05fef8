"""Serve's queue-length autoscaling for a deployment that also takes requests over the link.

Serve counts the requests its handles send; the groups that reach ``Inference`` over a Unix socket
(``pipeline/inference_calls.py``) are not among them. Each ``Inference`` replica reports those itself
(``record_autoscaling_stats``: ``LINK_ONGOING``), and this policy adds them to Serve's count, then decides as
Serve's default policy does (``replica_queue_length_autoscaling_policy``): replicas = ongoing requests /
``target_ongoing_requests``. Serve applies the config's bounds, delays and scaling factors around it, as for
its own policy.

Set it on every autoscaled ``Inference`` (``serve_config.yaml``, ``k8s/overlay.yaml``):

    autoscaling_config:
      policy: {policy_function: deployments.link.autoscaling:link_aware_policy}

Only Ray imports here: Serve's controller unpickles the policy by value.
"""

from __future__ import annotations

from typing import Any

from ray.serve.config import AutoscalingContext

# The metric each replica reports: requests in it that came over the link, averaged over Serve's look-back.
LINK_ONGOING = "link_ongoing_requests"
POLICY_PATH = "deployments.link.autoscaling:link_aware_policy"


def link_aware_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Desired replicas from Serve's ongoing requests plus the link's."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    link = sum((ctx.aggregated_metrics or {}).get(LINK_ONGOING, {}).values())
    ongoing = ctx.total_num_requests + link
    return ongoing / ctx.config.get_target_ongoing_requests(), {}
