{{/* The engine: parallel sizes, k, the block size and its rule, the speculative config, the
arguments of `vllm serve`. */}}

{{/* Where the Hugging Face and vLLM caches live: the model cache, else the /tmp emptyDir
(uid 1000 cannot write to an unmounted path). */}}
{{- define "dflash-serve.cacheRoot" -}}
{{- if .Values.modelCache.enabled -}}{{ .Values.modelCache.mountPath }}{{- else -}}/tmp{{- end -}}
{{- end -}}

{{/* Total tensor-parallel size of one engine: across nodes for the distributed tensor layout. */}}
{{- define "dflash-serve.tp" -}}
{{- if and .Values.distributed.enabled (eq .Values.distributed.layout "tensor") -}}
{{- mul (int .Values.distributed.nodes) (int .Values.distributed.gpusPerNode) -}}
{{- else -}}
{{- int .Values.engine.tensorParallelSize -}}
{{- end -}}
{{- end -}}

{{/* Data-parallel size (distributed data layout only). */}}
{{- define "dflash-serve.dp" -}}
{{- if and .Values.distributed.enabled (eq .Values.distributed.layout "data") -}}
{{- int .Values.distributed.dataParallelSize -}}
{{- else -}}1{{- end -}}
{{- end -}}

{{/* GPUs requested by each engine pod (each Ray node in distributed mode). */}}
{{- define "dflash-serve.gpusPerPod" -}}
{{- if .Values.distributed.enabled -}}
{{- int .Values.distributed.gpusPerNode -}}
{{- else -}}
{{- int .Values.engine.tensorParallelSize -}}
{{- end -}}
{{- end -}}

{{/* Seconds a pod may take from start to serving: the startup probe's budget, plus the time the
Ray head may wait for its workers to join. The sidecar uses it to tell "still loading" from
"never came up". */}}
{{- define "dflash-serve.startupBudgetSeconds" -}}
{{- $budget := mul (int .Values.probes.startup.periodSeconds) (int .Values.probes.startup.failureThreshold) -}}
{{- if .Values.distributed.enabled -}}
{{- $budget = add $budget (int .Values.distributed.joinTimeoutSeconds) -}}
{{- end -}}
{{- $budget -}}
{{- end -}}

{{/* num_speculative_tokens in effect: 0 when speculation is off. */}}
{{- define "dflash-serve.k" -}}
{{- if eq .Values.speculative.method "off" -}}0{{- else -}}{{ int .Values.speculative.numSpeculativeTokens }}{{- end -}}
{{- end -}}

{{/* The model profile (files/model-profiles.yaml, which make generate writes): what differs
per model the chart serves. */}}
{{- define "dflash-serve.modelProfile" -}}
{{- $all := .Files.Get "files/model-profiles.yaml" | fromYaml -}}
{{- $name := toString .Values.model.profile -}}
{{- $profile := index $all $name | default dict -}}
{{- if not $profile -}}
{{- fail (printf "model.profile %q is not known: use one of %s" $name (keys $all | sortAlpha | join ", ")) -}}
{{- end -}}
{{- toYaml $profile -}}
{{- end -}}

{{/* The reasoning and tool-call parsers: the profile's for "auto", else the values' ("" for none). */}}
{{- define "dflash-serve.reasoningParser" -}}
{{- $parser := toString .Values.model.reasoningParser -}}
{{- if eq $parser "auto" -}}{{- (include "dflash-serve.modelProfile" . | fromYaml).reasoningParser -}}{{- else -}}{{- $parser -}}{{- end -}}
{{- end -}}

{{- define "dflash-serve.toolCallParser" -}}
{{- $parser := toString .Values.model.toolCallParser -}}
{{- if eq $parser "auto" -}}{{- (include "dflash-serve.modelProfile" . | fromYaml).toolCallParser -}}{{- else -}}{{- $parser -}}{{- end -}}
{{- end -}}

