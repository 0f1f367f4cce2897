"""`dflash-serve render`: show exactly what the chart would deploy (real `helm template`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash_ops.chart.helm import EXAMPLE_NAMESPACE, EXAMPLE_RELEASE, helm_template
from dflash_ops.chart.values import add_values_arguments, values_files
from dflash_ops.cli.arguments import kubernetes_name


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render",
        help="render the Helm chart's manifests for a profile or values files",
        description=(
            "Run the real `helm template` on charts/dflash-serve and print the manifests: what "
            "`helm install` would create, including the block size the chart picked."
        ),
    )
    add_values_arguments(parser)
    parser.add_argument("--release", type=kubernetes_name, default=EXAMPLE_RELEASE)
    parser.add_argument("--namespace", type=kubernetes_name, default=EXAMPLE_NAMESPACE)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(helm_template(values_files(args), args.sets, args.release, args.namespace))
    return 0
