package k8s

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
)

// This file stands in for the parts of Kubernetes that turn a manifest's
// workloads into running pods, so that localpods_test.go can start every
// pod of a manifest as a local process: the controllers that name the
// pods and give them their labels, annotations and environment
// (StatefulSet, indexed Job, JobSet), the cluster DNS, and the pod
// network. Every pod is 127.0.0.1, each of its container ports a free
// local port of its own. A name is resolved only as the cluster's DNS
// would resolve it: a Service of the manifest, or a pod's
// hostname.subdomain under a headless Service of that name (one the
// manifest defines, or the JobSet's own). Anything this file does not
// know fails the test rather than being guessed.

// namespace is the namespace the manifests are applied to.
const namespace = "default"

// pod is one pod a controller would create.
type pod struct {
	name, hostname, subdomain string
	labels, annotations       map[string]string
	spec                      corev1.PodSpec
	// env is what the controller adds to every container's environment,
	// after the container's own (an indexed Job's JOB_COMPLETION_INDEX).
	env []corev1.EnvVar
}

// sim is a manifest's pods, the names they resolve under and their ports.
type sim struct {
	t          *testing.T
	pods       []*pod
	services   []*corev1.Service
	configMaps map[string]*corev1.ConfigMap
	// subdomains are the headless Services pods' hostnames resolve under.
	subdomains map[string]bool
	ports      *portPool
	local      map[string]int // "pod/containerPort" -> local port
	// jobs are the indexed Jobs, for the pods of indices they do not run
	// yet (slots a raised parallelism would fill); slots are those pods,
	// made when a name refers to one.
	jobs  []indexedJob
	slots []*pod
}

// indexedJob is what makes an indexed Job's pod of any index.
type indexedJob struct {
	name  string
	spec  batchv1.JobSpec
	extra map[string]string
}

// newSim expands objs into pods.
func newSim(t *testing.T, objs []object, ports *portPool) *sim {
	s := &sim{t: t, configMaps: map[string]*corev1.ConfigMap{}, subdomains: map[string]bool{}, ports: ports, local: map[string]int{}}
	for _, o := range objs {
		switch v := o.v.(type) {
		case *corev1.ConfigMap:
			s.configMaps[v.Name] = v
		case *corev1.Service:
			s.services = append(s.services, v)
			if v.Spec.ClusterIP == corev1.ClusterIPNone {
				s.subdomains[v.Name] = true
			}
		case *appsv1.Deployment:
			s.deployment(v)
		case *appsv1.StatefulSet:
			s.statefulSet(v)
		case *batchv1.Job:
			s.indexedJob(v.Name, v.Spec, nil)
		case *jobset.JobSet:
			s.jobSet(v)
		default:
			if _, ok := v.(*corev1.PersistentVolumeClaim); !ok && o.kind != "ServiceMonitor" {
				t.Fatalf("%s %s: no local stand-in for its controller", o.kind, o.name)
			}
		}
	}
	return s
}

func newPod(name string, tmpl corev1.PodTemplateSpec) *pod {
	return &pod{name: name, hostname: name, subdomain: tmpl.Spec.Subdomain,
		labels: maps.Clone(tmpl.Labels), annotations: maps.Clone(tmpl.Annotations), spec: tmpl.Spec}
}

func (s *sim) deployment(d *appsv1.Deployment) {
	for i := range int(*d.Spec.Replicas) {
		s.pods = append(s.pods, newPod(fmt.Sprintf("%s-%d", d.Name, i), d.Spec.Template))
	}
}

// statefulSet: pods <name>-<ordinal> under the governing Service, with
// the pod-index label (Kubernetes 1.28+).
func (s *sim) statefulSet(st *appsv1.StatefulSet) {
	for i := range int(*st.Spec.Replicas) {
		p := newPod(fmt.Sprintf("%s-%d", st.Name, i), st.Spec.Template)
		p.subdomain = st.Spec.ServiceName
		if p.labels == nil {
			p.labels = map[string]string{}
		}
		p.labels["apps.kubernetes.io/pod-index"] = strconv.Itoa(i)
		p.labels["statefulset.kubernetes.io/pod-name"] = p.name
		s.pods = append(s.pods, p)
	}
}