{{/* The block-size rule entry for this GPU, TP, KV dtype and k; fails with the fix. */}}
{{- define "dflash-serve.blockRule" -}}
{{- $profile := include "dflash-serve.modelProfile" . | fromYaml -}}
{{- $table := .Files.Get $profile.blockSizes | fromYaml -}}
{{- $gpu := .Values.gpu.type -}}
{{- $tp := int (include "dflash-serve.tp" .) -}}
{{- $k := include "dflash-serve.k" . -}}
{{- $perGpu := index $table $gpu | default dict -}}
{{- if not $perGpu -}}
{{- if $profile.gpuReason -}}
{{- fail (printf "gpu.type %q is not supported for model.profile %s: %s; use one of %s" $gpu .Values.model.profile $profile.gpuReason (join ", " $profile.gpus)) -}}
{{- end -}}
{{- fail (printf "gpu.type %q is not supported: use one of a100, h100, h200, b200" $gpu) -}}
{{- end -}}
{{- $perTp := index $perGpu (printf "tp%d" $tp) | default dict -}}
{{- if not $perTp -}}
{{- $heads := list -}}
{{- range $name, $count := $table.model.heads }}{{ $heads = append $heads (printf "%s=%v" $name $count) }}{{ end -}}
{{- $sizes := list -}}
{{- range $table.model.tensorParallelSizes }}{{ $sizes = append $sizes (toString .) }}{{ end -}}
{{- fail (printf "tensor-parallel size %d does not divide the model's heads (%s): use one of %s (engine.tensorParallelSize, or distributed.nodes x distributed.gpusPerNode for the tensor layout)" $tp (join ", " $heads) (join ", " $sizes)) -}}
{{- end -}}
{{- $perKv := index $perTp .Values.engine.kvCacheDtype | default dict -}}
{{- $entry := index $perKv $k | default dict -}}
{{- if not $entry -}}
{{- fail (printf "speculative.numSpeculativeTokens %s is out of range: use 1 to %v" $k $table.model.maxSpeculativeTokens) -}}
{{- end -}}
{{- toYaml $entry -}}
{{- end -}}

{{/* The block size to pass: the table's for "auto", else the user's, checked. The table is the
planner's (dflash_ops.plan.closed_form, written by make generate into files/block-sizes.yaml). */}}
{{- define "dflash-serve.blockSize" -}}
{{- $rule := include "dflash-serve.blockRule" . | fromYaml -}}
{{- $recommended := int $rule.recommended -}}
{{- $requested := .Values.engine.blockSize -}}
{{- if eq (toString $requested) "auto" -}}
{{- $recommended -}}
{{- else -}}
{{- $size := int $requested -}}
{{- $step := int $rule.step -}}
{{- if or (lt $size $recommended) (ne (mod $size $step) 0) -}}
{{- fail (printf "engine.blockSize %d would fail at startup on %s TP%s with k=%s: a valid block size is a multiple of %d (kernel alignment %d, QSA ring capacity %d) and at least %d. Use %d, or \"auto\"." $size .Values.gpu.type (include "dflash-serve.tp" .) (include "dflash-serve.k" .) $step (int $rule.alignment) (int $rule.ring) $recommended $recommended) -}}
{{- end -}}
{{- $size -}}
{{- end -}}
{{- end -}}

{{/* --prefix-match-unit: it must divide every cached group's block (the block size) and
land on whole compressed states, QSA's or the DSA indexer's pools (vLLM 0.33.0
resolve_kv_cache_block_sizes). */}}
{{- define "dflash-serve.prefixMatchUnit" -}}
{{- $unit := .Values.engine.prefixMatchUnit -}}
{{- if not (kindIs "invalid" $unit) -}}
{{- $block := int (include "dflash-serve.blockSize" .) -}}
{{- $profile := include "dflash-serve.modelProfile" . | fromYaml -}}
{{- $ratio := int $profile.prefixMatchMultiple -}}
{{- $u := int $unit -}}
{{- if or (lt $u 1) (ne (mod $block $u) 0) (ne (mod $u $ratio) 0) -}}
{{- fail (printf "engine.prefixMatchUnit %d is not valid with block size %d: it must divide the block size and be a multiple of %s %d (e.g. 16), or null for whole-block hits" $u $block $profile.prefixMatchReason $ratio) -}}
{{- end -}}
{{- $u -}}
{{- end -}}
{{- end -}}

