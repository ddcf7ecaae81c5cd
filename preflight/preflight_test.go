package preflight

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
)

var mnist = dataset.Shape{TrainN: 60000, TestN: 10000, Dim: 784, Classes: 10}

func TestEstimate(t *testing.T) {
	r := config.Default() // 784-800-10, momentum, 2 PS, 2 workers, batch 128
	params := 784.0*800 + 800 + 800*10 + 10
	f := Estimate(r, r.Spec(mnist.Dim, mnist.Classes), mnist)
	want := Footprint{
		Chief:  2*params*4 + 10000*784*4,
		PS:     3 * params * 4 / 2, // parameters, momentum and a gradient, halved
		Worker: 2*params*4 + 2*128*(784+800+10)*4 + 70000*784*4,
	}
	if f != want {
		t.Fatalf("Estimate = %+v, want %+v", f, want)
	}
	if got := f.Run(r); got != want.Chief+2*want.PS+2*want.Worker {
		t.Fatalf("Run = %v", got)
	}
	// Adam has two slots, SGD none.
	r.Optimizer = "adam"
	if got := Estimate(r, r.Spec(mnist.Dim, mnist.Classes), mnist).PS; got != 4*params*4/2 {
		t.Errorf("adam shard %v", got)
	}
	// Absurd sizes do not overflow: terabytes, not garbage.
	r.Hidden = []int{2000000000}
	if got := Estimate(r, r.Spec(mnist.Dim, mnist.Classes), mnist).Run(r); got < 1e13 || math.IsInf(got, 0) {
		t.Errorf("--hidden 2000000000: %v bytes", got)
	}
	r = config.Default()
	r.Batch = 2000000000
	if got := Estimate(r, r.Spec(mnist.Dim, mnist.Classes), mnist).Worker; got < 2e12 {
		t.Errorf("--batch 2000000000: worker %v bytes", got)
	}
}

