{{/* Value combinations the chart refuses, each with the value to change and how. */}}

{{- define "dflash-serve.validate" -}}
{{- $method := .Values.speculative.method -}}
{{- $methods := (.Files.Get "files/vocabulary.yaml" | fromYaml).speculativeMethods -}}
{{- if not (has $method $methods) -}}
{{- fail (printf "speculative.method %q is unknown: use %s or %s" $method (initial $methods | join ", ") (last $methods)) -}}
{{- end -}}
{{- include "dflash-serve.validateProfile" . -}}
{{- $_ := include "dflash-serve.speculativeSchedule" . -}}
{{- if and (eq $method "dflash") (not .Values.speculative.draftModel) -}}
{{- fail "speculative.method is dflash but speculative.draftModel is empty: set the DFlash2 draft (Hugging Face id or path on the model cache)" -}}
{{- end -}}
{{- if and (ne $method "off") (lt (int .Values.speculative.numSpeculativeTokens) 1) -}}
{{- fail "speculative.numSpeculativeTokens must be at least 1 (or set speculative.method: off)" -}}
{{- end -}}
{{- if .Values.distributed.enabled -}}
{{- $d := .Values.distributed -}}
{{- if ne (int $d.pipelineParallelSize) 1 -}}
{{- fail (printf "distributed.pipelineParallelSize %d is not supported: vLLM 0.33.0 requires pipeline_parallel_size 1 for Qwen4Exp (its PLE n-gram embedding needs the raw input_ids on every rank, and its sequence-parallel MoE needs PP=1). Scale out with the tensor layout (TP across nodes) or the data layout (DP with expert parallelism)." (int $d.pipelineParallelSize)) -}}
{{- end -}}
{{- if not (has $d.layout (list "tensor" "data")) -}}
{{- fail (printf "distributed.layout %q is unknown: use tensor (TP across nodes) or data (DP + EP across nodes)" $d.layout) -}}
{{- end -}}
{{- $gpus := mul (int $d.nodes) (int $d.gpusPerNode) -}}
{{- if lt (int $d.nodes) 2 -}}
{{- fail "distributed.nodes must be at least 2 (one node needs no Ray cluster: set distributed.enabled: false)" -}}
{{- end -}}
{{- if and (eq (toString .Values.networkPolicy.enabled) "false") (not .Values.networkPolicy.allowUnprotectedRay) -}}
{{- fail "networkPolicy.enabled is false with distributed.enabled: Ray's ports (GCS 6379, the Ray Client server 10001, the raylets) would be open to every pod of the cluster, and code run through them shares the head pod's loopback, where vLLM answers without a key. Keep networkPolicy.enabled (auto or true), or set networkPolicy.allowUnprotectedRay: true if your cluster enforces no NetworkPolicy and you accept that" -}}
{{- end -}}
{{- if not (has (toString $d.rayAuth.mode) (list "token" "disabled")) -}}
{{- fail (printf "distributed.rayAuth.mode %q is unknown: use token (Ray's token authentication, the default) or disabled" (toString $d.rayAuth.mode)) -}}
{{- end -}}
{{- if and .Values.modelCache.enabled (not .Values.modelCache.existingClaim) (not (has "ReadWriteMany" .Values.modelCache.accessModes)) -}}
{{- fail "distributed serving mounts the model cache on every node: set modelCache.accessModes to [ReadWriteMany] (an RWX StorageClass), or modelCache.existingClaim to an RWX claim" -}}
{{- end -}}
{{- if and (eq $d.layout "data") (ne $gpus (mul (int .Values.engine.tensorParallelSize) (int $d.dataParallelSize))) -}}
{{- fail (printf "distributed data layout: distributed.dataParallelSize %d x engine.tensorParallelSize %d must equal distributed.nodes %d x distributed.gpusPerNode %d" (int $d.dataParallelSize) (int .Values.engine.tensorParallelSize) (int $d.nodes) (int $d.gpusPerNode)) -}}
{{- end -}}
{{- end -}}
{{- $shared := or .Values.modelCache.existingClaim (has "ReadWriteMany" .Values.modelCache.accessModes) -}}
{{- if and (not .Values.distributed.enabled) .Values.modelCache.enabled (not $shared) (or (gt (int .Values.replicas) 1) .Values.autoscaling.enabled) -}}
{{- fail (printf "%s with a ReadWriteOnce model cache: a second pod on another node can never attach the claim. Set modelCache.accessModes to [ReadWriteMany] (with an RWX StorageClass in modelCache.storageClass), or modelCache.existingClaim to a claim every replica can mount." (ternary "autoscaling.enabled" (printf "replicas %d" (int .Values.replicas)) .Values.autoscaling.enabled)) -}}
{{- end -}}
{{- if not (has .Values.rollout.strategy (list "auto" "Recreate" "RollingUpdate")) -}}
{{- fail (printf "rollout.strategy %q is unknown: use auto, Recreate or RollingUpdate" .Values.rollout.strategy) -}}
{{- end -}}
{{- with .Values.sidecar.baseline -}}
{{- if eq $method "off" -}}
{{- fail "sidecar.baseline judges speculative decoding, and speculative.method is off: remove sidecar.baseline" -}}
{{- end -}}
{{- if ne (int .num_speculative_tokens) (int (include "dflash-serve.k" $)) -}}
{{- fail (printf "sidecar.baseline was measured at k %d, and the release drafts up to k %d (speculative.numSpeculativeTokens): measure it again at this k (bench sweep)" (int .num_speculative_tokens) (int (include "dflash-serve.k" $))) -}}
{{- end -}}
{{- if ne (toString .model) (toString $.Values.model.servedName) -}}
{{- fail (printf "sidecar.baseline was measured on model %q, and the release serves %q (model.servedName): measure it on this model" (toString .model) (toString $.Values.model.servedName)) -}}
{{- end -}}
{{- end -}}
{{- include "dflash-serve.validateDoor" . -}}
{{- include "dflash-serve.validateNames" . -}}
{{- include "dflash-serve.validateEngineArgs" . -}}
{{- include "dflash-serve.validateRouterArgs" . -}}
{{- include "dflash-serve.validateNumbers" . -}}
{{- include "dflash-serve.validateSidecar" . -}}
{{- include "dflash-serve.validatePlacement" . -}}
{{- if eq (int .Values.engine.port) (int .Values.sidecar.port) -}}
{{- fail (printf "engine.port and sidecar.port are both %d: the two containers share the pod's network namespace; give the sidecar another port (e.g. 9100)" (int .Values.engine.port)) -}}
{{- end -}}
{{- if .Values.podDisruptionBudget.enabled -}}
{{- $max := toString .Values.podDisruptionBudget.maxUnavailable -}}
{{- if regexMatch "^0+%?$" $max -}}
{{- fail "podDisruptionBudget.maxUnavailable 0 blocks every node drain forever: use 1 (or a percentage above 0%), or set podDisruptionBudget.enabled: false" -}}
{{- end -}}
{{- if not (regexMatch "^([1-9][0-9]*|([1-9]|[1-9][0-9]|100)%)$" $max) -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable %q is not a number of pods (1 or more) or a percentage (1%% to 100%%): the PodDisruptionBudget would be refused or never allow a drain" $max) -}}
{{- end -}}
{{- end -}}
{{- $a := .Values.autoscaling -}}
{{- if and $a.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas %d is above autoscaling.maxReplicas %d" (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{/* Object names: Services need DNS-1035 labels (a letter first, no dots), in every layout;
KubeRay limits RayCluster names to 53 characters. */}}
{{/* What the model profile does not serve, and another profile's checkpoint or draft left in the
values. */}}
{{- define "dflash-serve.validateProfile" -}}
{{- $profile := include "dflash-serve.modelProfile" . | fromYaml -}}
{{- $name := .Values.model.profile -}}
{{- $method := .Values.speculative.method -}}
{{- if not (has $method $profile.methods) -}}
{{- fail (printf "speculative.method %s is not served for model.profile %s: use %s" $method $name (join ", " $profile.methods)) -}}
{{- end -}}
{{- range $other, $o := (.Files.Get "files/model-profiles.yaml" | fromYaml) -}}
{{- if ne $other $name -}}
{{- if and $o.checkpoint (eq $.Values.model.name $o.checkpoint) -}}
{{- fail (printf "model.name %s is %s's checkpoint and model.profile is %s: set model.name to your %s checkpoint (and model.servedName)" $.Values.model.name $o.displayName $name $profile.displayName) -}}
{{- end -}}
{{- if and (eq $method "dflash") $o.draftModel (eq $.Values.speculative.draftModel $o.draftModel) -}}
{{- fail (printf "speculative.draftModel %s is %s's DFlash2 draft and model.profile is %s: set speculative.draftModel to a draft trained for %s" $.Values.speculative.draftModel $o.displayName $name $profile.displayName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dflash-serve.validateNames" -}}
{{- $name := include "dflash-serve.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "the release's objects would be named %q, which the API server refuses for a Service: it needs a DNS-1035 label (a lowercase letter first, then lowercase letters, digits or '-', no dots); rename the release or set fullnameOverride" $name) -}}
{{- end -}}
{{- if and .Values.distributed.enabled (gt (len $name) 53) -}}
{{- fail (printf "the RayCluster would be named %q: KubeRay needs a DNS-1035 label (a lowercase letter first, then lowercase letters, digits or '-') of at most 53 characters; shorten the release name or set fullnameOverride" $name) -}}
{{- end -}}
{{- end -}}

{{/* The door's paths and ports, the router's ports, and the NetworkPolicy with a Service that
takes traffic from outside the cluster. */}}
{{- define "dflash-serve.validateDoor" -}}
{{- $never := (.Files.Get "files/door/paths.yaml" | fromYaml).never -}}
{{- $pathPattern := (.Files.Get "files/vocabulary.yaml" | fromYaml).doorPathPattern -}}
{{- range $list := list "keyedPaths" "extraKeyedPaths" -}}
{{- range (get $.Values.door $list) -}}
{{- if not (regexMatch $pathPattern (toString .)) -}}
{{- fail (printf "door.%s lists %q: a path is /segments of letters, digits, '.', '_', '~' or '-' (not starting with '.'), or {name} for any one segment (e.g. /v1/responses/{id})" $list (toString .)) -}}
{{- end -}}
{{- $source := include "dflash-serve.doorMapSource" (toString .) -}}
{{- range $never -}}
{{- if eq $source (include "dflash-serve.doorMapSource" .) -}}
{{- fail (printf "door.%s lists %s, an admin or unauthenticated route no client may reach (files/door/paths.yaml, never): remove it" $list .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $r := .Values.router -}}
{{- if and $r.enabled (eq (int $r.port) (int $r.metricsPort)) -}}
{{- fail (printf "router.port and router.metricsPort are both %d: give the metrics another port (e.g. 29000)" (int $r.port)) -}}
{{- end -}}
{{- $up := int .Values.door.upstreamPort -}}
{{- if include "dflash-serve.engineDoor" . -}}
{{- if has $up (list (int .Values.engine.port) (int .Values.sidecar.port)) -}}
{{- fail (printf "door.upstreamPort %d is also engine.port or sidecar.port: vLLM listens on it behind the door in the same pod; pick a free one (e.g. 8081)" $up) -}}
{{- end -}}
{{- end -}}
{{- if and $r.enabled (has $up (list (int $r.port) (int $r.metricsPort))) -}}
{{- fail (printf "door.upstreamPort %d is also router.port or router.metricsPort: the router listens on it behind the door in the same pod; pick a free one (e.g. 8081)" $up) -}}
{{- end -}}
{{- if and (include "dflash-serve.networkPolicy" .) (not .Values.networkPolicy.ingressCIDRs) -}}
{{- $services := list (list "service.type" .Values.service.type) -}}
{{- if $r.enabled }}{{ $services = append $services (list "router.service.type" $r.service.type) }}{{ end -}}
{{- range $services -}}
{{- if has (index . 1) (list "LoadBalancer" "NodePort") -}}
{{- fail (printf "%s is %s but the NetworkPolicy (networkPolicy.enabled, on by default with a key, the router or Ray) admits no address outside the cluster, so it would drop all outside traffic: list the client addresses in networkPolicy.ingressCIDRs (e.g. [0.0.0.0/0]), or use ClusterIP behind an ingress controller allowed by networkPolicy.allowedNamespaceLabels" (index . 0) (index . 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Flags the chart sets itself: in model.extraArgs they would override a checked value
(argparse keeps the last one) or put a secret in the pod spec. */}}
{{- define "dflash-serve.validateEngineArgs" -}}
{{- $owned := dict
  "--api-key" "auth.apiKeySecret (a Secret: arguments show in the pod spec and the process list)"
  "--port" "engine.port"
  "--host" "nothing: the chart chooses the address (0.0.0.0, or loopback behind the door)"
  "--block-size" "engine.blockSize"
  "--tensor-parallel-size" "engine.tensorParallelSize"
  "-tp" "engine.tensorParallelSize"
  "--enable-expert-parallel" "engine.expertParallel"
  "--served-model-name" "model.servedName"
  "--max-model-len" "model.maxModelLen"
  "--gpu-memory-utilization" "model.gpuMemoryUtilization"
  "--speculative-config" "speculative.method, speculative.numSpeculativeTokens and speculative.draftModel"
  "--prefix-match-unit" "engine.prefixMatchUnit"
  "--kv-cache-dtype" "engine.kvCacheDtype"
  "--mamba-cache-mode" "nothing: this model needs align"
  "--reasoning-parser" "model.reasoningParser"
  "--tool-call-parser" "model.toolCallParser"
  "--enable-auto-tool-choice" "model.toolCallParser"
  "--engram-config" "model.pleCpuOffload"
  "--shutdown-timeout" "termination.gracePeriodSeconds and termination.preStopSeconds"
  "--distributed-executor-backend" "distributed.enabled"
  "--data-parallel-size" "distributed.dataParallelSize"
  "--data-parallel-backend" "distributed.enabled"
  "--enable-scale-out" "router.enabled with router.policy cache_aware (the router tokenizes through vLLM's render endpoints)"
-}}
{{- include "dflash-serve.refuseOwnedArgs" (dict "name" "model.extraArgs" "args" .Values.model.extraArgs "owned" $owned) -}}
{{- range .Values.model.extraEnv -}}
{{- if eq (toString .name) "VLLM_API_KEY" -}}
{{- fail "model.extraEnv sets VLLM_API_KEY: use auth.apiKeySecret, which gives the same key to the sidecar and the helm tests" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A number a value asks for, whether YAML gave a number or `--set` a numeric string. */}}
{{- define "dflash-serve.number" -}}
{{- $raw := toString .value -}}
{{- if not (regexMatch "^[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?$" $raw) -}}
{{- fail (printf "%s %q is not a number" .name $raw) -}}
{{- end -}}
{{- $raw -}}
{{- end -}}

{{/* Numeric values with their range (the schema checks numbers; `--set` passes decimals as
strings, which the schema accepts as numeric strings and this checks). */}}
{{- define "dflash-serve.validateNumbers" -}}
{{- $util := float64 (include "dflash-serve.number" (dict "name" "model.gpuMemoryUtilization" "value" .Values.model.gpuMemoryUtilization)) -}}
{{- if or (le $util 0.0) (gt $util 1.0) -}}
{{- fail (printf "model.gpuMemoryUtilization %v must be above 0 and at most 1 (e.g. 0.9)" .Values.model.gpuMemoryUtilization) -}}
{{- end -}}
{{- end -}}

{{/* The value at a dotted path of .Values. */}}
{{- define "dflash-serve.valueAt" -}}
{{- $node := .root -}}
{{- range splitList "." .path }}{{ $node = get $node . }}{{ end -}}
{{- toString $node -}}
{{- end -}}

{{/* The sidecar's own rules, so that a value the sidecar would refuse fails the install
instead of crash-looping the sidecar (and, after the load, restarting the engine). The limits
of single values come from the sidecar's settings (files/sidecar-rules.yaml, generated); the
rules between values are its model validators, written out here; a test holds the two to the
same answers. */}}
{{- define "dflash-serve.validateSidecar" -}}
{{- $rules := .Files.Get "files/sidecar-rules.yaml" | fromYaml -}}
{{- $n := dict -}}
{{- range $path, $limits := $rules.numbers -}}
{{- $raw := include "dflash-serve.valueAt" (dict "root" $.Values "path" $path) -}}
{{- $v := float64 (include "dflash-serve.number" (dict "name" $path "value" $raw)) -}}
{{- if and $limits.integer (not (regexMatch "^[-+]?[0-9]+$" $raw)) -}}
{{- fail (printf "%s %q must be a whole number" $path $raw) -}}
{{- end -}}
{{- if and (hasKey $limits "gt") (le $v (float64 $limits.gt)) -}}
{{- fail (printf "%s %s must be above %v (the sidecar refuses it)" $path $raw $limits.gt) -}}
{{- end -}}
{{- if and (hasKey $limits "ge") (lt $v (float64 $limits.ge)) -}}
{{- fail (printf "%s %s must be at least %v (the sidecar refuses it)" $path $raw $limits.ge) -}}
{{- end -}}
{{- if and (hasKey $limits "lt") (ge $v (float64 $limits.lt)) -}}
{{- fail (printf "%s %s must be below %v (the sidecar refuses it)" $path $raw $limits.lt) -}}
{{- end -}}
{{- if and (hasKey $limits "le") (gt $v (float64 $limits.le)) -}}
{{- fail (printf "%s %s must be at most %v (the sidecar refuses it)" $path $raw $limits.le) -}}
{{- end -}}
{{- $_ := set $n $path $v -}}
{{- end -}}
{{- range $path, $pattern := $rules.patterns -}}
{{- $raw := include "dflash-serve.valueAt" (dict "root" $.Values "path" $path) -}}
{{- if not (regexMatch $pattern $raw) -}}
{{- fail (printf "%s %q is not accepted by the sidecar: it must match %s" $path $raw $pattern) -}}
{{- end -}}
{{- end -}}
{{- $s := .Values.sidecar -}}
{{- $interval := get $n "sidecar.scrapeInterval" -}}
{{- if ge (get $n "sidecar.scrapeTimeout") (mulf 2.0 $interval) -}}
{{- fail (printf "sidecar.scrapeTimeout %v must be below twice sidecar.scrapeInterval %v" $s.scrapeTimeout $s.scrapeInterval) -}}
{{- end -}}
{{- $units := dict "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $names := list -}}
{{- range $item := splitList "," (toString $s.windows) -}}
{{- $w := trim $item -}}
{{- if $w -}}
{{- if not (regexMatch $rules.windowPattern $w) -}}
{{- fail (printf "sidecar.windows %q: window %q is not a number and a unit s, m or h (e.g. 5m)" (toString $s.windows) $w) -}}
{{- end -}}
{{- $unit := substr (sub (len $w) 1 | int) (len $w) $w -}}
{{- $seconds := mulf (float64 (trimSuffix $unit $w)) (get $units $unit) -}}
{{- if le $seconds 0.0 -}}
{{- fail (printf "sidecar.windows %q: window %q must be longer than 0" (toString $s.windows) $w) -}}
{{- end -}}
{{- if lt $seconds (mulf 2.0 $interval) -}}
{{- fail (printf "sidecar.windows %q: window %q is shorter than two scrape intervals (2 x sidecar.scrapeInterval %v)" (toString $s.windows) $w $s.scrapeInterval) -}}
{{- end -}}
{{- $names = append $names $w -}}
{{- end -}}
{{- end -}}
{{- if not $names -}}
{{- fail "sidecar.windows is empty: give at least one window, e.g. 1m,5m,15m" -}}
{{- end -}}
{{- if not (has (toString $s.verdictWindow) $names) -}}
{{- fail (printf "sidecar.verdictWindow %q is not one of sidecar.windows %q" (toString $s.verdictWindow) (toString $s.windows)) -}}
{{- end -}}
{{- $t := $s.thresholds -}}
{{- if $s.baseline -}}
{{- range $path, $default := $rules.baselineSets -}}
{{- if ne (get $n $path) (float64 $default) -}}
{{- fail (printf "%s %v is set beside sidecar.baseline, which sets the acceptance thresholds itself (as fractions of it; the sidecar refuses both): drop one" $path (get $n $path)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (get $n "sidecar.thresholds.collapsedMeanAcceptanceLength") (get $n "sidecar.thresholds.degradedMeanAcceptanceLength") -}}
{{- fail (printf "sidecar.thresholds.collapsedMeanAcceptanceLength %v must not exceed degradedMeanAcceptanceLength %v" $t.collapsedMeanAcceptanceLength $t.degradedMeanAcceptanceLength) -}}
{{- end -}}
{{- if gt (get $n "sidecar.thresholds.collapsedPosition0") (get $n "sidecar.thresholds.degradedPosition0") -}}
{{- fail (printf "sidecar.thresholds.collapsedPosition0 %v must not exceed degradedPosition0 %v" $t.collapsedPosition0 $t.degradedPosition0) -}}
{{- end -}}
{{- end -}}

{{/* GPU placement: the products must be of gpu.type (its block-size alignment). */}}
{{- define "dflash-serve.validatePlacement" -}}
{{- $type := .Values.gpu.type -}}
{{- range (include "dflash-serve.gpuProducts" . | fromYamlArray) -}}
{{- if not (contains (upper $type) (upper (toString .))) -}}
{{- fail (printf "gpu.products lists %q, which is not an %s: the block size is planned for gpu.type %s. List %s products (or leave gpu.products empty for the usual ones), or set gpu.type to the GPU these nodes have" (toString .) (upper $type) $type (upper $type)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Flags the chart sets for the router: in router.extraArgs they would point it at other pods,
another port, or put the key in the pod spec. */}}
{{- define "dflash-serve.validateRouterArgs" -}}
{{- $owned := dict
  "--api-key" "auth.apiKeySecret"
  "--host" "nothing: the chart chooses the address (0.0.0.0, or loopback behind the door)"
  "--port" "router.port"
  "--policy" "router.policy"
  "--worker-urls" "nothing: the router finds this release's engine pods itself"
  "--service-discovery" "nothing: always on"
  "--selector" "nothing: the chart selects this release's engine pods"
  "--service-discovery-namespace" "nothing: the release namespace"
  "--service-discovery-port" "engine.port"
  "--prometheus-host" "nothing: the chart binds 0.0.0.0"
  "--prometheus-port" "router.metricsPort"
-}}
{{- range list "--vllm-pd-disaggregation" "--prefill" "--decode" "--prefill-policy" "--decode-policy" "--prefill-selector" "--decode-selector" "--pd-kv-events" "--kv-connector" "--vllm-discovery-address" "--mini-lb" "--enable-igw" -}}
{{- $_ := set $owned . "prefill-decode disaggregation is not what this chart deploys (one pool of engines serves both): remove it" -}}
{{- end -}}
{{- include "dflash-serve.refuseOwnedArgs" (dict "name" "router.extraArgs" "args" .Values.router.extraArgs "owned" $owned) -}}
{{- end -}}

{{/* Refuse an extra argument that sets a flag the chart owns, however it is spelt: argparse
(vLLM's and the router's front end) takes any unambiguous prefix (--block-si), `_` for `-`,
`--flag=value`, and vLLM takes dotted keys of JSON flags (--speculative-config.method).
Call with (dict "name" VALUE-PATH "args" LIST "owned" (dict FLAG FIX)). */}}
{{- define "dflash-serve.refuseOwnedArgs" -}}
{{- $owned := .owned -}}
{{- $name := .name -}}
{{- range .args -}}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" | replace "_" "-" -}}
{{- $base := regexReplaceAll "\\..*$" $flag "" -}}
{{- range $owns, $fix := $owned -}}
{{- $prefix := and (hasPrefix "--" $base) (gt (len $base) 2) (hasPrefix $base $owns) -}}
{{- if or (eq $base $owns) $prefix -}}
{{- if hasPrefix "prefill-decode" $fix -}}
{{- fail (printf "%s sets %s (argparse reads it as %s): %s" $name $flag $owns $fix) -}}
{{- end -}}
{{- fail (printf "%s sets %s (argparse reads it as %s), which the chart sets itself: use %s instead" $name $flag $owns $fix) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
