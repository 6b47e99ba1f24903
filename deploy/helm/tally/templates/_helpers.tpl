{{/* Names and labels. */}}
{{- define "tally.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "tally.labels" -}}
app.kubernetes.io/name: tally
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of a component: include "tally.selector" (list . "edge") */}}
{{- define "tally.selector" -}}
app.kubernetes.io/name: tally
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "tally.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}{{ printf "%s@%s" .Values.image.repository .Values.image.digest }}{{- else -}}{{ printf "%s:%s" .Values.image.repository $tag }}{{- end -}}
{{- end -}}

{{- define "tally.secretName" -}}{{ default (printf "%s-secrets" (include "tally.fullname" .)) .Values.secrets.existingSecret }}{{- end -}}
{{- define "tally.natsSecretName" -}}{{ default (printf "%s-nats" (include "tally.fullname" .)) .Values.nats.existingSecret }}{{- end -}}
{{- define "tally.redisSecretName" -}}{{ default (printf "%s-redis" (include "tally.fullname" .)) .Values.redis.existingSecret }}{{- end -}}
{{- define "tally.natsName" -}}{{ printf "%s-nats" (include "tally.fullname" .) }}{{- end -}}

{{/* The NATS URLs: the bundled cluster's servers, or nats.url. */}}
{{- define "tally.natsURL" -}}
{{- if .Values.nats.bundled.enabled -}}
{{- $name := include "tally.natsName" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.bundled.replicas) -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless.%s.svc:4222" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- required "nats.url is required when nats.bundled.enabled is false" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* A listener's TLS settings in tally.yaml: (list . clientCertificates) */}}
{{- define "tally.listenerTLS" -}}
{{- $ := index . 0 -}}
{{- $t := dict "cert_file" "/etc/tally/tls/tls.crt" "key_file" "/etc/tally/tls/tls.key" -}}
{{- if and (index . 1) $.Values.tls.clientCertificates -}}{{- $_ := set $t "client_ca_file" "/etc/tally/tls/ca.crt" -}}{{- end -}}
{{- toJson $t -}}
{{- end -}}

{{/* A client's TLS settings (Redis, NATS) in tally.yaml, from a values section and where its Secret is mounted. */}}
{{- define "tally.clientTLS" -}}
{{- $v := index . 0 -}}{{- $dir := index . 1 -}}
{{- $t := dict "enabled" true -}}
{{- if $v.secretName -}}
{{- $_ := set $t "ca_file" (printf "%s/ca.crt" $dir) -}}
{{- end -}}
{{- if $v.clientCertificate -}}
{{- $_ := set $t "cert_file" (printf "%s/tls.crt" $dir) -}}{{- $_ := set $t "key_file" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- if $v.serverName -}}{{- $_ := set $t "server_name" $v.serverName -}}{{- end -}}
{{- toJson $t -}}
{{- end -}}

{{/* tally.yaml, from .Values.config and the chart's sections. */}}
{{- define "tally.config" -}}
{{- $c := deepCopy (omit .Values.config "edge" "accountant" "streams") -}}
{{- $redis := deepCopy .Values.redis.settings -}}
{{- $_ := set $redis "shards" .Values.redis.shards -}}
{{- if .Values.redis.tls.enabled -}}{{- $_ := set $redis "tls" (include "tally.clientTLS" (list .Values.redis.tls "/etc/tally/redis-tls") | fromJson) -}}{{- end -}}
{{- $_ := set $c "redis" $redis -}}
{{- $streams := deepCopy .Values.config.streams -}}
{{- if and .Values.nats.bundled.enabled (not (hasKey $streams "replicas")) -}}{{- $_ := set $streams "replicas" (min 3 (int .Values.nats.bundled.replicas)) -}}{{- end -}}
{{- $nats := dict "url" (include "tally.natsURL" .) -}}
{{- if $streams -}}{{- $_ := set $nats "streams" $streams -}}{{- end -}}
{{- if .Values.nats.tls.enabled -}}{{- $_ := set $nats "tls" (include "tally.clientTLS" (list .Values.nats.tls "/etc/tally/nats-tls") | fromJson) -}}{{- end -}}
{{- $_ := set $c "nats" $nats -}}
{{- $e := deepCopy .Values.config.edge -}}
{{- $tls := .Values.tls.enabled -}}
{{- $_ := set $e "admin_listen" (printf ":%d" (int .Values.edge.adminPort)) -}}
{{- if $tls -}}{{- $_ := set $e "admin_tls" (include "tally.listenerTLS" (list . false) | fromJson) -}}{{- end -}}
{{- if .Values.edge.proxy.enabled -}}
{{- $_ := set $e "listen" (printf ":%d" (int .Values.edge.proxy.port)) -}}
{{- $_ := set $e "upstream" (required "edge.proxy.upstream is required with edge.proxy.enabled" .Values.edge.proxy.upstream) -}}
{{- if $tls -}}{{- $_ := set $e "tls" (include "tally.listenerTLS" (list . false) | fromJson) -}}{{- end -}}
{{- end -}}
{{- if .Values.edge.api.enabled -}}
{{- $_ := set $e "api_listen" (printf ":%d" (int .Values.edge.api.port)) -}}
{{- if $tls -}}{{- $_ := set $e "api_tls" (include "tally.listenerTLS" (list . true) | fromJson) -}}{{- end -}}
{{- end -}}
{{- if .Values.edge.rls.enabled -}}
{{- $r := dict "listen" (printf ":%d" (int .Values.edge.rls.port)) "config" "/etc/tally/ratelimit" -}}
{{- if $tls -}}{{- $_ := set $r "tls" (include "tally.listenerTLS" (list . true) | fromJson) -}}{{- end -}}
{{- $_ := set $e "rls" (merge $r (default dict $e.rls)) -}}
{{- end -}}
{{- if .Values.edge.forwardAuth.enabled -}}
{{- $f := dict "listen" (printf ":%d" (int .Values.edge.forwardAuth.port)) "gateways" (required "edge.forwardAuth.gateways is required with edge.forwardAuth.enabled" .Values.edge.forwardAuth.gateways) -}}
{{- if $tls -}}{{- $_ := set $f "tls" (include "tally.listenerTLS" (list . true) | fromJson) -}}{{- end -}}
{{- $_ := set $e "forward_auth" (merge $f (default dict $e.forward_auth)) -}}
{{- end -}}
{{- $_ := set $c "edge" $e -}}
{{- $a := deepCopy .Values.config.accountant -}}
{{- $_ := set $a "admin_listen" (printf ":%d" (int .Values.accountant.adminPort)) -}}
{{- if $tls -}}{{- $_ := set $a "admin_tls" (include "tally.listenerTLS" (list . false) | fromJson) -}}{{- end -}}
{{- $_ := set $c "accountant" $a -}}
{{- toYaml $c -}}
{{- end -}}

{{/* The environment of a Tally process: (list . "edge"|"accountant") */}}
{{- define "tally.env" -}}
{{- $ := index . 0 -}}{{- $role := index . 1 -}}
- name: TALLY_KEY_SECRET
  valueFrom: {secretKeyRef: {name: {{ include "tally.secretName" $ }}, key: TALLY_KEY_SECRET}}
- name: TALLY_ADMIN_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "tally.secretName" $ }}, key: TALLY_ADMIN_TOKEN}}
{{- /* Both roles read the whole file: the accountant too is refused a
decision API beyond loopback without its token. */}}
- name: TALLY_API_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "tally.secretName" $ }}, key: TALLY_API_TOKEN}}
- name: TALLY_NATS_USER
  value: {{ $role }}
