package k8s

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/internal/testbin"
)

// trainFlags are added to every task container's arguments (the same
// to all, as the chief requires): a small data fraction and a target it
// reaches in a few epochs, so that the test takes seconds, not the
// manifests' full run. The epochs leave the first evaluation (at 1 s,
// about 4 epochs in) time to finish before they are all trained: a
// target met by an evaluation that ends after the last step does not
// stop the run.
var trainFlags = []string{"--data-fraction=0.1", "--epochs=12", "--target-accuracy=0.9", "--target-hold=1"}

// scaleFlags run three whole epochs instead, so that a worker count
// change (at an epoch boundary) happens before the end.
var scaleFlags = []string{"--data-fraction=0.1", "--epochs=3", "--target-accuracy=0"}

// TestManifestPodsTrainLocally starts every pod of plain.yaml and
// jobset.yaml as a local process of the real pstrain binary, with the
// arguments, environment (the downward API, ConfigMap keys, TF_CONFIG
// expanded from them) and volumes the manifest gives it, the cluster's
// names resolved to loopback (podsim_test.go): init containers first,
// then every task at once, chief, PS, standbys and the workers the Job
// runs. The run must reach its target, every process must exit 0, every
// standby must have registered, and the final checkpoint on the claim's
// volume must evaluate at the target. What this does not show is
// Kubernetes itself: scheduling, restarts, the controllers' own
// behaviour (README.md, "What the tests show").
func TestManifestPodsTrainLocally(t *testing.T) {
	for _, file := range []string{"plain.yaml", "jobset.yaml"} {
		t.Run(file, func(t *testing.T) {
			root, pods := runManifest(t, file, 0, trainFlags)
			checkRun(t, root, pods)
			if log := chiefLog(pods); !strings.Contains(log, ", 2 workers,") {
				t.Errorf("the run's summary does not say 2 workers (the worker Job's parallelism):\n%s", tail(log, 20))
			}
		})
	}
}

// TestManifestWorkerJobScalesTheRun: the worker Job's parallelism raised
// by one (its pod of index 2 runs too, as after `kubectl patch` of
// completions and parallelism) adds a worker to the run, as `pstrain
// scale --workers 3` does under pstrain run: the summary reports the
// change 2 -> 3.
func TestManifestWorkerJobScalesTheRun(t *testing.T) {
	for _, file := range []string{"plain.yaml", "jobset.yaml"} {
		t.Run(file, func(t *testing.T) {
			_, pods := runManifest(t, file, 1, scaleFlags)
			if log := chiefLog(pods); !strings.Contains(log, "workers: 2 -> 3 at step") {
				t.Errorf("no change to 3 workers in the chief's summary:\n%s", tail(log, 25))
			}
		})
	}
}

// runManifest runs every pod of file, plus extraWorkers more pods of the
// worker Job, each task with flags added, until all have exited; it
// returns the directory the volumes are in and the pods.
func runManifest(t *testing.T, file string, extraWorkers int, flags []string) (string, []*localPod) {
	t.Helper()
	data := testbin.MNIST(t)
	exe := bin.Path(t)
	var ports portPool
	defer ports.release()
	s := newSim(t, manifests(t)[file], &ports)
	extra := s.raiseWorkers(extraWorkers)
	root := t.TempDir()
	var pods, late []*localPod
	for _, p := range s.pods {
		pods = append(pods, s.prepare(p, root, data, flags))
	}
	for _, p := range extra {
		late = append(late, s.prepare(p, root, data, flags))
	}
	makeSecrets(t, exe, root, pods)
	ports.release()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runPods(ctx, t, exe, pods, late)
	return root, append(pods, late...)
}

func chiefLog(pods []*localPod) string {
	for _, p := range pods {
		if p.role == cluster.Chief {
			return p.log
		}
	}
	return ""
}

// localPod is a pod ready to start: its containers' command lines and
// environments, and where its volumes are.
type localPod struct {
	name, role string
	inits      []localContainer
	main       localContainer
	clusterDoc string // the cluster its task reads (file or TF_CONFIG), resolved
	volumes    map[string]string
	log        string // the main container's output, once it has exited
}

