"""The pipeline's calls to its model's ``Inference`` replicas: over a Unix socket to a replica on this node
(``deployments/link/``, as the router's calls to ``Model``), else by Serve's handle.

Serve's handle between two replicas costs 2-3 ms a round trip on a CPU (gRPC threads on both sides); a
light request's whole time is a few times that. The rules are the router's (``link/client.py``): a socket
is used only while its replica's card keeps coming by Serve's handle (so a retired replica stops taking
groups as soon as Serve stops routing to it) and only while every replica of the deployment listens on this
node (else Serve's replica choice balances them all). Requests over the link are invisible to Serve's count of
ongoing requests, so ``Inference`` reports them itself and its autoscaling policy adds them
(``deployments/link/autoscaling.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from contracts.tokenized import Priority
from deployments.link.client import LinkClient
from deployments.link.frames import link_key, this_node_dir
from deployments.observability.metrics import inference_call
from deployments.pipeline.request_group import RequestGroup

# How often the pipeline asks the Inference replicas for their sockets (the router's card period).
CARD_PERIOD_S = 1.0
# A pipeline replica has at most its two groups per version in flight; the cap only guards a bug.
MAX_IN_FLIGHT = 16


class InferenceCalls:
    """``Inference.infer`` for each served version, by the link where it can, else by the handle."""

    def __init__(
        self, inference: dict[str, Any], use_link: bool, app: str | None, directory: Path | None = None
    ) -> None:
        """``inference``: version -> the version's Inference handle; ``app``: this replica's application
        (None outside Serve: every call by the handle); ``directory``: the sockets (default: this node's)."""
        self._handles = inference
        self.use_link = use_link
        self._enabled = app is not None
        if self._enabled and directory is None:
            directory = this_node_dir()
        self._link = LinkClient(directory if self._enabled else None, MAX_IN_FLIGHT)
        self._keys = {
            version: link_key(app or "", getattr(handle, "deployment_name", version))
            for version, handle in inference.items()
        }
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts reading the replicas' cards, from the running event loop (the replica's), once."""
        if self._watch is None and self._enabled:
            try:
                self._watch = asyncio.get_running_loop().create_task(self._read_cards())
            except RuntimeError:
                return

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    async def infer(
        self,
        version: str,
        group: RequestGroup,
        encoded: list[Any],
        priority: Priority,
        batch_min_share: float,
    ) -> list[Any]:
        """One group's inference; ``group`` cancels the call in flight when every member has left."""
        request = (encoded, priority, batch_min_share)
        replica = self._link.pick(self._keys[version]) if self.use_link else None
        if replica is not None:  # a task only for a call that goes over the link (it may be cancelled)
            reply = await group.sending(asyncio.ensure_future(self._link.call(replica, request)))
            if reply is not None:
                inference_call("link")
                answers: list[Any] = reply.result()
                return answers
        inference_call("handle")
        return await group.sending(self._handles[version].infer.remote(*request))  # type: ignore[no-any-return]

    async def _read_cards(self) -> None:
        keys = list(self._keys.values())
        while True:
            with contextlib.suppress(Exception):  # a replica starting or stopping: the next round sees it
                await asyncio.gather(*(self._card(version) for version in self._handles))
            self._link.refresh(keys)
            await asyncio.sleep(CARD_PERIOD_S)

    async def _card(self, version: str) -> None:
        key = self._keys[version]
        handle = self._handles[version]
        calls = [handle.link_name.remote() for _ in range(self._link.card_calls(key))]
        for name in await asyncio.gather(*calls, return_exceptions=True):
            if not isinstance(name, BaseException):
                self._link.saw(key, name)