- name: TALLY_NATS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "tally.natsSecretName" $ }}, key: {{ $role }}-password}}
- name: TALLY_NATS_INBOX_PREFIX
  value: _INBOX_{{ $role }}
- name: TALLY_REDIS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "tally.redisSecretName" $ }}, key: TALLY_REDIS_PASSWORD, optional: true}}
- name: TALLY_SENTINEL_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "tally.redisSecretName" $ }}, key: TALLY_SENTINEL_PASSWORD, optional: true}}
{{- end -}}

{{/* The volumes and mounts of a Tally process. */}}
{{- define "tally.volumes" -}}
- name: config
  configMap: {name: {{ include "tally.fullname" . }}-config}
{{- if .Values.edge.rls.enabled }}
- name: ratelimit
  configMap: {name: {{ include "tally.fullname" . }}-ratelimit}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret: {secretName: {{ required "tls.secretName is required with tls.enabled" .Values.tls.secretName }}}
{{- end }}
{{- if and .Values.redis.tls.enabled .Values.redis.tls.secretName }}
- name: redis-tls
  secret: {secretName: {{ .Values.redis.tls.secretName }}}
{{- end }}
{{- if and .Values.nats.tls.enabled .Values.nats.tls.secretName }}
- name: nats-tls
  secret: {secretName: {{ .Values.nats.tls.secretName }}}
{{- end }}
{{- end -}}