// indexedJob: the pods running at once (parallelism), hostname
// <job>-<index>, with the completion index as annotation, label and
// JOB_COMPLETION_INDEX; extra labels and annotations (a JobSet's) too.
func (s *sim) indexedJob(name string, spec batchv1.JobSpec, extra map[string]string) {
	if spec.CompletionMode == nil || *spec.CompletionMode != batchv1.IndexedCompletion {
		s.t.Fatalf("Job %s: only Indexed Jobs have stable pod names to stand in for", name)
	}
	j := indexedJob{name, spec, extra}
	s.jobs = append(s.jobs, j)
	for i := range int(*spec.Parallelism) {
		s.pods = append(s.pods, j.pod(i))
	}
}

// pod is the Job's pod of index i.
func (j indexedJob) pod(i int) *pod {
	p := newPod(fmt.Sprintf("%s-%d", j.name, i), j.spec.Template)
	if p.labels == nil {
		p.labels = map[string]string{}
	}
	if p.annotations == nil {
		p.annotations = map[string]string{}
	}
	idx := strconv.Itoa(i)
	p.labels["batch.kubernetes.io/job-completion-index"] = idx
	p.annotations["batch.kubernetes.io/job-completion-index"] = idx
	maps.Copy(p.labels, j.extra)
	maps.Copy(p.annotations, j.extra)
	p.env = []corev1.EnvVar{{Name: "JOB_COMPLETION_INDEX", Value: idx}}
	return p
}

// slot is the pod of an indexed Job named hostname (<job>-<index>) under
// subdomain sub that the Job does not run yet, nil if hostname names
// none.
func (s *sim) slot(hostname, sub string) *pod {
	for _, p := range s.slots {
		if p.hostname == hostname && p.subdomain == sub {
			return p
		}
	}
	for _, j := range s.jobs {
		rest, ok := strings.CutPrefix(hostname, j.name+"-")
		i, err := strconv.Atoi(rest)
		if !ok || err != nil || i < int(*j.spec.Parallelism) || j.spec.Template.Spec.Subdomain != sub {
			continue
		}
		p := j.pod(i)
		s.slots = append(s.slots, p)
		return p
	}
	return nil
}

// jobSet: replicas Jobs <jobset>-<replicatedJob>-<jobIndex> per
// replicated Job, their pods under the JobSet's headless Service when
// network.enableDNSHostnames (subdomain: network.subdomain, or the
// JobSet's name).
func (s *sim) jobSet(js *jobset.JobSet) {
	sub := ""
	if n := js.Spec.Network; n != nil && n.EnableDNSHostnames != nil && *n.EnableDNSHostnames {
		sub = js.Name
		if n.Subdomain != "" {
			sub = n.Subdomain
		}
		s.subdomains[sub] = true
	}
	for _, rj := range js.Spec.ReplicatedJobs {
		for j := range int(rj.Replicas) {
			spec := rj.Template.Spec
			if sub != "" {
				spec.Template.Spec.Subdomain = sub
			}
			s.indexedJob(fmt.Sprintf("%s-%s-%d", js.Name, rj.Name, j), spec, map[string]string{
				jobset.JobSetNameKey:        js.Name,
				jobset.ReplicatedJobNameKey: rj.Name,
				jobset.JobIndexKey:          strconv.Itoa(j),
			})
		}
	}
}

