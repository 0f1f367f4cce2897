{{/* Containers and volumes shared by the Deployment and the RayCluster head. */}}

{{- define "dflash-serve.engineContainer" -}}
{{- $tp := int (include "dflash-serve.gpusPerPod" .) -}}
- name: vllm
  image: "{{ .Values.image.engine.repository }}:{{ .Values.image.engine.tag }}"
  imagePullPolicy: {{ .Values.image.engine.pullPolicy }}
  command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]
  args:
    {{- include "dflash-serve.engineArgs" . | nindent 4 }}
  env:
    - name: HOME
      value: /tmp
    - name: HF_HOME
      value: {{ printf "%s/huggingface" .Values.modelCache.mountPath | quote }}
    - name: VLLM_CACHE_ROOT
      value: {{ printf "%s/vllm-cache" .Values.modelCache.mountPath | quote }}
    {{- if .Values.model.pleCpuOffload }}
    - name: VLLM_PLE_CPU_OFFLOAD
      value: "1"
    {{- end }}
    {{- if .Values.model.hfTokenSecret.name }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.model.hfTokenSecret.name }}
          key: {{ .Values.model.hfTokenSecret.key }}
    {{- end }}
    {{- with .Values.model.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: http
      containerPort: {{ .Values.engine.port }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /health
      port: http
    periodSeconds: {{ .Values.probes.startup.periodSeconds }}
    failureThreshold: {{ .Values.probes.startup.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /health
      port: http
    periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
    failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
    timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
  readinessProbe:
    # Through the sidecar: /health can answer 200 while the engine core is dead.
    httpGet:
      path: /readyz
      port: sidecar
    periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
    failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
    timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
  resources:
    {{- $res := deepCopy .Values.resources.engine }}
    {{- $_ := set $res "requests" (merge (dict .Values.gpu.resourceName $tp) ($res.requests | default dict)) }}
    {{- $_ := set $res "limits" (merge (dict .Values.gpu.resourceName $tp) ($res.limits | default dict)) }}
    {{- toYaml $res | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- if .Values.modelCache.enabled }}
    - name: model-cache
      mountPath: {{ .Values.modelCache.mountPath }}
    {{- end }}
    {{- if gt (mul (int (include "dflash-serve.tp" .)) (int (include "dflash-serve.dp" .))) 1 }}
    - name: dshm
      mountPath: /dev/shm
    {{- end }}
{{- end -}}

{{- define "dflash-serve.sidecarContainer" -}}
- name: sidecar
  image: "{{ .Values.image.sidecar.repository }}:{{ .Values.image.sidecar.tag }}"
  imagePullPolicy: {{ .Values.image.sidecar.pullPolicy }}
  args:
    - sidecar
    - --engine-url
    - {{ printf "http://127.0.0.1:%d" (int .Values.engine.port) | quote }}
    - --port
    - {{ .Values.sidecar.port | quote }}
    - --served-model
    - {{ .Values.model.servedName | quote }}
  env:
    - name: DFLASH_SIDECAR_SCRAPE_INTERVAL_S
      value: {{ .Values.sidecar.scrapeInterval | quote }}
    - name: DFLASH_SIDECAR_WINDOWS
      value: {{ .Values.sidecar.windows | quote }}
    - name: DFLASH_SIDECAR_COLLAPSED_MEAN_ACCEPTANCE_LENGTH
      value: {{ .Values.sidecar.thresholds.collapsedMeanAcceptanceLength | quote }}
    - name: DFLASH_SIDECAR_DEGRADED_MEAN_ACCEPTANCE_LENGTH
      value: {{ .Values.sidecar.thresholds.degradedMeanAcceptanceLength | quote }}
    - name: DFLASH_SIDECAR_COLLAPSED_POSITION0
      value: {{ .Values.sidecar.thresholds.collapsedPosition0 | quote }}
    - name: DFLASH_SIDECAR_DEGRADED_POSITION0
      value: {{ .Values.sidecar.thresholds.degradedPosition0 | quote }}
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
  emptyDir: {}
{{- if .Values.modelCache.enabled }}
- name: model-cache
  persistentVolumeClaim:
    claimName: {{ include "dflash-serve.cacheClaim" . }}
{{- end }}
{{- if gt $parallel 1 }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit }}
{{- end }}
{{- end -}}


{{- define "dflash-serve.placement" -}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: {{ .Values.gpu.productLabel }}
              operator: In
              values:
                {{- toYaml .Values.gpu.products | nindent 16 }}
  {{- with .Values.affinity.podAntiAffinity }}
  podAntiAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity.podAffinity }}
  podAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
