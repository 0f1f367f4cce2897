{{/* The door: nginx in front of vLLM or the router in the same pod (its container, volumes and
files); dflash_ops.local.door writes the same files for the local stack. */}}

{{/* The door in front of vLLM ("engine") or the router ("router") in the same pod: it owns the
pod's client port (named http) and stops like them: the preStop sleep lets endpoints drop the
pod, then a graceful stop finishes the requests in flight before it exits. Call with
(dict "root" $ "role" ROLE). */}}
{{- define "dflash-serve.doorContainer" -}}
{{- $role := .role -}}
{{- with .root -}}
{{- $nginx := "nginx -p /tmp/ -c /etc/dflash-door/nginx.conf -e stderr" -}}
- name: door
  image: {{ include "dflash-serve.image" .Values.door.image | quote }}
  imagePullPolicy: {{ .Values.door.image.pullPolicy | quote }}
  command: ["nginx", "-p", "/tmp/", "-c", "/etc/dflash-door/nginx.conf", "-e", "stderr"]
  ports:
    - name: http
      containerPort: {{ ternary .Values.router.port .Values.engine.port (eq $role "router") }}
      protocol: TCP
  lifecycle:
    preStop:
      exec:
        command:
          - /bin/sh
          - -c
          - {{ printf "sleep %d; %s -s quit; while [ -e /tmp/door.pid ]; do sleep 1; done" (int .Values.termination.preStopSeconds) $nginx | quote }}
  livenessProbe:
    tcpSocket:
      port: http
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    tcpSocket:
      port: http
    periodSeconds: 5
  resources:
    {{- toYaml .Values.door.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
  volumeMounts:
    - name: door-tmp
      mountPath: /tmp
    - name: door-conf
      mountPath: /etc/dflash-door
      readOnly: true
    {{- if .Values.auth.apiKeySecret.name }}
    - name: door-keys
      mountPath: /etc/dflash-door-keys
      readOnly: true
    {{- end }}
{{- end -}}
{{- end -}}

{{/* The door's volumes: its writable /tmp, its configuration, the keys (the whole Secret:
the door reads auth.apiKeySecret.key and nextKey from it; nextKey may be missing). */}}
{{- define "dflash-serve.doorVolumes" -}}
{{- $role := .role -}}
{{- with .root -}}
- name: door-tmp
  emptyDir:
    sizeLimit: 256Mi
- name: door-conf
  configMap:
    name: {{ include "dflash-serve.doorConfigMap" (dict "root" . "role" $role) }}
    items:
      - {key: nginx.conf, path: nginx.conf}
      - {key: door.js, path: door.js}
      - {key: main.conf, path: door.d/main.conf}
      - {key: upstream.conf, path: door.d/upstream.conf}
      - {key: server.conf, path: door.d/server.conf}
      - {key: routes.map, path: door.d/routes.map}
{{- if .Values.auth.apiKeySecret.name }}
- name: door-keys
  secret:
    secretName: {{ .Values.auth.apiKeySecret.name | quote }}
    defaultMode: 0440
{{- end }}
{{- end -}}
{{- end -}}

{{/* The door's files for one role (templates/door.yaml), as YAML. Call with (dict "root" $ "role" ROLE). */}}
{{- define "dflash-serve.doorData" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $paths := $root.Files.Get "files/door/paths.yaml" | fromYaml -}}
{{- $routes := "" -}}
{{- range (get $paths.open $role) -}}
{{- $routes = printf "%s%s open;\n" $routes (include "dflash-serve.doorMapSource" .) -}}
{{- end -}}
{{- $keyed := concat $root.Values.door.keyedPaths $root.Values.door.extraKeyedPaths -}}
{{- if and (eq $role "engine") $root.Values.router.enabled (eq $root.Values.router.policy "cache_aware") -}}
{{- range $paths.routerRender -}}
{{- if not (has . $keyed) }}{{ $keyed = append $keyed . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range $keyed -}}
{{- $routes = printf "%s%s keyed;\n" $routes (include "dflash-serve.doorMapSource" .) -}}
{{- end -}}
{{- $keyNames := "" -}}
{{- if $root.Values.auth.apiKeySecret.name -}}
{{- $keyNames = printf "%s %s" $root.Values.auth.apiKeySecret.key $root.Values.auth.apiKeySecret.nextKey -}}
{{- end -}}
{{- $listen := ternary $root.Values.router.port $root.Values.engine.port (eq $role "router") | int -}}
{{- $timeout := int $root.Values.door.timeoutSeconds -}}
{{- $server := printf "listen 0.0.0.0:%d;\nset $dflash_keys_dir \"/etc/dflash-door-keys\";\nset $dflash_key_names \"%s\";\nproxy_read_timeout %ds;\nproxy_send_timeout %ds;\n" $listen $keyNames (int $timeout) (int $timeout) -}}
{{- $data := dict
    "nginx.conf" ($root.Files.Get "files/door/nginx.conf")
    "door.js" ($root.Files.Get "files/door/door.js")
    "main.conf" (printf "worker_shutdown_timeout %ds;\n" (int (include "dflash-serve.shutdownTimeout" $root)))
    "upstream.conf" (printf "server 127.0.0.1:%d;\n" (int $root.Values.door.upstreamPort))
    "server.conf" $server
    "routes.map" $routes
  -}}
{{- toYaml $data -}}
{{- end -}}

{{/* How the door's routes.map matches an allow-list path: a case-sensitive regex of the whole
path, where a {name} segment stands for any one segment (dflash_ops.local.door.map_source). nginx
matches a map's plain strings case-insensitively: /HEALTH would reach what stands behind. */}}
{{- define "dflash-serve.doorMapSource" -}}
{{- printf "~^%s$" (regexReplaceAll "\\{[^/}]+\\}" (replace "." "\\." .) "[^/]+") -}}
{{- end -}}