{{/* speculative.schedule as vLLM's num_speculative_tokens_per_batch_size (a JSON list), or
nothing: the rules of dflash_ops.speculative_schedule, each refusal naming the value and the fix. */}}
{{- define "dflash-serve.speculativeSchedule" -}}
{{- $text := trim (toString (.Values.speculative.schedule | default "")) -}}
{{- if $text -}}
{{- $maxK := int .Values.speculative.numSpeculativeTokens -}}
{{- $openEnd := int (.Files.Get "files/vocabulary.yaml" | fromYaml).scheduleOpenEnd -}}
{{- $example := "1-4:7;5-16:3;17-:0" -}}
{{- if eq .Values.speculative.method "off" -}}
{{- fail (printf "speculative.schedule %q is set but speculative.method is off: set a method or drop the schedule" $text) -}}
{{- end -}}
{{- if gt (int (include "dflash-serve.dp" .)) 1 -}}
{{- fail (printf "speculative.schedule %q with distributed.dataParallelSize %d: vLLM 0.33.0 turns a k schedule off with data parallelism; drop the schedule or use the tensor layout" $text (int (include "dflash-serve.dp" .))) -}}
{{- end -}}
{{- $entries := list -}}
{{- if hasPrefix "[" $text -}}
{{- range $e := fromJsonArray $text -}}
{{- if kindIs "string" $e -}}
{{- fail (printf "speculative.schedule %q is not a JSON list (%s): write [[1, 4, 7], [5, 16, 3]] or %s" $text $e $example) -}}
{{- end -}}
{{- $ok := and (kindIs "slice" $e) (eq (len $e) 3) -}}
{{- if $ok -}}{{- range $v := $e -}}{{- if not (and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v)) -}}{{- $ok = false -}}{{- end -}}{{- end -}}{{- end -}}
{{- if not $ok -}}
{{- fail (printf "speculative.schedule %q: entry %s is not [first, last, k] of whole numbers, e.g. [1, 4, 7] (or write %s)" $text (toJson $e) $example) -}}
{{- end -}}
{{- $entries = append $entries (list (int64 (index $e 0)) (int64 (index $e 1)) (int64 (index $e 2))) -}}
{{- end -}}
{{- else -}}
{{- range $p := regexSplit "[,;\\s]+" $text -1 -}}
{{- if not (regexMatch "^[0-9]+-[0-9]*:[0-9]+$" $p) -}}
{{- fail (printf "speculative.schedule entry %q is not FIRST-LAST:K (LAST may be left open), e.g. %s" $p $example) -}}
{{- end -}}
{{- $kv := splitList ":" $p -}}
{{- $bounds := splitList "-" (index $kv 0) -}}
{{- $lastText := index $bounds 1 -}}
{{- $end := $openEnd -}}
{{- if $lastText -}}{{- $end = atoi $lastText -}}{{- end -}}
{{- $entries = append $entries (list (int64 (atoi (index $bounds 0))) (int64 $end) (int64 (atoi (index $kv 1)))) -}}
{{- end -}}
{{- end -}}
{{- if not $entries -}}
{{- fail (printf "speculative.schedule %q must be a non-empty list of ranges, e.g. %s" $text $example) -}}
{{- end -}}
{{- $previous := 0 -}}
{{- range $e := $entries -}}
{{- $first := int (index $e 0) -}}{{- $last := int (index $e 1) -}}{{- $k := int (index $e 2) -}}
{{- if or (lt $first 1) (lt $last $first) -}}
{{- fail (printf "speculative.schedule %q: range %d-%d is empty or not positive: give FIRST <= LAST, from 1" $text $first $last) -}}
{{- end -}}
{{- if or (lt $k 0) (gt $k $maxK) -}}
{{- fail (printf "speculative.schedule %q: range %d-%d drafts %d: k must be 0 (plain decoding) to speculative.numSpeculativeTokens %d; raise numSpeculativeTokens or lower this k" $text $first $last $k $maxK) -}}
{{- end -}}
{{- if and $previous (le $first $previous) -}}
{{- fail (printf "speculative.schedule %q: range %d-%d starts at or before the end of the range before it: give the ranges in ascending order, each batch size in one range" $text $first $last) -}}
{{- end -}}
{{- $previous = $last -}}
{{- end -}}
{{- $start := int (index (first $entries) 0) -}}
{{- if ne $start 1 -}}
{{- fail (printf "speculative.schedule %q starts at batch size %d: the first range starts at 1, so every batch size has a k" $text $start) -}}
{{- end -}}
{{- toJson $entries -}}
{{- end -}}
{{- end -}}

