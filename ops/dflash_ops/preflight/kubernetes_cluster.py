"""The Kubernetes API reads preflight makes, through the kubernetes client."""

from __future__ import annotations

from typing import Any

import yaml

from dflash_ops.errors import UserError
from dflash_ops.files import read_yaml


class KubernetesCluster:
    """ClusterReader over the kubernetes client and the current kubeconfig (or in-cluster)."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        if kubeconfig:
            # A file that is not a kubeconfig at all gets one line naming it, not the client's
            # traceback from deep inside its YAML reader.
            read_yaml(kubeconfig, "--kubeconfig", dict)
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        except (ConfigException, TypeError, ValueError, OSError, yaml.YAMLError) as err:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except ConfigException:
                where = kubeconfig or "KUBECONFIG / ~/.kube/config"
                raise UserError(
                    f"no usable kubeconfig ({where}): {err}; point --kubeconfig or KUBECONFIG at "
                    "the cluster, or run inside it"
                ) from None
        self.core = client.CoreV1Api()
        self.apps = client.AppsV1Api()
        self.storage = client.StorageV1Api()
        self.ext = client.ApiextensionsV1Api()
        self._client = client

    def nodes(self) -> list[Any]:
        return list(self.core.list_node().items)

    def crd(self, name: str) -> dict[str, Any] | None:
        try:
            found = self.ext.read_custom_resource_definition(name)
        except self._client.ApiException as err:
            if err.status == 404:
                return None
            raise
        serialize = self._client.ApiClient().sanitize_for_serialization
        return dict(serialize(found))  # type: ignore[no-untyped-call]

    def storage_classes(self) -> list[Any]:
        return list(self.storage.list_storage_class().items)

    def daemonsets(self) -> list[Any]:
        return list(self.apps.list_daemon_set_for_all_namespaces().items)

    def namespace_exists(self, name: str) -> bool:
        try:
            self.core.read_namespace(name)
            return True
        except self._client.ApiException as err:
            if err.status == 404:
                return False
            raise

    def secret_keys(self, namespace: str, name: str) -> set[str] | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except self._client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return set((secret.data or {}).keys())
