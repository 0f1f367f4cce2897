{{/* Containers and volumes shared by the Deployment and the RayCluster head. */}}

{{/* Environment of every container that runs vLLM code (engine, Ray head and Ray workers). */}}
{{/* VLLM_API_KEY from auth.apiKeySecret: what the helm tests send, and the router for its own
calls to the engines. vLLM itself gets no key: it listens on loopback behind the door, which
checks the keys. Never an argument: arguments show in the pod spec and the process list. */}}
{{- define "dflash-serve.apiKeyEnv" -}}
{{- with .Values.auth.apiKeySecret }}
{{- if .name }}
- name: VLLM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .name | quote }}
      key: {{ .key | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "dflash-serve.engineEnv" -}}
{{- $root := include "dflash-serve.cacheRoot" . -}}
- name: HOME
  value: /tmp
- name: HF_HOME
  value: {{ printf "%s/huggingface" $root | quote }}
- name: VLLM_CACHE_ROOT
  value: {{ printf "%s/vllm-cache" $root | quote }}
{{- if .Values.distributed.enabled }}
# vLLM's Ray executor advertises this address to the other nodes (the pod IP).
- name: VLLM_HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- if .Values.model.hfTokenSecret.name }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.model.hfTokenSecret.name | quote }}
      key: {{ .Values.model.hfTokenSecret.key | quote }}
{{- end }}
{{- with .Values.model.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The container that runs vLLM code, by role: "server" runs `vllm serve` (the Deployment),
"ray-head" starts Ray, waits for the workers, then runs `vllm serve` (ray-head.sh), and
"ray-worker" only lends its GPUs (no command: KubeRay runs its own `ray start --block`).
Call with (dict "root" $ "role" ROLE). */}}
{{- define "dflash-serve.engineContainer" -}}
{{- $role := .role -}}
{{- with .root -}}
{{- $d := .Values.distributed -}}
{{- $tp := int (include "dflash-serve.gpusPerPod" .) -}}
- name: {{ get (dict "server" "vllm" "ray-head" "ray-head" "ray-worker" "ray-worker") $role }}
  image: {{ include "dflash-serve.image" .Values.image.engine | quote }}
  imagePullPolicy: {{ .Values.image.engine.pullPolicy | quote }}
  {{- if eq $role "server" }}
  command: ["vllm", "serve"]
  args:
    {{- include "dflash-serve.engineArgs" . | nindent 4 }}
  {{- else if eq $role "ray-head" }}
  command: ["/bin/bash", "/etc/dflash-serve/ray/ray-head.sh"]
  args:
    - vllm
    - serve
    {{- include "dflash-serve.engineArgs" . | nindent 4 }}
  {{- end }}
  {{- with .Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    {{- include "dflash-serve.engineEnv" . | nindent 4 }}
    {{- if eq $role "ray-head" }}
    - name: DFLASH_RAY_EXPECTED_NODES
      value: {{ int $d.nodes | quote }}
    - name: DFLASH_RAY_EXPECTED_GPUS
      value: {{ mul (int $d.nodes) (int $d.gpusPerNode) | quote }}
    - name: DFLASH_RAY_JOIN_TIMEOUT_S
      value: {{ int $d.joinTimeoutSeconds | quote }}
    {{- end }}
  {{- if eq $role "ray-worker" }}
  # Explicit probes keep KubeRay from injecting its own, which call Ray's dashboard agent.
  livenessProbe:
    exec:
      command: ["python3", "/etc/dflash-serve/ray/raylet-alive.py"]
    initialDelaySeconds: 30
    periodSeconds: 10
    failureThreshold: 6
    timeoutSeconds: 5
  readinessProbe:
    exec:
      command: ["python3", "/etc/dflash-serve/ray/raylet-alive.py"]
    periodSeconds: 10
    timeoutSeconds: 5
  {{- end }}
  {{- if ne $role "ray-worker" }}
  # Endpoints drop a terminating pod while this runs, so no new request arrives once vLLM,
  # on SIGTERM, stops accepting them and drains (--shutdown-timeout).
  lifecycle:
    preStop:
      exec:
        command: ["sleep", {{ .Values.termination.preStopSeconds | quote }}]
  {{- if or (not (include "dflash-serve.engineDoor" .)) (eq $role "ray-head") }}
  ports:
    {{- if not (include "dflash-serve.engineDoor" .) }}
    - name: http
      containerPort: {{ .Values.engine.port }}
      protocol: TCP
    {{- end }}
    {{- if eq $role "ray-head" }}
    - name: gcs
      containerPort: 6379
      protocol: TCP
    {{- end }}
  {{- end }}
  # vLLM binds its port only once the weights are loaded: the startup probe carries the cold load
  # (on the Ray head, after every worker has joined). By number: behind the door, the port is
  # the door's (vLLM listens on loopback, which the kubelet cannot reach).
  startupProbe:
    httpGet:
      path: /health
      port: {{ .Values.engine.port }}
    periodSeconds: {{ .Values.probes.startup.periodSeconds }}
    {{- $failures := int .Values.probes.startup.failureThreshold }}
    {{- if eq $role "ray-head" }}
    {{- $period := int .Values.probes.startup.periodSeconds }}
    {{- $failures = add $failures (div (add (int $d.joinTimeoutSeconds) (sub $period 1)) $period) }}
    {{- end }}
    failureThreshold: {{ $failures }}
  # Liveness and readiness are answered by the sidecar (same network namespace, so its port
  # number reaches it; a port *name* would only resolve among this container's own ports).
  # /livez/engine fails when /health has failed, or the engine answered /health without
  # generating, for longer than the sidecar's grace (probes.liveness).
  livenessProbe:
    httpGet:
      path: /livez/engine
      port: {{ .Values.sidecar.port }}
    periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
    failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
    timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
  # /readyz: /health answers 200 AND the engine generates (vLLM can answer /health while its
  # engine core is dead).
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .Values.sidecar.port }}
    periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
    failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
    timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
  {{- end }}
  resources:
    {{- $res := deepCopy .Values.resources.engine }}
    {{- $scratch := include "dflash-serve.scratchSize" . }}
    {{- $_ := set $res "requests" (merge (dict .Values.gpu.resourceName $tp "ephemeral-storage" $scratch) ($res.requests | default dict)) }}
    {{- $_ := set $res "limits" (merge (dict .Values.gpu.resourceName $tp) ($res.limits | default dict)) }}
    {{- toYaml $res | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      {{- with .Values.engineCapabilities }}
      add:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- if .Values.modelCache.enabled }}
    - name: model-cache
      mountPath: {{ .Values.modelCache.mountPath | quote }}
    {{- end }}
    {{- if gt (mul (int (include "dflash-serve.tp" .)) (int (include "dflash-serve.dp" .))) 1 }}
    - name: dshm
      mountPath: /dev/shm
    {{- end }}
    {{- if ne $role "server" }}
    - name: ray-scripts
      mountPath: /etc/dflash-serve/ray
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
{{- end -}}

