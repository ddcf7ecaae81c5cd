// Package k8s holds the Kubernetes manifests; this test decodes every one
// into the Kubernetes API types with unknown fields disallowed, so a typo
// fails, and checks the manifests against pstrain itself (real flags,
// counts that agree, a parseable cluster file).
package k8s

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/testbin"
)

// tfJob mirrors the fields of Kubeflow's kubeflow.org/v1 TFJob that the
// manifests use. The real type lives in github.com/kubeflow/training-operator,
// a heavy module; the pod templates inside are the real corev1 types, so
// everything below the replica spec is checked exactly.
type tfJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		RunPolicy *struct {
			CleanPodPolicy          *string `json:"cleanPodPolicy,omitempty"`
			TTLSecondsAfterFinished *int32  `json:"ttlSecondsAfterFinished,omitempty"`
			ActiveDeadlineSeconds   *int64  `json:"activeDeadlineSeconds,omitempty"`
			BackoffLimit            *int32  `json:"backoffLimit,omitempty"`
		} `json:"runPolicy,omitempty"`
		SuccessPolicy  *string                 `json:"successPolicy,omitempty"`
		TFReplicaSpecs map[string]*replicaSpec `json:"tfReplicaSpecs"`
	} `json:"spec"`
}

type replicaSpec struct {
	Replicas      *int32                 `json:"replicas,omitempty"`
	Template      corev1.PodTemplateSpec `json:"template"`
	RestartPolicy string                 `json:"restartPolicy,omitempty"`
}

// serviceMonitor mirrors the fields of the Prometheus operator's
// monitoring.coreos.com/v1 ServiceMonitor that the manifests use (the real
// type is in github.com/prometheus-operator/prometheus-operator).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port        string `json:"port,omitempty"`
			Path        string `json:"path,omitempty"`
			Interval    string `json:"interval,omitempty"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels,omitempty"`
				Separator    *string  `json:"separator,omitempty"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
				Regex        string   `json:"regex,omitempty"`
				Replacement  *string  `json:"replacement,omitempty"`
				Action       string   `json:"action,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// object is one decoded manifest document.
type object struct {
	file, kind, name string
	v                any
}

// newFor returns an empty value of the Go type for apiVersion/kind.
func newFor(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "batch/v1 Job":
		return &batchv1.Job{}, nil
	case "jobset.x-k8s.io/v1alpha2 JobSet":
		return &jobset.JobSet{}, nil
	case "kubeflow.org/v1 TFJob":
		return &tfJob{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &serviceMonitor{}, nil
	}
	return nil, fmt.Errorf("no Go type for %s %s", apiVersion, kind)
}

// decode splits a multi-document YAML file and decodes every document
// strictly.
func decode(file string, data []byte) ([]object, error) {
	var out []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", file, i, err)
		}
		if string(j) == "null" {
			continue // comments only
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", file, i, err)
		}
		v, err := newFor(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", file, i, err)
		}
		// encoding/json matches field names case-insensitively, so a
		// "mountpath" would pass it; sigs.k8s.io/json (what the API server
		// decodes with) is case-sensitive and also refuses duplicate keys.
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return nil, fmt.Errorf("%s document %d (%s): %w", file, i, tm.Kind, err)
		}
		strict, err := kjson.UnmarshalStrict(j, v)
		if err = errors.Join(append(strict, err)...); err != nil {
			return nil, fmt.Errorf("%s document %d (%s): %w", file, i, tm.Kind, err)
		}
		var meta struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		_ = json.Unmarshal(j, &meta)
		if meta.Metadata.Name == "" {
			return nil, fmt.Errorf("%s document %d (%s): no metadata.name", file, i, tm.Kind)
		}
		out = append(out, object{file, tm.Kind, meta.Metadata.Name, v})
	}
	return out, nil
}

func manifests(t *testing.T) map[string][]object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	all := map[string][]object{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(f, b)
		if err != nil {
			t.Fatal(err)
		}
		all[f] = objs
	}
	return all
}

