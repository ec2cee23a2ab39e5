{{/*
Names are fixed (not derived from the release name): they are the names the RBAC, the
Lease and the docs use, and the names `hostcycle manifests --deploy` renders.
*/}}

{{/* The operator's namespace. */}}
{{- define "hostcycle.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* Labels of every object: the operator's name, then commonLabels. */}}
{{- define "hostcycle.labels" -}}
{{- $labels := dict "app.kubernetes.io/name" "hostcycle-operator" -}}
{{- toYaml (merge $labels (deepCopy .Values.commonLabels)) -}}
{{- end -}}

{{/* Labels of the Deployment, its pods and the Service. */}}
{{- define "hostcycle.componentLabels" -}}
{{- $labels := dict "app.kubernetes.io/name" "hostcycle-operator" "app.kubernetes.io/component" "operator" -}}
{{- toYaml (merge $labels (deepCopy .Values.commonLabels)) -}}
{{- end -}}

{{/* The operator's image: repository@digest, or repository:tag (default: appVersion). */}}
{{- define "hostcycle.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
Rules on the hosts' namespace(s) (crates/operator/src/rbac.rs, host_rules): what every
controller needs of BareMetalHosts, and the host controller's Secrets and Events.
*/}}
{{- define "hostcycle.hostRules" -}}
- apiGroups: ["metal3.io"]
  resources: ["baremetalhosts"]
  verbs: ["get", "list", "watch", "patch"]
{{- if has "baremetalhost" .Values.controllers }}
- apiGroups: ["metal3.io"]
  resources: ["baremetalhosts/status"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
{{- end -}}

{{/*
Rules only cluster-wide grants can give (rbac.rs, cluster_rules): the reboot queue's and
remediation's Nodes, Pods, cluster-scoped queue objects and Machines; the health check's Nodes,
requests and checks. Empty when only the host controller runs.
*/}}
{{- define "hostcycle.clusterRules" -}}
{{- $queue := has "reboot-queue" .Values.controllers -}}
{{- $remediation := has "remediation" .Values.controllers -}}
{{- $health := has "health-check" .Values.controllers -}}
{{- if or $queue $remediation $health }}
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if or $queue $remediation }}
- apiGroups: ["hostcycle.io"]
  resources: ["rebootqueues"]
  verbs: ["list", "watch", "create"]
- apiGroups: ["hostcycle.io"]
  resources: ["rebootqueueentries"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["hostcycle.io"]
  resources: ["rebootqueueentries/status"]
  verbs: ["update"]
- apiGroups: ["hostcycle.io"]
  resources: ["rebootqueues/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list"]
- apiGroups: ["cluster.x-k8s.io", "machine.openshift.io"]
  resources: ["machines"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["cluster.x-k8s.io"]
  resources: ["machines/status"]
  verbs: ["patch"]
- apiGroups: ["machine.openshift.io"]
  resources: ["machinehealthchecks"]
  verbs: ["list"]
{{- else }}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["hostcycle.io"]
  resources: ["rebootqueues", "rebootqueueentries"]
  verbs: ["list", "watch"]
{{- end }}
{{- $verbs := list "get" "list" "watch" -}}
{{- if $remediation }}{{- $verbs = append $verbs "patch" -}}{{- end -}}
{{- if $health }}{{- $verbs = concat $verbs (list "create" "delete") -}}{{- end }}
- apiGroups: ["hostcycle.io"]
  resources: ["hostremediations"]
  verbs: [{{ range $i, $v := $verbs }}{{ if $i }}, {{ end }}{{ $v | quote }}{{ end }}]
{{- if $remediation }}
- apiGroups: ["hostcycle.io"]
  resources: ["hostremediations/status"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["nodes/status"]
  verbs: ["patch"]
- apiGroups: ["storage.k8s.io"]
  resources: ["volumeattachments"]
  verbs: ["list"]
{{- end }}
{{- if $health }}
- apiGroups: ["hostcycle.io"]
  resources: ["hosthealthchecks"]
  verbs: ["list", "watch"]
- apiGroups: ["hostcycle.io"]
  resources: ["hosthealthchecks/status"]
  verbs: ["update"]
{{- end }}
{{- end }}
{{- end -}}

{{/* What a health checker needs to drive remediation (rbac.rs, checker_role). */}}
{{- define "hostcycle.checkerRules" -}}
- apiGroups: ["hostcycle.io"]
  resources: ["hostremediationtemplates"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["hostcycle.io"]
  resources: ["hostremediations"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
{{- end -}}
