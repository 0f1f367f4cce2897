{{/* Value combinations the chart refuses, each with the value to change and how. */}}

{{- define "dflash-serve.validate" -}}
{{- $method := .Values.speculative.method -}}
{{- if not (has $method (list "dflash" "mtp" "ngram" "off")) -}}
{{- fail (printf "speculative.method %q is unknown: use dflash, mtp, ngram or off" $method) -}}
{{- end -}}
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
{{- if .Values.podDisruptionBudget.enabled -}}
{{- $max := toString .Values.podDisruptionBudget.maxUnavailable -}}
{{- if or (eq $max "0") (eq $max "0%") -}}
{{- fail "podDisruptionBudget.maxUnavailable 0 blocks every node drain forever: use 1 (or a percentage above 0%), or set podDisruptionBudget.enabled: false" -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.rollout.strategy (list "Recreate" "RollingUpdate")) -}}
{{- fail (printf "rollout.strategy %q is unknown: use Recreate or RollingUpdate" .Values.rollout.strategy) -}}
{{- end -}}
{{- end -}}
