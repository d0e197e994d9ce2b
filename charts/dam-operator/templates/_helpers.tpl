{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "dam.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "dam.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dam.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "dam.labels" -}}
helm.sh/chart: {{ include "dam.chart" . }}
{{ include "dam.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dam-operator
{{- end -}}

{{/* Labels that select the operator pods (immutable in a Deployment: keep them stable). */}}
{{- define "dam.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dam.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dam.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dam.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "dam.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "dam.sidecarImage" -}}
{{- default (include "dam.image" .) .Values.sidecar.image -}}
{{- end -}}

{{- define "dam.webhookServiceName" -}}
{{- printf "%s-webhook" (include "dam.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dam.metricsServiceName" -}}
{{- printf "%s-metrics" (include "dam.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dam.webhookConfigurationName" -}}
{{- include "dam.fullname" . -}}
{{- end -}}

{{/* Secret of the operator's self-signed webhook certificate (cert-manager off). */}}
{{- define "dam.certSecretName" -}}
{{- printf "%s-webhook-cert" (include "dam.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Secret that cert-manager writes the serving certificate into (cert-manager on). */}}
{{- define "dam.certManagerSecretName" -}}
{{- printf "%s-webhook-tls" (include "dam.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dam.certificateName" -}}
{{- printf "%s-webhook" (include "dam.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Namespaces the webhook never touches: kube-system, the release namespace, and the user's list. */}}
{{- define "dam.excludedNamespaces" -}}
{{- $all := concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq | sortAlpha -}}
{{- toJson $all -}}
{{- end -}}

{{/* The restricted container security context shared by every container of the chart. */}}
{{- define "dam.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* "true" when the replicas share the profiles (operator.sharding; never with kopf peering). */}}
{{- define "dam.sharded" -}}
{{- $s := .Values.operator.sharding -}}
{{- if and $s.enabled (not .Values.operator.peering.enabled) (or (gt (int .Values.operator.replicas) 1) $s.singleReplica) -}}
true
{{- end -}}
{{- end -}}

{{/* Guard rails that the schema cannot express. */}}
{{- define "dam.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.peering.enabled) (not .Values.operator.sharding.enabled) -}}
{{- fail "operator.replicas > 1 needs operator.sharding.enabled or operator.peering.enabled: otherwise every replica would handle every DAMProfile" -}}
{{- end -}}
{{- if lt (int .Values.operator.sharding.leaseDurationSeconds) (mul 4 (int .Values.operator.sharding.renewSeconds)) -}}
{{- fail "operator.sharding.leaseDurationSeconds must be at least 4 x operator.sharding.renewSeconds" -}}
{{- end -}}
{{- if and .Values.operator.watchNamespace (has .Values.operator.watchNamespace (list "kube-system" .Release.Namespace)) -}}
{{- fail (printf "operator.watchNamespace=%s is a namespace the webhook never injects (kube-system or the release namespace); install the chart in its own namespace" .Values.operator.watchNamespace) -}}
{{- end -}}
{{- end -}}