type localContainer struct {
	name string
	args []string
	env  []string
}

// prepare lays out p's volumes under root and builds its containers.
func (s *sim) prepare(p *pod, root, data string, flags []string) *localPod {
	t := s.t
	t.Helper()
	lp := &localPod{name: p.name, volumes: map[string]string{}}
	for _, v := range p.spec.Volumes {
		lp.volumes[v.Name] = s.volumeDir(p, v, root, data)
	}
	for _, c := range p.spec.InitContainers {
		lp.inits = append(lp.inits, s.container(p, c, lp.volumes, nil))
	}
	if len(p.spec.Containers) != 1 {
		t.Fatalf("pod %s: %d containers, want 1", p.name, len(p.spec.Containers))
	}
	c := p.spec.Containers[0]
	lp.role = c.Args[0]
	lp.main = s.container(p, c, lp.volumes, flags)
	lp.clusterDoc = clusterDocOf(t, lp.main)
	return lp
}

// volumeDir is the local directory standing in for volume v of p: a
// ConfigMap's keys as files (names resolved), a claim's directory shared
// by every pod, a Secret's directory (filled by makeSecrets), an
// emptyDir of the pod's own. An emptyDir is seeded with the data set, as
// an image with the data baked in would be (README.md): the init
// containers' `pstrain data fetch` then verifies it instead of
// downloading it.
func (s *sim) volumeDir(p *pod, v corev1.Volume, root, data string) string {
	t := s.t
	var dir string
	switch {
	case v.ConfigMap != nil:
		dir = filepath.Join(root, "pods", p.name, "configmap-"+v.Name)
		cm, ok := s.configMaps[v.ConfigMap.Name]
		if !ok {
			t.Fatalf("pod %s volume %s: no ConfigMap %s in the manifest", p.name, v.Name, v.ConfigMap.Name)
		}
		mkdir(t, dir)
		for k, text := range cm.Data {
			resolved, err := s.resolveAddrs(text)
			if err != nil {
				t.Fatalf("ConfigMap %s key %s: %v", cm.Name, k, err)
			}
			writeFile(t, filepath.Join(dir, k), resolved, 0o644)
		}
	case v.PersistentVolumeClaim != nil:
		dir = filepath.Join(root, "claims", v.PersistentVolumeClaim.ClaimName)
		mkdir(t, dir)
	case v.Secret != nil:
		dir = filepath.Join(root, "secrets", v.Secret.SecretName)
	case v.EmptyDir != nil:
		dir = filepath.Join(root, "pods", p.name, "emptydir-"+v.Name)
		mkdir(t, dir)
		for _, f := range []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
			if err := os.Symlink(filepath.Join(data, f), filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("pod %s volume %s: no local stand-in for its kind", p.name, v.Name)
	}
	return dir
}

// container builds c's command line and environment in p: the
// kubelet's environment and $(VAR) expansion, mount paths mapped to the
// volumes' directories, the pod's listening addresses to its local
// ports, and extra arguments after the manifest's.
func (s *sim) container(p *pod, c corev1.Container, volumes map[string]string, extra []string) localContainer {
	t := s.t
	env, vars, err := s.containerEnv(p, c)
	if err != nil {
		t.Fatalf("pod %s: %v", p.name, err)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = volumes[m.Name]
	}
	var args []string
	for _, a := range slices.Concat(c.Args, extra) {
		args = append(args, s.listenAddr(p, mapPaths(expand(a, vars), mounts)))
	}
	for i, e := range env {
		env[i] = mapPaths(e, mounts)
	}
	return localContainer{name: c.Name, args: args, env: env}
}

// mapPaths replaces a mount path at the start of arg or of its value
// (after "=") by the volume's local directory.
func mapPaths(arg string, mounts map[string]string) string {
	prefix, val, ok := strings.Cut(arg, "=")
	if !ok {
		prefix, val = "", arg
	} else {
		prefix += "="
	}
	paths := slices.Sorted(func(yield func(string) bool) {
		for mp := range mounts {
			if !yield(mp) {
				return
			}
		}
	})
	slices.Reverse(paths) // a deeper mount first
	for _, mp := range paths {
		if val == mp || strings.HasPrefix(val, mp+"/") {
			return prefix + mounts[mp] + strings.TrimPrefix(val, mp)
		}
	}
	return arg
}

// anyAddr is a listening address on every interface of the pod: ":9090".
var anyAddr = regexp.MustCompile(`^(--?[a-z-]+=)(?:0\.0\.0\.0)?:([0-9]+)$`)

// listenAddr maps a listening address of the pod (":9090") to the
// pod's local port for it.
func (s *sim) listenAddr(p *pod, arg string) string {
	m := anyAddr.FindStringSubmatch(arg)
	if m == nil {
		return arg
	}
	cp, _ := strconv.Atoi(m[2])
	return m[1] + "127.0.0.1:" + strconv.Itoa(s.localPort(p, cp))
}

// clusterDocOf is the cluster a task container reads: its --cluster file
// or its TF_CONFIG. Every address in it must be local by now: a name the
// cluster's DNS would not resolve has failed resolveAddrs.
func clusterDocOf(t *testing.T, c localContainer) string {
	t.Helper()
	if c.args[0] == "data" {
		return ""
	}
	doc := ""
	for _, a := range c.args {
		if f, ok := strings.CutPrefix(a, "--cluster="); ok {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			doc = string(b)
		}
	}
	for _, e := range c.env {
		if v, ok := strings.CutPrefix(e, "TF_CONFIG="); ok && doc == "" {
			doc = v
		}
	}
	spec, _, err := cluster.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("%s: the cluster it reads: %v\n%s", c.name, err, doc)
	}
	for _, task := range spec.Tasks() {
		if a, _ := spec.Addr(task); !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("%s: %s at %s, not resolved", c.name, task, a)
		}
	}
	return doc
}