{{- define "tally.volumeMounts" -}}
- {name: config, mountPath: /etc/tally, readOnly: true}
{{- if .Values.edge.rls.enabled }}
- {name: ratelimit, mountPath: /etc/tally/ratelimit, readOnly: true}
{{- end }}
{{- if .Values.tls.enabled }}
- {name: tls, mountPath: /etc/tally/tls, readOnly: true}
{{- end }}
{{- if and .Values.redis.tls.enabled .Values.redis.tls.secretName }}
- {name: redis-tls, mountPath: /etc/tally/redis-tls, readOnly: true}
{{- end }}
{{- if and .Values.nats.tls.enabled .Values.nats.tls.secretName }}
- {name: nats-tls, mountPath: /etc/tally/nats-tls, readOnly: true}
{{- end }}
{{- end -}}

{{/* Pod and container security: non-root, read-only, nothing to escalate to. */}}
{{- define "tally.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "tally.containerSecurity" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* Restart on a change of the configuration or the secrets the chart makes. */}}
{{- define "tally.checksums" -}}
checksum/config: {{ include "tally.config" . | sha256sum }}
checksum/ratelimit: {{ toJson .Values.edge.rls.rules | sha256sum }}
{{- end -}}

{{- define "tally.accountantReplicas" -}}
{{- if .Values.accountant.replicas -}}{{ .Values.accountant.replicas }}{{- else -}}{{ max 2 (len .Values.redis.shards) }}{{- end -}}
{{- end -}}

{{- define "tally.probeScheme" -}}{{ if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}{{- end -}}

{{/* NetworkPolicy egress rules: DNS, and Redis and NATS. */}}
{{- define "tally.dnsEgress" -}}
- to:
    - namespaceSelector: {}
      podSelector: {matchLabels: {k8s-app: kube-dns}}
  ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end }}
{{- define "tally.backendEgress" -}}
{{- $ := . }}{{- $np := .Values.networkPolicy }}
# Redis: the shards' nodes (and sentinels).
- to:
    {{- range $np.redisCIDRs }}
    - ipBlock: {cidr: {{ . }}}
    {{- end }}
  ports:
    {{- range $np.redisPorts }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
# NATS.
{{- if .Values.nats.bundled.enabled }}
- to:
    - podSelector: {matchLabels: {{ include "tally.selectorJSON" (list $ "nats") }}}
  ports:
    - {port: 4222, protocol: TCP}
{{- else }}
- to:
    {{- range $np.natsCIDRs }}
    - ipBlock: {cidr: {{ . }}}
    {{- end }}
  ports:
    - {port: 4222, protocol: TCP}
{{- end }}
{{- end }}

{{/* selector labels as one JSON object, for flow-style YAML. */}}
{{- define "tally.selectorJSON" -}}
{{- toJson (dict "app.kubernetes.io/name" "tally" "app.kubernetes.io/instance" (index . 0).Release.Name "app.kubernetes.io/component" (index . 1)) -}}
{{- end -}}