func TestManifestsDecodeStrictly(t *testing.T) {
	all := manifests(t)
	kinds := map[string][]string{}
	for f, objs := range all {
		for _, o := range objs {
			kinds[f] = append(kinds[f], o.kind)
		}
	}
	for f, want := range map[string][]string{
		"tfjob.yaml":  {"TFJob", "ServiceMonitor", "PersistentVolumeClaim"},
		"plain.yaml":  {"Deployment", "StatefulSet", "Job", "Service", "ConfigMap", "ServiceMonitor", "PersistentVolumeClaim"},
		"jobset.yaml": {"JobSet", "Service", "ConfigMap", "ServiceMonitor", "PersistentVolumeClaim"},
	} {
		for _, k := range want {
			if !slices.Contains(kinds[f], k) {
				t.Errorf("%s has no %s (has %v)", f, k, kinds[f])
			}
		}
	}
}

func TestDecoderCatchesTypos(t *testing.T) {
	b, err := os.ReadFile("plain.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, typo := range [][2]string{
		{"podManagementPolicy:", "podManagmentPolicy:"},        // StatefulSet
		{"completionMode:", "completionmode:"},                 // Job
		{"mountPath: /checkpoints", "mountpath: /checkpoints"}, // inside a pod template
		{"publishNotReadyAddresses:", "publishNotReady:"},      // Service
	} {
		bad := strings.Replace(string(b), typo[0], typo[1], 1)
		if bad == string(b) {
			t.Fatalf("%q not in plain.yaml", typo[0])
		}
		if _, err := decode("plain.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("typo %q -> %q: %v", typo[0], typo[1], err)
		}
	}
	js, err := os.ReadFile("jobset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, typo := range [][2]string{
		{"targetReplicatedJobs: [chief]", "targetReplicatedJob: [chief]"}, // JobSet success policy
		{"enableDNSHostnames:", "enableDnsHostnames:"},                    // JobSet network
		{"completionMode: Indexed", "completionmode: Indexed"},            // the Job template inside
		{"configMapKeyRef:", "configMapRef:"},                             // a pod's env
	} {
		bad := strings.Replace(string(js), typo[0], typo[1], 1)
		if bad == string(js) {
			t.Fatalf("%q not in jobset.yaml", typo[0])
		}
		if _, err := decode("jobset.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("typo %q -> %q: %v", typo[0], typo[1], err)
		}
	}
	tf, _ := os.ReadFile("tfjob.yaml")
	bad := strings.Replace(string(tf), "restartPolicy: OnFailure", "restartpolicy: OnFailure", 1)
	if _, err := decode("tfjob.yaml", []byte(bad)); err == nil {
		t.Error("typo in a TFJob replica spec accepted")
	}
}

// workload is one pod template of a manifest and how many pods of it
// run.
type workload struct {
	name string // the object's (a JobSet's: jobset/replicatedJob)
	pod  corev1.PodTemplateSpec
	pods int
	job  *batchv1.JobSpec // the Job the pods belong to, if any
}

// workloads lists every pod template of objs.
func workloads(objs []object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.v.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{v.Name, v.Spec.Template, int(*v.Spec.Replicas), nil})
		case *appsv1.StatefulSet:
			out = append(out, workload{v.Name, v.Spec.Template, int(*v.Spec.Replicas), nil})
		case *batchv1.Job:
			out = append(out, workload{v.Name, v.Spec.Template, int(*v.Spec.Parallelism), &v.Spec})
		case *jobset.JobSet:
			for _, rj := range v.Spec.ReplicatedJobs {
				spec := rj.Template.Spec
				out = append(out, workload{v.Name + "/" + rj.Name, spec.Template, int(rj.Replicas) * int(*spec.Parallelism), &spec})
			}
		case *tfJob:
			for role, rs := range v.Spec.TFReplicaSpecs {
				out = append(out, workload{v.Name + "/" + role, rs.Template, int(*rs.Replicas), nil})
			}
		}
	}
	return out
}

