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
