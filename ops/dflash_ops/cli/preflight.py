"""`dflash-serve preflight`: check a cluster before `helm install`, with what to fix.

Reads the chart's values (defaults plus a profile or -f files) to know what the release will
ask for, then checks the current cluster through the Kubernetes API: GPU nodes of the wanted
product with enough allocatable GPUs, the NVIDIA device plugin, the StorageClass, the CRDs the
values need, the namespace and the HF token Secret.
"""

from __future__ import annotations

import argparse
from typing import Any

from dflash_ops.chart.values import add_values_arguments, chart_values, values_files
from dflash_ops.errors import UserError
from dflash_ops.preflight.checks import check_cluster, report
from dflash_ops.preflight.kubernetes_cluster import KubernetesCluster


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "preflight",
        help="check the current cluster before helm install (GPUs, plugin, storage, CRDs, secret)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_values_arguments(parser)
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    values = chart_values(values_files(args))
    cluster = KubernetesCluster(args.kubeconfig, args.context)
    try:
        checks = check_cluster(values, args.namespace, cluster)
    except Exception as err:  # an API error is reported as such, not as a traceback
        raise UserError(f"the Kubernetes API refused a read: {err}") from None
    return report(checks, args.format)
