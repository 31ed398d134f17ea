{{/* Labels every object carries; the component's for pods and Services. */}}
{{- define "gpupool.labels" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gpupool
{{- end -}}

{{- define "gpupool.selector" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpupool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Non-root (the image's user 10001), RuntimeDefault seccomp. */}}
{{- define "gpupool.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpupool.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}


{{/* The mutating webhook entries' rules and policy (each entry differs only in its selectors). */}}
{{- define "gpupool.mutateRules" }}
    rules:
      - {apiGroups: [""], apiVersions: [v1], resources: [pods], operations: [CREATE]}
      - {apiGroups: [batch], apiVersions: [v1], resources: [jobs], operations: [CREATE]}
      - {apiGroups: [jobset.x-k8s.io], apiVersions: ["*"], resources: [jobsets], operations: [CREATE]}
      - {apiGroups: [kubeflow.org], apiVersions: ["*"], resources: [pytorchjobs], operations: [CREATE]}
    failurePolicy: {{ .Values.webhook.failurePolicy }}
    sideEffects: None
    timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
{{- end }}

{{/* "true" when the replicas share a database (PostgreSQL), else "": gpupool.deploy.objects.shared_database. */}}
{{- define "gpupool.sharedDatabase" -}}
{{- if or .Values.database.url .Values.database.existingSecret .Values.database.bundled.enabled -}}true{{- end -}}
{{- end -}}

{{/* The claim under the state directory, or "" for an emptyDir: gpupool.deploy.objects.state_claim. */}}
{{- define "gpupool.stateClaim" -}}
{{- if and .Values.persistence.enabled (not (include "gpupool.sharedDatabase" .)) -}}
{{- .Values.persistence.existingClaim | default (printf "%s-state" .Release.Name) -}}
{{- end -}}
{{- end -}}

{{/* Values refused at render time, in the words of gpupool.deploy.objects.values_problem. */}}
{{- define "gpupool.validateValues" -}}
{{- if and .Values.database.bundled.enabled (or .Values.database.url .Values.database.existingSecret) -}}
{{- fail "database.bundled.enabled=true with database.url or database.existingSecret: use one database" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "gpupool.sharedDatabase" .)) -}}
{{- fail (printf "replicaCount %d needs a database the replicas share: set database.url, database.existingSecret or database.bundled.enabled=true (each replica's own SQLite store would start a failover from empty), or set replicaCount 1" (int .Values.replicaCount)) -}}
{{- end -}}
{{- end -}}