func TestCheckMemory(t *testing.T) {
	if err := CheckMemory("the run", 1<<30, 2<<30, Fewer(config.Default())); err != nil {
		t.Fatal(err)
	}
	err := CheckMemory("the run (chief, 2 PS, 2 workers)", 12.5e12, 20<<30, Fewer(config.Default()))
	if err == nil {
		t.Fatal("12.5 TB fits in 20 GiB")
	}
	for _, want := range []string{"the run (chief, 2 PS, 2 workers) needs at least 11.4 TiB (12500000000000 bytes)",
		"has 20.0 GiB (21474836480 bytes) available", "--hidden"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

func TestMemAvailable(t *testing.T) {
	root := t.TempDir()
	meminfo := "MemTotal:       24683520 kB\nMemFree:        22000000 kB\nMemAvailable:   23456789 kB\nSwapTotal:       1048576 kB\nSwapFree:         524288 kB\n"
	if err := os.WriteFile(filepath.Join(root, "meminfo"), []byte(meminfo), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := MemAvailable(root)
	if err != nil || got != (23456789+524288)*1024 {
		t.Fatalf("MemAvailable = %d, %v", got, err)
	}
	if _, err := MemAvailable(t.TempDir()); err == nil {
		t.Fatal("no meminfo: no error")
	}
	if got, err := MemAvailable("/proc"); err != nil || got == 0 {
		t.Errorf("this machine: %d, %v", got, err)
	}
}

func TestCheckPortRange(t *testing.T) {
	for _, c := range []struct {
		base, n int
		want    string
	}{
		{0, 5, ""},
		{9000, 5, ""},
		{65531, 5, ""},
		{65532, 5, "needs 5 ports from it, up to 65536, past the last port 65535 (use at most 65531)"},
		{70000, 5, "--metrics-port-base 70000 is not a port"},
		{-1, 5, "is not a port"},
	} {
		err := CheckPortRange("--metrics-port-base", c.base, c.n)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("base %d, %d ports: %v; want %q", c.base, c.n, err, c.want)
		}
	}
}

func TestPositive(t *testing.T) {
	if err := Positive("--connect-timeout", time.Second); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, -time.Second} {
		if err := Positive("--connect-timeout", d); err == nil || !strings.Contains(err.Error(), "--connect-timeout must be > 0") {
			t.Errorf("%v: %v", d, err)
		}
	}
}

func TestCheckAddrs(t *testing.T) {
	for _, c := range []struct {
		a, b      string
		allowZero bool
		want      string // "" = fine
	}{
		{"127.0.0.1:17001", "127.0.0.1:17002", false, ""},
		{"localhost:17001", "127.0.0.1:17001", false, "same address"},
		{"LOCALHOST.:17001", "[::1]:17001", false, "same address"},
		{"[::ffff:127.0.0.1]:17001", "localhost:17001", false, "same address"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1:80", false, "same address"},
		{"host-a:2222", "host-b:2222", false, ""},
		{"Host-A:2222", "host-a:2222", false, "same address"},
		{":9100", "10.0.0.7:9100", false, "same address"},
		{"0.0.0.0:9100", "[::]:9100", false, "same address"},
		{"10.0.0.1:9100", "10.0.0.2:9100", false, ""},
		{"127.0.0.1:0", "127.0.0.1:0", true, ""},
		{"127.0.0.1:0", "127.0.0.1:1", false, "port 0"},
		{"127.0.0.1:70000", "127.0.0.1:1", false, "not a number in 0-65535"},
		{"127.0.0.1", "127.0.0.1:1", false, "missing port"},
	} {
		err := CheckAddrs([]Addr{{"ps/0", c.a}, {"ps/1", c.b}}, c.allowZero)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s, %s: %v; want %q", c.a, c.b, err, c.want)
		}
	}
	err := CheckAddrs([]Addr{{"chief", "localhost:17001"}, {"ps/0", "127.0.0.1:17002"}, {"worker/0", "127.0.0.1:17001"}}, false)
	if err == nil || err.Error() != "chief (localhost:17001) and worker/0 (127.0.0.1:17001) are the same address" {
		t.Errorf("three tasks: %v", err)
	}
}

func TestBytes(t *testing.T) {
	for b, want := range map[float64]string{512: "512 bytes", 1536: "1.5 KiB (1536 bytes)", 3 << 30: "3.0 GiB (3221225472 bytes)"} {
		if got := Bytes(b); got != want {
			t.Errorf("Bytes(%v) = %q, want %q", b, got, want)
		}
	}
}

// A CTR model's footprint counts its own parameters (its first layer
// takes the dense fields and every field's row), its shards the
// pre-filled rows of each table (key, row and Adagrad state), and its
// samples' dense values and keys; a run refused for its rows says
// --embedding-prefill would need less.
func TestEstimateCTR(t *testing.T) {
	r := config.Default()
	r.Model, r.Hidden, r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingPrefill = "ctr", []int{128, 64}, 16, "adagrad", 1_000_000
	shape := dataset.Shape{TrainN: 400000, TestN: 20000, Dim: 13, Classes: 26}
	spec := r.CTRSpec(shape.Dim, shape.Classes)
	features := 13.0 + 26*16
	params := features*128 + 128 + 128*64 + 64 + 64 + 1
	sample := 13.0*4 + 26*4 + 1
	f := Estimate(r, spec, shape)
	want := Footprint{
		Chief:  2*params*4 + 20000*sample,
		PS:     3*params*4/2 + 26*1e6*(16+16+2)*4/2,
		Worker: 2*params*4 + 2*128*(features+128+64+1)*4 + 400000/2*sample,
	}
	if f != want {
		t.Fatalf("Estimate = %+v, want %+v", f, want)
	}
	err := CheckMemory("ps/0", f.PS, 1<<30, Fewer(r))
	if err == nil || !strings.Contains(err.Error(), "--embedding-prefill") {
		t.Fatalf("%.0f bytes of rows in 1 GiB: %v; want a refusal naming --embedding-prefill", f.PS, err)
	}
}

// A CNN's footprint counts its own parameters (not an MLP's of the same
// --hidden) and, per sample, each conv block's patches, output and pooled
// map.
func TestEstimateCNN(t *testing.T) {
	r := config.Default()
	r.Model, r.Conv, r.Hidden = "cnn", []int{16, 32}, []int{256}
	params := 16.0*25 + 16 + 32*400 + 32 + 512*256 + 256 + 256*10 + 10
	units := 576.0*(25+16) + 144*16 + 64*(400+32) + 16*32 + 784 + 256 + 10
	f := Estimate(r, r.Spec(mnist.Dim, mnist.Classes), mnist)
	want := Footprint{
		Chief:  2*params*4 + 10000*784*4,
		PS:     3 * params * 4 / 2,
		Worker: 2*params*4 + 2*128*units*4 + 70000*784*4,
	}
	if f != want {
		t.Fatalf("Estimate = %+v, want %+v", f, want)
	}
}
