"""How a call between the service's replicas carries its data, whatever the size of the group.

In Ray Serve's high-throughput mode a handle call is one gRPC message each way, and a process receives
messages up to ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH`` (gRPC's 4 MiB unless set): a busy group's answer
passes that, and the call fails. The shipped configs raise it in every replica's environment (the
``&throughput_mode`` variables of ``serve_config.yaml``). Where a config leaves it below what a group may
need, the handles made here go by reference instead (Ray actor calls, large values through the object
store), so no request the router accepted fails between replicas for its size. No Ray import at module
level: the unit tests pass stand-in handles.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

log = logging.getLogger("textserve.transport")

LIMIT_ENV = "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"
# What one call may need: a group at the largest max_group_inputs (4096) of a 4096-wide model answered in
# every embedding type is about 290 MB (at the default cap, 512 inputs, about 36 MB). The shipped configs set
# gRPC's own maximum (2 GiB - 1), as Serve does for its gRPC proxy.
NEEDED_BYTES = 512 * 2**20

H = TypeVar("H")
_warned: set[str] = set()


def grpc_limit() -> int | None:
    """The largest message a gRPC call between replicas may carry in this process; None when Serve's
    handles go by reference (Ray actor calls), which have no such limit."""
    from ray.serve._private import constants

    if not constants.RAY_SERVE_USE_GRPC_BY_DEFAULT:
        return None
    return int(constants.RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)


def carrying_any_size(handle: H, limit: int | None = None, name: str = "") -> H:
    """``handle`` itself where its calls can carry any group (by reference, or gRPC with a limit of at
    least NEEDED_BYTES); otherwise the same handle by reference, and one warning that names the setting.
    ``limit``: the gRPC limit in force (default: this process's)."""
    limit = grpc_limit() if limit is None else limit
    if limit is None or limit >= NEEDED_BYTES:
        return handle
    if name not in _warned:
        _warned.add(name)
        log.warning(
            "%s=%d is below the %d bytes a group may need: calls to %s go by reference (Ray's object "
            "store) instead of gRPC; set it in the replicas' runtime_env (serve_config.yaml does)",
            LIMIT_ENV,
            limit,
            NEEDED_BYTES,
            name or "the stage replicas",
        )
    by_reference: Any = handle
    return by_reference.options(_by_reference=True)  # type: ignore[no-any-return]
