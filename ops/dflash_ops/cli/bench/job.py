"""`dflash-serve bench job`: print the benchmark as a Kubernetes Job for `kubectl apply -f -`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dflash_ops.cli.arguments import http_url, kubernetes_name, number

SECRET_REF_HELP = "NAME/KEY of the Secret holding the API key (the chart's auth.apiKeySecret)"


def secret_ref(text: str) -> tuple[str, str]:
    name, sep, key = text.partition("/")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME/KEY, e.g. dflash-api-key/key")
    return kubernetes_name(name), key


def register(actions: Any) -> None:
    from dflash_ops import __version__

    job = actions.add_parser(
        "job",
        help="print the benchmark as a Kubernetes Job calling the release from inside the cluster",
        description=(
            "Prints a Job running `dflash-serve bench` (the CPU image) against the release's "
            "Service from inside the cluster. Flags after `--` go to dflash-serve bench. Then: "
            "kubectl apply -f job.yaml; kubectl wait --for=condition=complete job/NAME "
            "--timeout=24h; kubectl logs job/NAME -c results > results.json (also -c requests "
            "for requests.jsonl, -c bench for its progress and table)."
        ),
    )
    job.add_argument("--release", type=kubernetes_name, default="dflash", help="(dflash)")
    job.add_argument(
        "--namespace", type=kubernetes_name, help="the release's namespace (default: kubectl's)"
    )
    job.add_argument(
        "--image",
        default=f"ghcr.io/dflash-serve/dflash-serve-cpu:{__version__.split('+')[0]}",
        help="an image with dflash-serve[bench] (default: the project's CPU image)",
    )
    job.add_argument(
        "--base-url",
        dest="job_base_url",
        type=http_url,
        help="what to benchmark (default: the release's Service, http://FULLNAME:8000)",
    )
    job.add_argument("--api-key-secret", type=secret_ref, help=SECRET_REF_HELP)
    job.add_argument(
        "--deadline",
        type=number(int, 60, 30 * 24 * 3600),
        default=24 * 3600,
        help="seconds before Kubernetes stops the Job (86400)",
    )
    job.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="-- then dflash-serve bench flags"
    )
    job.set_defaults(handler=run_job)


def run_job(args: argparse.Namespace) -> int:
    import yaml

    from dflash_ops.bench.cluster_job import JobSpec, manifest
    from dflash_ops.errors import UserError

    bench_args = list(args.bench_args)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    owned = {"--out", "--result-dir", "--base-url"}
    for flag in bench_args:
        if flag.split("=", 1)[0] in owned:
            raise UserError(
                f"bench job sets {flag.split('=', 1)[0]} itself (use bench job --base-url for "
                "another target; results are fetched with kubectl logs)"
            )
    spec = JobSpec(
        release=args.release,
        namespace=args.namespace,
        image=args.image,
        base_url=args.job_base_url,
        api_key_secret=args.api_key_secret,
        bench_args=bench_args,
        active_deadline_s=args.deadline,
    )

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    sys.stdout.write(yaml.dump(manifest(spec), Dumper=NoAliases, sort_keys=False))
    print(
        f"# kubectl apply -f - ; kubectl wait --for=condition=complete job/{spec.name} "
        f"--timeout={args.deadline}s; kubectl logs job/{spec.name} -c results > results.json",
        file=sys.stderr,
    )
    return 0
