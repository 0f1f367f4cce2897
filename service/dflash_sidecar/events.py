"""Optional Kubernetes Events on the pod when the acceptance verdict changes.

Uses the in-cluster service account (RBAC: create events in the pod's namespace). Off by
default; when the API cannot be reached the error is logged and counted, never raised.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from dflash_sidecar.verdict import Verdict

log = logging.getLogger("dflash_sidecar.events")


class VerdictEvents:
    def __init__(self, pod_name: str, namespace: str, api: Any | None = None) -> None:
        self.pod_name = pod_name
        self.namespace = namespace
        self.failures = 0
        self._api = api

    def _core_api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            config.load_incluster_config()  # type: ignore[no-untyped-call]
            self._api = client.CoreV1Api()
        return self._api

    def __call__(self, previous: Verdict, current: Verdict, reason: str) -> None:
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
            self._core_api().create_namespaced_event(self.namespace, event)
        except Exception as err:  # an unreachable API must not take the sidecar down
            self.failures += 1
            log.warning("could not create a Kubernetes event (%s): %s", type(err).__name__, err)
