{{/* The chart's name, or nameOverride. */}}
{{- define "agentry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' base name: fullnameOverride, else the release name when it already holds the
chart's name, else both. 52 characters at most, so the StatefulSet's pods and claims
(data-NAME-ORDINAL) stay within Kubernetes' 63.
*/}}
{{- define "agentry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := include "agentry.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels that select this release's pods; never changed by an upgrade. */}}
{{- define "agentry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "agentry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentry.selectorLabels" . }}
app.kubernetes.io/version: {{ include "agentry.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentry
{{- end }}

{{/* The image tag: image.tag, else the chart's appVersion (the crate version). */}}
{{- define "agentry.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "agentry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentry.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace the Kubernetes runner's Jobs run in. */}}
{{- define "agentry.jobNamespace" -}}
{{- .Values.runner.kubernetes.namespace | default .Release.Namespace }}
{{- end }}

{{/*
The agent image of the Kubernetes runner: repository@digest when a digest is given, else
repository:tag (tag default: the chart's appVersion).
*/}}
{{- define "agentry.agentImage" -}}
{{- with .Values.runner.kubernetes.agentImage }}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository (.tag | default $.Chart.AppVersion) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The port of the pod endpoint the agent pods dial (AGENTRY_KUBE_LISTEN). */}}
{{- define "agentry.podEndpointPort" -}}
4812
{{- end }}

{{/*
The labels of this release's agent pods, as the Kubernetes runner sets them
(AGENTRY_KUBE_INSTANCE is the release name).
*/}}
{{- define "agentry.agentSelectorLabels" -}}
app.kubernetes.io/name: agentry-agent
app.kubernetes.io/managed-by: agentry
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Combinations the schema cannot refuse on its own, each refused with the reason. Included by
statefulset.yaml: a failure there fails the whole render, so nothing is applied.
*/}}
{{- define "agentry.validate" -}}
{{- $sqlite := not .Values.database.existingSecret }}
{{- if and $sqlite (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount is %d, but the embedded SQLite database (database.existingSecret is empty) serves one agentry process only: several replicas need PostgreSQL, so set database.existingSecret to a Secret whose key `url` holds its URL, or keep replicaCount at 1." (int .Values.replicaCount)) }}
{{- end }}
{{- if and $sqlite (not .Values.persistence.enabled) }}
{{- fail "persistence.enabled is false with the embedded SQLite database (database.existingSecret is empty): the database would live in an emptyDir and every task, cost and stored secret would be lost with the pod; keep persistence.enabled, or use PostgreSQL." }}
{{- end }}
{{- $own := dict "AGENTRY_DATA_DIR" "to /var/lib/agentry, the data volume" "AGENTRY_BIND" "to 0.0.0.0:8080, the port the probes and the Service use" "AGENTRY_DATABASE_URL" "from database.existingSecret" "AGENTRY_MASTER_KEY" "from masterKey.existingSecret" "AGENTRY_RUNNER" "from runner.kind" "AGENTRY_KUBE_NAMESPACE" "from runner.kubernetes.namespace" "AGENTRY_AGENT_IMAGE" "from runner.kubernetes.agentImage" "AGENTRY_KUBE_LISTEN" "to 0.0.0.0:4812, the port the agent pods' NetworkPolicy opens" "AGENTRY_KUBE_ENDPOINT" "to the pod's IP and port 4812" "AGENTRY_KUBE_INSTANCE" "to the release name, which the agent pods' NetworkPolicy selects" "AGENTRY_KUBE_AGENT_CPU" "from runner.kubernetes.agentResources.cpu" "AGENTRY_KUBE_AGENT_MEMORY" "from runner.kubernetes.agentResources.memory" "AGENTRY_KUBE_WORK_SIZE" "from runner.kubernetes.workSize" "AGENTRY_KUBE_START_TIMEOUT" "from runner.kubernetes.startTimeoutSeconds" "AGENTRY_KUBE_ALLOW_API_REACH" "from runner.kubernetes.allowApiReach" "AGENTRY_POD_IP" "from the pod's status.podIP" }}
{{- range $name, $from := $own }}
{{- if hasKey ($.Values.config | default dict) $name }}
{{- fail (printf "config.%s: the chart sets %s itself (%s); remove it from config." $name $name $from) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.runner.kind "kubernetes") (not .Values.runner.kubernetes.agentImage.repository) }}
{{- fail "runner.kind is kubernetes but runner.kubernetes.agentImage.repository is empty: each agent run is a pod of the agent image (deploy/Dockerfile.agent, built by `scripts/build-image.sh --agent`), so push it to a registry the cluster pulls from and name it there, e.g. registry.example.com/agentry-agent." }}
{{- end }}
{{- if and (eq .Values.runner.kind "kubernetes") (eq (include "agentry.serviceAccountName" .) "default") }}
{{- fail "runner.kind is kubernetes, and agentry would run as the namespace's default service account (serviceAccount.create is false and serviceAccount.name names none, or names default): the runner's Role (create Jobs, read and delete Secrets, read pods and their logs) would then be granted to every pod of the namespace that runs as default. Keep serviceAccount.create, or name a service account of agentry's own in serviceAccount.name." }}
{{- end }}
{{- if and (not $sqlite) (not .Values.masterKey.existingSecret) }}
{{- fail "database.existingSecret is set (PostgreSQL) but masterKey.existingSecret is empty: every replica must use the same master key, and without one each would generate its own and could not read the secrets the others stored; create a Secret whose key `key` holds base64 of 32 random bytes and name it in masterKey.existingSecret." }}
{{- end }}
{{- end }}