// makeSecrets fills the pstrain-tls Secret as README.md says: `pstrain
// certs` for the cluster the tasks read, without the CA key.
func makeSecrets(t *testing.T, exe, root string, pods []*localPod) {
	t.Helper()
	var doc string
	for _, p := range pods {
		if p.clusterDoc != "" {
			doc = p.clusterDoc
			break
		}
	}
	spec, _, err := cluster.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cf := filepath.Join(root, "k8s-cluster.json")
	writeFile(t, cf, string(spec.JSON()), 0o644)
	dir := filepath.Join(root, "secrets", "pstrain-tls")
	if out, err := exec.Command(exe, "certs", "--cluster", cf, "--out", dir).CombinedOutput(); err != nil {
		t.Fatalf("pstrain certs: %v\n%s", err, out)
	}
	if err := os.Remove(filepath.Join(dir, "ca-key.pem")); err != nil {
		t.Fatal(err)
	}
}

// podRun is a started container process.
type podRun struct {
	pod *localPod
	cmd *exec.Cmd
	out syncbuf.Buffer
	err error
}

// runPods runs every pod's init containers, then starts all the pods'
// main containers at once; once the chief has logged that training
// started, it starts the late pods (a Job's parallelism raised during
// the run) the same way. It waits for every process to exit.
func runPods(ctx context.Context, t *testing.T, exe string, pods, late []*localPod) {
	t.Helper()
	var wg sync.WaitGroup
	runs := startPods(ctx, t, exe, pods, &wg)
	if len(late) > 0 {
		var chief *podRun
		for _, r := range runs {
			if r.pod.role == cluster.Chief {
				chief = r
			}
		}
		if !waitFor(ctx, func() bool { return strings.Contains(chief.out.String(), `msg="training started"`) }) {
			t.Errorf("the chief never started training:\n%s", tail(chief.out.String(), 30))
		} else {
			runs = append(runs, startPods(ctx, t, exe, late, &wg)...)
		}
	}
	wg.Wait()
	for _, r := range runs {
		if r.err != nil {
			t.Errorf("pod %s (%s): %v\n%s", r.pod.name, r.pod.role, r.err, tail(r.out.String(), 40))
		}
		r.pod.log = r.out.String()
	}
	if t.Failed() {
		t.FailNow()
	}
}