{{/* vLLM's --speculative-config for speculative.method and k (with the schedule), as
dflash_ops.speculative_config builds it for the planner, the local stack and the GPU check. */}}
{{- define "dflash-serve.speculativeConfig" -}}
{{- $method := .Values.speculative.method -}}
{{- $k := int .Values.speculative.numSpeculativeTokens -}}
{{- $spec := dict -}}
{{- if eq $method "dflash" -}}
{{- $spec = dict "method" "dflash" "model" .Values.speculative.draftModel "num_speculative_tokens" $k -}}
{{- else if eq $method "mtp" -}}
{{- $spec = dict "method" "mtp" "num_speculative_tokens" $k -}}
{{- else if eq $method "ngram" -}}
{{- $spec = dict "method" "ngram" "num_speculative_tokens" $k "prompt_lookup_max" 4 "prompt_lookup_min" 2 -}}
{{- end -}}
{{- $schedule := include "dflash-serve.speculativeSchedule" . -}}
{{- if $schedule -}}
{{- $_ := set $spec "num_speculative_tokens_per_batch_size" (fromJsonArray $schedule) -}}
{{- end -}}
{{- if $spec -}}{{- toJson $spec -}}{{- end -}}
{{- end -}}

{{/* Arguments of `vllm serve` (the model is its positional argument). */}}
{{- define "dflash-serve.engineArgs" -}}
- {{ .Values.model.name | quote }}
- --served-model-name
- {{ .Values.model.servedName | quote }}
- --host
- {{ ternary "127.0.0.1" "0.0.0.0" (not (empty (include "dflash-serve.engineDoor" .))) | quote }}
- --port
- {{ include "dflash-serve.vllmPort" . | quote }}
- --tensor-parallel-size
- {{ include "dflash-serve.tp" . | quote }}
{{- if .Values.distributed.enabled }}
- --distributed-executor-backend
- ray
{{- if eq .Values.distributed.layout "data" }}
- --data-parallel-size
- {{ include "dflash-serve.dp" . | quote }}
- --data-parallel-backend
- ray
{{- end }}
{{- end }}
{{- if .Values.engine.expertParallel }}
- --enable-expert-parallel
{{- end }}
- --mamba-cache-mode
- align
- --block-size
- {{ include "dflash-serve.blockSize" . | quote }}
{{- with include "dflash-serve.prefixMatchUnit" . }}
- --prefix-match-unit
- {{ . | quote }}
{{- end }}
{{- if ne .Values.engine.kvCacheDtype "auto" }}
- --kv-cache-dtype
- {{ .Values.engine.kvCacheDtype | quote }}
{{- end }}
- --max-model-len
- {{ .Values.model.maxModelLen | quote }}
- --gpu-memory-utilization
- {{ .Values.model.gpuMemoryUtilization | quote }}
{{- with include "dflash-serve.reasoningParser" . }}
- --reasoning-parser
- {{ . | quote }}
{{- end }}
{{- with include "dflash-serve.toolCallParser" . }}
- --enable-auto-tool-choice
- --tool-call-parser
- {{ . | quote }}
{{- end }}
{{- if ne .Values.speculative.method "off" }}
- --speculative-config
- {{ include "dflash-serve.speculativeConfig" . | quote }}
{{- end }}
{{- if (include "dflash-serve.modelProfile" . | fromYaml).engram }}
- --engram-config
- {{ dict "cpu_offload" .Values.model.pleCpuOffload | toJson | quote }}
{{- end }}
- --shutdown-timeout
- {{ include "dflash-serve.shutdownTimeout" . | quote }}
{{- if include "dflash-serve.engineScaleOut" . }}
- --enable-scale-out
{{- end }}
{{- range .Values.model.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* vLLM's --shutdown-timeout: what the grace period leaves after the preStop sleep, minus 10 s
for the engine to exit before the kubelet's SIGKILL. */}}
{{- define "dflash-serve.shutdownTimeout" -}}
{{- $t := .Values.termination -}}
{{- $drain := sub (sub (int $t.gracePeriodSeconds) (int $t.preStopSeconds)) 10 -}}
{{- if lt $drain 1 -}}
{{- fail (printf "termination.gracePeriodSeconds %d leaves no time to drain after termination.preStopSeconds %d: it must exceed preStopSeconds + 10 (e.g. %d)" (int $t.gracePeriodSeconds) (int $t.preStopSeconds) (add (int $t.preStopSeconds) 70)) -}}
{{- end -}}
{{- $drain -}}
{{- end -}}

{{/* Seconds the Deployment controller waits for a rollout to make progress before it reports
ProgressDeadlineExceeded (which `helm install --wait` and Argo CD read as failed): the pods'
startup budget, the model download's, and 15 minutes to schedule and pull the images. */}}
{{- define "dflash-serve.progressDeadlineSeconds" -}}
{{- $seconds := add (int (include "dflash-serve.startupBudgetSeconds" .)) 900 -}}
{{- if include "dflash-serve.modelDownload" . -}}
{{- $seconds = add $seconds (int .Values.modelDownload.budgetSeconds) -}}
{{- end -}}
{{- $seconds -}}
{{- end -}}

{{/* "true" when the model cache is filled by the model-download init container. */}}
{{- define "dflash-serve.modelDownload" -}}
{{- if and .Values.modelDownload.enabled .Values.modelCache.enabled -}}true{{- end -}}
{{- end -}}

{{/* The GPU products the pods may land on: gpu.products, else the usual ones of gpu.type. */}}
{{- define "dflash-serve.gpuProducts" -}}
{{- $known := dict
  "a100" (list "NVIDIA-A100-SXM4-80GB" "NVIDIA-A100-80GB-PCIe")
  "h100" (list "NVIDIA-H100-80GB-HBM3" "NVIDIA-H100-PCIe" "NVIDIA-H100-NVL")
  "h200" (list "NVIDIA-H200" "NVIDIA-H200-NVL")
  "b200" (list "NVIDIA-B200")
-}}
{{- toYaml (.Values.gpu.products | default (get $known .Values.gpu.type) | default list) -}}
{{- end -}}

{{/* The Ray version of the engine image (docker/ray-version.txt, copied into files/ by
`make generate`): the engine image installs ray[default] at exactly this version. */}}
{{- define "dflash-serve.imageRayVersion" -}}
{{- (.Files.Get "files/engine-image.yaml" | fromYaml).rayVersion -}}
{{- end -}}

{{- define "dflash-serve.rayScriptsChecksum" -}}
{{- $all := "" -}}
{{- range $path, $_ := .Files.Glob "files/ray/*" }}{{ $all = print $all ($.Files.Get $path) }}{{ end -}}
{{- $all | sha256sum | trunc 16 -}}
{{- end -}}

{{/* Size of the pod's /tmp: scratch, or with modelCache.enabled: false the model cache's size
(the Hugging Face cache with the weights lives there). Requested as ephemeral storage. */}}
{{- define "dflash-serve.scratchSize" -}}
{{- if .Values.modelCache.enabled -}}{{ .Values.scratch.sizeLimit }}{{- else -}}{{ .Values.modelCache.size }}{{- end -}}
{{- end -}}
