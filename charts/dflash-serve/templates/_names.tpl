{{/* Names, labels and references. All helpers live in the dflash-serve.* namespace. */}}

{{- define "dflash-serve.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dflash-serve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dflash-serve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dflash-serve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The pods that serve the API (not Ray workers): what the Service, PDB and monitors select. */}}
{{- define "dflash-serve.engineSelectorLabels" -}}
{{ include "dflash-serve.selectorLabels" . }}
dflash-serve.io/component: engine
{{- end -}}

{{/* Labels of pod templates: only what does not change between chart releases, so a chart
upgrade that changes no pod setting restarts no engine (no chart version, no app version). */}}
{{- define "dflash-serve.podLabels" -}}
{{ include "dflash-serve.selectorLabels" . }}
app.kubernetes.io/part-of: dflash-serve
dflash-serve.io/role: {{ .Values.role | quote }}
{{- end -}}

{{- define "dflash-serve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "dflash-serve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dflash-serve
dflash-serve.io/role: {{ .Values.role | quote }}
{{- end -}}

{{- define "dflash-serve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dflash-serve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The model-cache claim. A ReadWriteMany cache gets its own name: a claim's access modes are
immutable, so a single-node -> Ray upgrade creates a new claim instead of failing to patch the
old one (which `helm.sh/resource-policy: keep` leaves in place). */}}
{{- define "dflash-serve.cacheClaim" -}}
{{- if .Values.modelCache.existingClaim -}}
{{- .Values.modelCache.existingClaim -}}
{{- else if has "ReadWriteMany" .Values.modelCache.accessModes -}}
{{- printf "%s-model-cache-rwx" (include "dflash-serve.fullname" .) -}}
{{- else -}}
{{- printf "%s-model-cache" (include "dflash-serve.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The headless Service that lists every serving pod. */}}
{{- define "dflash-serve.podsService" -}}
{{- printf "%s-pods" (include "dflash-serve.fullname" . | trunc 58 | trimSuffix "-") -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest pins the image. */}}
{{- define "dflash-serve.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* NetworkPolicy: networkPolicy.enabled true/false, or auto: on in the distributed layout,
whose Ray ports run code for whoever reaches them, and whenever a key or the router guards the
service (the engines then admit only the router, the tests and Prometheus). */}}
{{- define "dflash-serve.networkPolicy" -}}
{{- $enabled := toString .Values.networkPolicy.enabled -}}
{{- $auto := or .Values.distributed.enabled .Values.auth.apiKeySecret.name .Values.router.enabled -}}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") $auto) -}}true{{- end -}}
{{- end -}}

{{/* NetworkPolicy peers of a client port: the release namespace, the namespaces allowed, the
addresses outside the cluster allowed. */}}
{{- define "dflash-serve.clientPeers" -}}
- podSelector: {}
{{- with .Values.networkPolicy.allowedNamespaceLabels }}
- namespaceSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- range .Values.networkPolicy.ingressCIDRs }}
- ipBlock:
    cidr: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The router (router.enabled): its objects' name, and the labels of its pods. */}}
{{- define "dflash-serve.routerName" -}}
{{- printf "%s-router" (include "dflash-serve.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{- define "dflash-serve.routerSelectorLabels" -}}
{{ include "dflash-serve.selectorLabels" . }}
dflash-serve.io/component: router
{{- end -}}

{{/* cache_aware tokenizes each request through the engines' render endpoints, which vLLM only
serves with --enable-scale-out (403 otherwise, and the router then routes blind). */}}
{{- define "dflash-serve.engineScaleOut" -}}
{{- if and .Values.router.enabled (eq .Values.router.policy "cache_aware") -}}true{{- end -}}
{{- end -}}

{{/* The door (files/door): nginx in front of vLLM in each engine pod when auth is on, and in
front of the router in each router pod. What it guards then listens on loopback only. */}}
{{- define "dflash-serve.engineDoor" -}}
{{- if .Values.auth.apiKeySecret.name -}}true{{- end -}}
{{- end -}}

{{- define "dflash-serve.routerDoor" -}}
{{- if .Values.router.enabled -}}true{{- end -}}
{{- end -}}

{{/* Where vLLM listens in its pod: behind the door on loopback, else on engine.port. */}}
{{- define "dflash-serve.vllmPort" -}}
{{- if include "dflash-serve.engineDoor" . -}}{{ int .Values.door.upstreamPort }}{{- else -}}{{ int .Values.engine.port }}{{- end -}}
{{- end -}}

{{- define "dflash-serve.doorConfigMap" -}}
{{- printf "%s-door-%s" (include "dflash-serve.fullname" .root) .role -}}
{{- end -}}

{{/* A name with a suffix, the prefix cut so that the whole fits in 63 characters (a DNS label):
names near the limit keep their suffixes and stay distinct. Call with (list PREFIX SUFFIX). */}}
{{- define "dflash-serve.suffixed" -}}
{{- $prefix := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" ($prefix | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}
