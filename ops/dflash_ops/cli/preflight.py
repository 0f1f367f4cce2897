"""`dflash-serve preflight`: check a cluster before `helm install`, with what to fix.

Renders the chart with the same value arguments the install gets (--profile, -f, --set) and
checks what that render asks of the current cluster, through the Kubernetes API: nodes its GPU
pods may land on (their rendered affinity, node selector and tolerations) with enough
allocatable GPUs, the NVIDIA device plugin, the StorageClass of each claim, the CRD of every
custom kind it renders (and that KubeRay knows upgradeStrategy), the namespace, and every Secret
its pods reference (HF token, API key, extra ones) with its key.
"""

from __future__ import annotations

import argparse
from typing import Any

from dflash_ops.chart.helm import helm_template
from dflash_ops.chart.values import add_values_arguments, values_files
from dflash_ops.cli.arguments import kubernetes_name
from dflash_ops.cli.extras import require_extra
from dflash_ops.errors import UserError
from dflash_ops.preflight.checks import check_cluster, report
from dflash_ops.preflight.kubernetes_cluster import KubernetesCluster
from dflash_ops.preflight.release_needs import needs_from_render


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "preflight",
        help="check the current cluster before helm install (GPUs, plugin, storage, CRDs, secrets)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_values_arguments(parser)
    parser.add_argument(
        "--release",
        type=kubernetes_name,
        default="dflash",
        help="the release name helm install gets",
    )
    parser.add_argument("--namespace", "-n", type=kubernetes_name, default="default")
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    require_extra("kubernetes", ("kubernetes",), "dflash-serve preflight")
    rendered = helm_template(values_files(args), args.sets, args.release, args.namespace)
    needs = needs_from_render(rendered)
    cluster = KubernetesCluster(args.kubeconfig, args.context)
    try:
        checks = check_cluster(needs, args.namespace, cluster)
    except Exception as err:  # an API error is reported as such, not as a traceback
        raise UserError(f"the Kubernetes API refused a read: {err}") from None
    return report(checks, args.format)