// podSpecs are the pod templates of every workload, by the role their
// first container runs, and the number of pods of each.
func podSpecs(t *testing.T, objs []object) (map[string]corev1.PodTemplateSpec, map[string]int) {
	t.Helper()
	pods, replicas := map[string]corev1.PodTemplateSpec{}, map[string]int{}
	for _, w := range workloads(objs) {
		if len(w.pod.Spec.Containers) == 0 || len(w.pod.Spec.Containers[0].Args) == 0 {
			t.Fatalf("%s: no container arguments", w.name)
		}
		role := w.pod.Spec.Containers[0].Args[0]
		if _, dup := pods[role]; dup {
			t.Fatalf("two workloads run %s", role)
		}
		pods[role], replicas[role] = w.pod, w.pods
	}
	return pods, replicas
}

// bin is pstrain, built to read its flags.
var bin testbin.Binary

// taskFlags builds pstrain and lists the flags `pstrain ROLE -h` knows.
func taskFlags(t *testing.T, role string) map[string]bool {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not on PATH: cannot build pstrain to check the flags")
	}
	out, _ := exec.Command(bin.Path(t), role, "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 5 {
		t.Fatalf("pstrain %s -h listed no flags:\n%s", role, out)
	}
	return flags
}

// argFlags parses --name=value / --name value arguments after the role.
func argFlags(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			val = args[i+1]
			i++
		}
		out[name] = val
	}
	return out
}

func TestContainersUseRealFlagsAndAgree(t *testing.T) {
	for file, objs := range manifests(t) {
		t.Run(file, func(t *testing.T) {
			pods, replicas := podSpecs(t, objs)
			claims := map[string]bool{}
			var clusterJSON string
			for _, o := range objs {
				switch v := o.v.(type) {
				case *corev1.PersistentVolumeClaim:
					claims[v.Name] = true
				case *corev1.ConfigMap:
					clusterJSON = v.Data["cluster.json"]
				}
			}
			for _, w := range workloads(objs) {
				if j := w.job; j != nil && (j.Completions == nil || *j.Parallelism != *j.Completions || j.CompletionMode == nil || *j.CompletionMode != batchv1.IndexedCompletion) {
					t.Errorf("%s: a Job of tasks must be Indexed with every pod running at once", w.name)
				}
			}
			roles := []string{cluster.Chief, cluster.PS, cluster.Worker}
			if _, ok := pods[cluster.Standby]; ok {
				roles = append(roles, cluster.Standby)
			}
			maxWorkers := map[string]string{}
			for _, role := range roles {
				pod, ok := pods[role]
				if !ok {
					t.Fatalf("no %s pod template", role)
				}
				if a := pod.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] == "" {
					t.Errorf("%s: no Prometheus scrape annotations: %v", role, a)
				}
				c := pod.Spec.Containers[0]
				if strings.HasPrefix(file, "tfjob") && c.Name != "tensorflow" {
					t.Errorf("%s: TFJob container is %q; the operator sets TF_CONFIG only in \"tensorflow\"", role, c.Name)
				}
				if len(c.Args) == 0 || c.Args[0] != role {
					t.Fatalf("%s: container args %v do not start with %q", role, c.Args, role)
				}
				known := taskFlags(t, role)
				fl := argFlags(c.Args[1:])
				for name := range fl {
					if !known[name] {
						t.Errorf("%s: pstrain %s has no flag --%s", role, role, name)
					}
				}
				if fl["metrics-addr"] != ":"+pod.Annotations["prometheus.io/port"] {
					t.Errorf("%s: --metrics-addr %q but scrape port %q", role, fl["metrics-addr"], pod.Annotations["prometheus.io/port"])
				}
				// --ps and --workers come from the cluster; given, they must agree.
				if n, ok := fl["ps"]; ok && n != fmt.Sprint(replicas[cluster.PS]) {
					t.Errorf("%s: --ps=%s, but %d PS replicas", role, n, replicas[cluster.PS])
				}
				if n, ok := fl["workers"]; ok && n != fmt.Sprint(replicas[cluster.Worker]) {
					t.Errorf("%s: --workers=%s, but %d worker replicas", role, n, replicas[cluster.Worker])
				}
				maxWorkers[role] = fl["max-workers"]
				if fl["tls-dir"] == "" {
					t.Errorf("%s: no --tls-dir", role)
				}
				if strings.Contains(fl["index"], "$(") {
					ref := strings.TrimSuffix(strings.TrimPrefix(fl["index"], "$("), ")")
					if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == ref && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil }) {
						t.Errorf("%s: --index=%s but no downward-API env %s", role, fl["index"], ref)
					}
				}
				// The chief, the PS and the standbys share the checkpoint volume.
				if role != cluster.Worker {
					if fl["checkpoint-dir"] == "" {
						t.Errorf("%s: no --checkpoint-dir", role)
					}
					if m := claimMountOf(pod, c, claims, fl["checkpoint-dir"]); m != fl["checkpoint-dir"] {
						t.Errorf("%s: --checkpoint-dir %q is not a mounted PVC defined in %s", role, fl["checkpoint-dir"], file)
					}
				}
				// A restarted chief adopts the running cluster only with
				// the same run id, and finishes the report only from a
				// state file that outlives the pod.
				if role == cluster.Chief {
					if id := fl["run-id"]; id == "" || strings.Contains(id, "$(") {
						t.Errorf("chief: --run-id %q: a restarted chief needs the same fixed run id to adopt its cluster", id)
					}
					if sf := fl["state-file"]; sf == "" || claimMountOf(pod, c, claims, sf) == "" {
						t.Errorf("chief: --state-file %q is not on a mounted PVC defined in %s: a restarted chief would lose the report's history", sf, file)
					}
				}
			}
			checkClusterJSON(t, clusterJSON, replicas, maxWorkers)
		})
	}
}