// raiseWorkers returns the n pods that raising the parallelism (and
// completions) of the Job whose pods run `pstrain worker` by n adds.
func (s *sim) raiseWorkers(n int) []*pod {
	if n == 0 {
		return nil
	}
	var out []*pod
	for _, j := range s.jobs {
		if c := j.spec.Template.Spec.Containers; len(c) == 0 || len(c[0].Args) == 0 || c[0].Args[0] != "worker" {
			continue
		}
		first := int(*j.spec.Parallelism)
		for i := first; i < first+n; i++ {
			p := s.slot(fmt.Sprintf("%s-%d", j.name, i), j.spec.Template.Spec.Subdomain)
			if p == nil {
				s.t.Fatalf("Job %s has no pod %d", j.name, i)
			}
			out = append(out, p)
		}
		return out
	}
	s.t.Fatal("no Job of workers")
	return nil
}

// portPool hands out free local ports p whose p+1000 and p+2000 are free
// too (a task's default metrics port and a PS's data plane), holding
// them until release.
type portPool struct {
	held []net.Listener
}

func (pp *portPool) get(t *testing.T) int {
	t.Helper()
	for tries := 0; tries < 100; tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		group := []net.Listener{l}
		for _, off := range []int{1000, 2000} {
			if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+off)); err == nil {
				group = append(group, l2)
			}
		}
		pp.held = append(pp.held, group...)
		if len(group) == 3 {
			return p
		}
	}
	t.Fatal("no free port with +1000 and +2000 free too")
	return 0
}

func (pp *portPool) release() {
	for _, l := range pp.held {
		l.Close()
	}
	pp.held = nil
}

// localPort is the local port standing in for container port cp of p.
func (s *sim) localPort(p *pod, cp int) int {
	key := fmt.Sprintf("%s/%d", p.name, cp)
	if _, ok := s.local[key]; !ok {
		s.local[key] = s.ports.get(s.t)
	}
	return s.local[key]
}

// lookup resolves host as the cluster DNS would, to the pods behind it
// and, for a Service, the Service itself.
func (s *sim) lookup(host string) ([]*pod, *corev1.Service) {
	for _, suffix := range []string{"." + namespace + ".svc.cluster.local", "." + namespace + ".svc", "." + namespace} {
		host = strings.TrimSuffix(host, suffix)
	}
	if hn, sub, ok := strings.Cut(host, "."); ok {
		for _, p := range s.pods {
			if s.subdomains[sub] && p.subdomain == sub && p.hostname == hn && s.selects(sub, p) {
				return []*pod{p}, nil
			}
		}
		// A worker slot: the name its pod will have once the Job runs
		// that index. Nothing dials a worker, so nothing listens there.
		if p := s.slot(hn, sub); p != nil && s.subdomains[sub] && s.selects(sub, p) {
			return []*pod{p}, nil
		}
		return nil, nil
	}
	for _, svc := range s.services {
		if svc.Name != host {
			continue
		}
		var out []*pod
		for _, p := range s.pods {
			if selects(svc.Spec.Selector, p) {
				out = append(out, p)
			}
		}
		return out, svc
	}
	return nil, nil
}

// selects: the headless Service sub of the manifest selects p; a
// JobSet's own Service (not in the manifest) selects its pods.
func (s *sim) selects(sub string, p *pod) bool {
	for _, svc := range s.services {
		if svc.Name == sub {
			return selects(svc.Spec.Selector, p)
		}
	}
	return p.labels[jobset.JobSetNameKey] != ""
}

func selects(sel map[string]string, p *pod) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if p.labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort is the port of p's containers that svcPort reaches.
func (s *sim) containerPort(p *pod, svc *corev1.Service, port int) (int, error) {
	if svc == nil {
		return port, nil // a pod's own name: its container port
	}
	for _, sp := range svc.Spec.Ports {
		if int(sp.Port) != port {
			continue
		}
		if sp.TargetPort.Type == intstr.Int {
			if sp.TargetPort.IntVal == 0 {
				return port, nil
			}
			return int(sp.TargetPort.IntVal), nil
		}
		for _, c := range p.spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal {
					return int(cp.ContainerPort), nil
				}
			}
		}
		return 0, fmt.Errorf("service %s port %d: no container port named %q in pod %s", svc.Name, port, sp.TargetPort.StrVal, p.name)
	}
	return 0, fmt.Errorf("service %s has no port %d", svc.Name, port)
}