// startPods runs the pods' init containers to completion, then starts
// their main containers, each waited for by a goroutine of wg.
func startPods(ctx context.Context, t *testing.T, exe string, pods []*localPod, wg *sync.WaitGroup) []*podRun {
	t.Helper()
	for _, p := range pods {
		for _, c := range p.inits {
			if out, err := command(ctx, exe, c).CombinedOutput(); err != nil {
				t.Fatalf("pod %s init container %s: %v\n%s", p.name, c.name, err, out)
			}
		}
	}
	var runs []*podRun
	for _, p := range pods {
		r := &podRun{pod: p, cmd: command(ctx, exe, p.main)}
		r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
		r.cmd.WaitDelay = 5 * time.Second
		if err := r.cmd.Start(); err != nil {
			t.Fatalf("pod %s: %v", p.name, err)
		}
		runs = append(runs, r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.err = r.cmd.Wait()
		}()
	}
	return runs
}

// waitFor polls cond until it holds (true) or ctx ends (false).
func waitFor(ctx context.Context, cond func() bool) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// command is c run as the image would run it: pstrain (its entrypoint)
// with the container's arguments and only its environment, besides PATH.
func command(ctx context.Context, exe string, c localContainer) *exec.Cmd {
	cmd := exec.CommandContext(ctx, exe, c.args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, c.env...)
	return cmd
}

// checkRun: the chief reached the target, every standby registered, and
// the final checkpoint on the claim evaluates at the target.
func checkRun(t *testing.T, root string, pods []*localPod) {
	t.Helper()
	chiefLog := chiefLog(pods)
	standbys := 0
	for _, p := range pods {
		if p.role == cluster.Standby {
			standbys++
		}
	}
	if standbys == 0 {
		t.Error("no standby pods: the manifest runs no hot standbys")
	}
	if !strings.Contains(chiefLog, "stopped by: target") {
		t.Fatalf("the chief did not stop at its target:\n%s", tail(chiefLog, 40))
	}
	if m := regexp.MustCompile(`stopped by: .*`).FindString(chiefLog); m != "" {
		t.Log("chief: " + m)
	}
	for i := range standbys {
		if !regexp.MustCompile(`msg="task registered" .*task=standby/` + strconv.Itoa(i) + ` `).MatchString(chiefLog) {
			t.Errorf("standby/%d never registered with the chief", i)
		}
	}
	ckpt := ""
	for _, p := range pods {
		if p.role == cluster.Chief {
			for _, a := range p.main.args {
				if v, ok := strings.CutPrefix(a, "--checkpoint-dir="); ok {
					ckpt = v
				}
			}
		}
	}
	if !strings.HasPrefix(ckpt, filepath.Join(root, "claims")+"/") {
		t.Fatalf("the chief's checkpoints go to %q, not a claim's volume", ckpt)
	}
	checkCheckpoint(t, bin.Path(t), ckpt, pods)
}

// checkCheckpoint evaluates the newest checkpoint in dir on the test set.
func checkCheckpoint(t *testing.T, exe, dir string, pods []*localPod) {
	t.Helper()
	var dataDir string
	for _, p := range pods {
		if p.role == cluster.Chief {
			for _, a := range p.main.args {
				if v, ok := strings.CutPrefix(a, "--data-dir="); ok {
					dataDir = v
				}
			}
		}
	}
	out, err := exec.Command(exe, "eval", "--checkpoint", dir, "--data-dir", dataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("pstrain eval: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`accuracy[^0-9]*([0-9.]+)%`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("pstrain eval printed no accuracy:\n%s", out)
	}
	acc, _ := strconv.ParseFloat(string(m[1]), 64)
	if acc < 90 {
		t.Errorf("the final checkpoint scores %.2f%%, under the 90%% target:\n%s", acc, out)
	}
	t.Logf("final checkpoint: %.2f%% test accuracy", acc)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, text string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
}