{{/* The sidecar: each of its settings (dflash_sidecar.settings) as DFLASH_SIDECAR_NAME from
sidecar.nameInCamelCase, the limits it refuses checked at render from files/sidecar-rules.yaml. */}}
{{- define "dflash-serve.sidecarContainer" -}}
- name: sidecar
  image: {{ include "dflash-serve.image" .Values.image.sidecar | quote }}
  imagePullPolicy: {{ .Values.image.sidecar.pullPolicy | quote }}
  args:
    - sidecar
    - --engine-url
    - {{ printf "http://127.0.0.1:%s" (include "dflash-serve.vllmPort" .) | quote }}
    - --port
    - {{ .Values.sidecar.port | quote }}
    - --served-model
    - {{ .Values.model.servedName | quote }}
  env:
    - name: DFLASH_SIDECAR_SCRAPE_INTERVAL
      value: {{ .Values.sidecar.scrapeInterval | quote }}
    - name: DFLASH_SIDECAR_SCRAPE_TIMEOUT
      value: {{ .Values.sidecar.scrapeTimeout | quote }}
    - name: DFLASH_SIDECAR_WINDOWS
      value: {{ .Values.sidecar.windows | quote }}
    - name: DFLASH_SIDECAR_VERDICT_WINDOW
      value: {{ .Values.sidecar.verdictWindow | quote }}
    - name: DFLASH_SIDECAR_CANARY_INTERVAL
      value: {{ .Values.sidecar.canaryInterval | quote }}
    - name: DFLASH_SIDECAR_LOG_LEVEL
      value: {{ .Values.sidecar.logLevel | quote }}
    - name: DFLASH_SIDECAR_ENGINE_DOWN_GRACE
      value: {{ .Values.probes.liveness.engineDownSeconds | quote }}
    - name: DFLASH_SIDECAR_NOT_GENERATING_GRACE
      value: {{ .Values.probes.liveness.notGeneratingSeconds | quote }}
    - name: DFLASH_SIDECAR_STARTUP_BUDGET
      value: {{ include "dflash-serve.startupBudgetSeconds" . | quote }}
    {{- if ne .Values.speculative.method "off" }}
    - name: DFLASH_SIDECAR_SPECULATIVE_TOKENS
      value: {{ include "dflash-serve.k" . | quote }}
    {{- end }}
    {{- with include "dflash-serve.speculativeSchedule" . }}
    # The k schedule in force: the schedule recommendation compares with it.
    - name: DFLASH_SIDECAR_SPECULATIVE_SCHEDULE
      value: {{ . | quote }}
    {{- end }}
    - name: DFLASH_SIDECAR_MIN_DRAFTS
      value: {{ .Values.sidecar.thresholds.minDrafts | quote }}
    {{- if .Values.sidecar.baseline }}
    # The baseline sets the four acceptance thresholds (sidecar.baseline).
    - name: DFLASH_SIDECAR_BASELINE_FILE
      value: /etc/dflash-sidecar/baseline.yaml
    {{- else }}
    - name: DFLASH_SIDECAR_COLLAPSED_MEAN_ACCEPTANCE_LENGTH
      value: {{ .Values.sidecar.thresholds.collapsedMeanAcceptanceLength | quote }}
    - name: DFLASH_SIDECAR_DEGRADED_MEAN_ACCEPTANCE_LENGTH
      value: {{ .Values.sidecar.thresholds.degradedMeanAcceptanceLength | quote }}
    - name: DFLASH_SIDECAR_COLLAPSED_POSITION0
      value: {{ .Values.sidecar.thresholds.collapsedPosition0 | quote }}
    - name: DFLASH_SIDECAR_DEGRADED_POSITION0
      value: {{ .Values.sidecar.thresholds.degradedPosition0 | quote }}
    {{- end }}
    {{- if .Values.sidecar.kubernetesEvents }}
    - name: DFLASH_SIDECAR_KUBERNETES_EVENTS
      value: "true"
    - name: DFLASH_SIDECAR_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: DFLASH_SIDECAR_POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- end }}
  {{- if .Values.sidecar.baseline }}
  volumeMounts:
    - name: sidecar-baseline
      mountPath: /etc/dflash-sidecar
      readOnly: true
  {{- end }}
  ports:
    - name: sidecar
      containerPort: {{ .Values.sidecar.port }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /livez
      port: sidecar
    periodSeconds: 10
  readinessProbe:
    httpGet:
      path: /livez
      port: sidecar
    periodSeconds: 10
  resources:
    {{- toYaml .Values.resources.sidecar | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
{{- end -}}

{{- define "dflash-serve.volumes" -}}
{{- $parallel := mul (int (include "dflash-serve.tp" .)) (int (include "dflash-serve.dp" .)) -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ include "dflash-serve.scratchSize" . | quote }}
{{- if .Values.modelCache.enabled }}
- name: model-cache
  persistentVolumeClaim:
    claimName: {{ include "dflash-serve.cacheClaim" . }}
{{- end }}
{{- if include "dflash-serve.modelDownload" . }}
- name: model-download
  configMap:
    name: {{ include "dflash-serve.fullname" . }}-model-download
    defaultMode: 0555
{{- end }}
{{- if gt $parallel 1 }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit | quote }}
{{- end }}
{{- if .Values.sidecar.baseline }}
- name: sidecar-baseline
  configMap:
    name: {{ include "dflash-serve.fullname" . }}-sidecar-baseline
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Node affinity: the GPU product term (gpu.productAffinity), ANDed with a user's own
required terms (added to each of them) and beside their preferred ones. */}}
{{- define "dflash-serve.placement" -}}
{{- $gpu := dict "key" .Values.gpu.productLabel "operator" "In" "values" (include "dflash-serve.gpuProducts" . | fromYamlArray) -}}
{{- $node := deepCopy (.Values.affinity.nodeAffinity | default dict) -}}
{{- if .Values.gpu.productAffinity -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range (get $required "nodeSelectorTerms" | default (list dict)) -}}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" (append (get . "matchExpressions" | default list) $gpu)) -}}
{{- end -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" (set $required "nodeSelectorTerms" $terms) -}}
{{- end -}}
{{- if or $node .Values.affinity.podAntiAffinity .Values.affinity.podAffinity }}
affinity:
  {{- with $node }}
  nodeAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity.podAntiAffinity }}
  podAntiAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity.podAffinity }}
  podAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . | quote }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
# Service environment variables off: a Service named `vllm` in the namespace would inject
# VLLM_PORT=tcp://..., which vLLM refuses.
enableServiceLinks: false
{{- end -}}

{{/* The init container that fills the model cache (modelDownload): the engine's image, env and
cache mounts, the release's models as arguments. */}}
{{- define "dflash-serve.modelDownloadContainer" -}}
- name: model-download
  image: {{ include "dflash-serve.image" .Values.image.engine | quote }}
  imagePullPolicy: {{ .Values.image.engine.pullPolicy | quote }}
  command: ["python3", "/etc/dflash-serve/model-download/download-models.py"]
  args:
    - {{ .Values.model.name | quote }}
    {{- if and (eq .Values.speculative.method "dflash") .Values.speculative.draftModel }}
    - {{ .Values.speculative.draftModel | quote }}
    {{- end }}
  env:
    {{- include "dflash-serve.engineEnv" . | nindent 4 }}
  resources:
    {{- toYaml .Values.modelDownload.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: model-cache
      mountPath: {{ .Values.modelCache.mountPath | quote }}
    - name: model-download
      mountPath: /etc/dflash-serve/model-download
      readOnly: true
{{- end -}}