// hostPort matches host:port in a cluster file or TF_CONFIG.
var hostPort = regexp.MustCompile(`([A-Za-z0-9][A-Za-z0-9.-]*):([0-9]+)`)

// resolveAddrs replaces every host:port in text by the local address of
// the one pod it reaches; a name that reaches no pod, or several, is an
// error.
func (s *sim) resolveAddrs(text string) (string, error) {
	var err error
	out := hostPort.ReplaceAllStringFunc(text, func(m string) string {
		sm := hostPort.FindStringSubmatch(m)
		port, _ := strconv.Atoi(sm[2])
		pods, svc := s.lookup(sm[1])
		if len(pods) != 1 {
			err = errors.Join(err, fmt.Errorf("%s resolves to %d pods of the manifest, want 1", sm[1], len(pods)))
			return m
		}
		cp, perr := s.containerPort(pods[0], svc, port)
		if perr != nil {
			err = errors.Join(err, perr)
			return m
		}
		return "127.0.0.1:" + strconv.Itoa(s.localPort(pods[0], cp))
	})
	return out, err
}

// fieldRef is what the downward API gives for path in p.
func fieldRef(p *pod, path string) (string, error) {
	if m := regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`).FindStringSubmatch(path); m != nil {
		src := p.labels
		if m[1] == "annotations" {
			src = p.annotations
		}
		if v, ok := src[m[2]]; ok {
			return v, nil
		}
		return "", fmt.Errorf("pod %s has no %s %q", p.name, m[1][:len(m[1])-1], m[2])
	}
	switch path {
	case "metadata.name":
		return p.name, nil
	case "metadata.namespace":
		return namespace, nil
	case "status.podIP":
		return "127.0.0.1", nil
	}
	return "", fmt.Errorf("pod %s: no local stand-in for fieldRef %s", p.name, path)
}

// expand replaces $(VAR) references to vars as Kubernetes does in env
// values, command and args: $$ is a literal $, an unknown reference is
// left as it is.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "$$"):
			b.WriteByte('$')
			i++
		case strings.HasPrefix(s[i:], "$("):
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// containerEnv is c's environment in p, in order, as the kubelet builds
// it: each variable may refer to those before it; values read from
// ConfigMaps have their names resolved (the cluster's DNS).
func (s *sim) containerEnv(p *pod, c corev1.Container) ([]string, map[string]string, error) {
	vars := map[string]string{}
	var list []string
	for _, e := range slices.Concat(c.Env, p.env) {
		v, err := s.envValue(p, e, vars)
		if err != nil {
			return nil, nil, fmt.Errorf("%s env %s: %w", c.Name, e.Name, err)
		}
		vars[e.Name] = v
		list = append(list, e.Name+"="+v)
	}
	return list, vars, nil
}

func (s *sim) envValue(p *pod, e corev1.EnvVar, vars map[string]string) (string, error) {
	switch {
	case e.ValueFrom == nil:
		return expand(e.Value, vars), nil
	case e.ValueFrom.FieldRef != nil:
		return fieldRef(p, e.ValueFrom.FieldRef.FieldPath)
	case e.ValueFrom.ConfigMapKeyRef != nil:
		ref := e.ValueFrom.ConfigMapKeyRef
		cm, ok := s.configMaps[ref.Name]
		if !ok {
			return "", fmt.Errorf("no ConfigMap %s in the manifest", ref.Name)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			return "", fmt.Errorf("ConfigMap %s has no key %s", ref.Name, ref.Key)
		}
		return s.resolveAddrs(v)
	}
	return "", errors.New("no local stand-in for this valueFrom")
}
