"""Where the work runs: this machine (the default) or a Ray cluster (`--executor ray`, `pip install 'emitter[ray]'`).

Ray is imported lazily, here only, so nothing changes for users without it. `connect` joins a running cluster
(`--address auto` or `ray://host:port`) or starts a private local instance (no address), and says whether the
caller started Ray and so must shut it down. A process that already called `ray.init()` (a test session, a
notebook) keeps its instance: emitter uses it and leaves it running.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from emitter.errors import EmitterError

EXECUTORS = ("local", "ray")
INSTALL_HINT = "pip install 'emitter[ray]'   (or: pip install 'ray>=2.9')"
_FIX = ("start a cluster (`ray start --head` on one node, `ray start --address <head>:6379` on the others) and pass "
        "--address auto on a node of it, or --address ray://<head>:10001 from elsewhere (that needs "
        "pip install 'ray[client]'); or leave out --address for a local instance. A cluster that `ray start` "
        "began with token authentication (Ray 2.60's default) also wants RAY_AUTH_MODE=token here and its token in "
        "~/.ray/auth_token")


class RayUnavailable(EmitterError):
    exit_code = 2


def require_ray() -> Any:
    """The ray module, or RayUnavailable with how to install it."""
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed here ({e})\n"
                             f"  fix: {INSTALL_HINT}; or leave out --executor ray to run on this machine") from None
    return ray


@dataclass
class RaySession:
    ray: Any
    owned: bool            # True: this call started / joined Ray and close() shuts it down
    address: str | None

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
            self.owned = False

    def total(self, resource: str) -> float:
        return float(self.ray.cluster_resources().get(resource, 0.0))

    def largest_node(self, resource: str) -> float:
        """The most of `resource` one live node has (a task asking for more would never be placed)."""
        best = 0.0
        for n in self.ray.nodes():
            if n.get("Alive", n.get("alive")):
                best = max(best, float((n.get("Resources") or {}).get(resource, 0.0)))
        return best


def _reachable(address: str | None, timeout_s: float = 10.0) -> None:
    """Fail fast on a host:port nobody listens on (ray.init would wait minutes for its GCS)."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS")
    if not address or address in ("auto", "local"):
        return
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = hostport.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"cannot reach Ray at {address}: {e.strerror or e}\n  fix: {_FIX}") from None


def connect(address: str | None = None, num_gpus: int | None = None) -> RaySession:
    """Join Ray at `address` ("auto", "host:port", "ray://host:port"), or start a local instance when None.

    $EMITTER_RAY_ADDRESS stands in for a missing address (and $RAY_ADDRESS is Ray's own). `num_gpus`: the GPUs a
    local instance declares (the fake profile backend's GPUs are labels: a machine without GPUs can run them)."""
    ray = require_ray()
    if ray.is_initialized():
        return RaySession(ray, False, address)
    address = address or os.environ.get("EMITTER_RAY_ADDRESS") or None
    _reachable(address)
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                              "log_to_driver": False}
    try:
        if address is None:
            ray.init(**kwargs, **({"num_gpus": num_gpus} if num_gpus is not None else {}))
        else:
            ray.init(address=address, **kwargs)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        where = address or "a local instance"
        raise RayUnavailable(f"cannot reach Ray at {where}: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}\n"
                             f"  fix: {_FIX}") from None
    return RaySession(ray, True, address)


__all__ = ["EXECUTORS", "INSTALL_HINT", "RayUnavailable", "RaySession", "connect", "require_ray"]