// checkClusterJSON checks the cluster a manifest's tasks read against its
// workloads: a PS address per PS pod, a standby address per standby pod,
// and a worker address per worker slot: --max-workers, which every task
// gives alike, or the worker pods when none does.
func checkClusterJSON(t *testing.T, clusterJSON string, replicas map[string]int, maxWorkers map[string]string) {
	t.Helper()
	slots := fmt.Sprint(replicas[cluster.Worker])
	if m := maxWorkers[cluster.Chief]; m != "" {
		slots = m
	}
	for role, m := range maxWorkers {
		if m != maxWorkers[cluster.Chief] {
			t.Errorf("%s: --max-workers=%q, the chief's %q", role, m, maxWorkers[cluster.Chief])
		}
	}
	if clusterJSON == "" {
		return
	}
	spec, _, err := cluster.Parse([]byte(clusterJSON))
	if err != nil {
		t.Fatalf("cluster.json: %v", err)
	}
	if len(spec.PS) != replicas[cluster.PS] || len(spec.Standby) != replicas[cluster.Standby] || fmt.Sprint(len(spec.Worker)) != slots {
		t.Errorf("cluster.json has %d PS, %d standbys and %d worker slots; the workloads %v, --max-workers %s", len(spec.PS), len(spec.Standby), len(spec.Worker), replicas, slots)
	}
}

// claimMountOf returns the mount path of container c under which path
// lies, when that mount is one of claims (a PVC the file defines); "" if
// path is on no such mount.
func claimMountOf(pod corev1.PodTemplateSpec, c corev1.Container, claims map[string]bool, path string) string {
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name != vm.Name || v.PersistentVolumeClaim == nil || !claims[v.PersistentVolumeClaim.ClaimName] {
				continue
			}
			if path == vm.MountPath || strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
				return vm.MountPath
			}
		}
	}
	return ""
}
