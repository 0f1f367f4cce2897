"""Optional Kubernetes Events on the pod when the acceptance verdict changes.

Uses the in-cluster service account (RBAC: create events in the pod's namespace). Off by
default. The API call runs in a worker thread with a deadline (the client's request timeout and
an asyncio timeout around it), so a slow API server never holds the probes; a failure or a
timeout is logged and counted, never raised.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from dflash_sidecar.verdict import Verdict

log = logging.getLogger("dflash_sidecar.events")


class VerdictEvents:
    def __init__(
        self, pod_name: str, namespace: str, api: Any | None = None, timeout: float = 5.0
    ) -> None:
        self.pod_name = pod_name
        self.namespace = namespace
        self.timeout = timeout
        self.failures = 0
        self.sent = 0
        self._api = api

    def _core_api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            config.load_incluster_config()  # type: ignore[no-untyped-call]
            self._api = client.CoreV1Api()
        return self._api

    async def __call__(self, previous: Verdict, current: Verdict, reason: str) -> None:
        from kubernetes import client

        now = datetime.datetime.now(datetime.UTC)
        warning = current in (Verdict.DEGRADED, Verdict.COLLAPSED)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{self.pod_name}.dflash-"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=self.pod_name, namespace=self.namespace, api_version="v1"
            ),
            reason=f"SpeculativeDecoding{current.value.title().replace('-', '')}",
            message=f"acceptance verdict {previous.value} -> {current.value}: {reason}",
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="dflash-sidecar"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.to_thread(self._create, event)
            self.sent += 1
        except TimeoutError:
            self.failures += 1
            log.warning("could not create a Kubernetes event: no answer in %gs", self.timeout)
        except Exception as err:  # an unreachable API must not take the sidecar down
            self.failures += 1
            log.warning(
                "could not create a Kubernetes event (%s): %s", type(err).__name__, str(err)[:200]
            )

    def _create(self, event: Any) -> None:
        self._core_api().create_namespaced_event(
            self.namespace, event, _request_timeout=self.timeout
        )
