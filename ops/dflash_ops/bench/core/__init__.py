"""One benchmark run against one endpoint: the client, the prompts, the runner, the results, the
run directory, the report and the service-level objectives. Imports nothing else of `bench`: the
experiments beside it (search, sweep, router policies, client ceiling, sidecar cost, cluster Job)
are built on it."""
