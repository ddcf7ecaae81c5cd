package launcher

import (
	"strconv"
	"strings"
)

// taskEnv is the environment of every task of a run on one host of ncpu
// cores that starts with tasks processes: the launcher's own, with
// OPENBLAS_NUM_THREADS=1 (a worker's products are one thread each; the
// cores are shared by process, not by BLAS thread) and GOMAXPROCS set to
// the cores' share of one task, at least 1.
//
// Why GOMAXPROCS: a Go process on 2 cores runs up to 2 threads of Go code
// and keeps its scheduler ready to use both. With 5 tasks on 2 cores
// that readiness is paid for and never used: a perf profile of the
// default cluster put 8% of all CPU in the runtime's thread hand-offs
// (sysmon's wake-ups, threads parked and woken around every blocking
// system call and cgo sgemm), 15% of a PS's (docs/scaling.md). A task
// whose share is one core runs one thread of Go code; its blocking calls
// and cgo still get threads of their own. A GOMAXPROCS the user set is
// left as it is.
func taskEnv(base []string, ncpu, tasks int) []string {
	env := append([]string(nil), base...)
	env = append(env, "OPENBLAS_NUM_THREADS=1")
	for _, kv := range base {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	return append(env, "GOMAXPROCS="+strconv.Itoa(max(1, ncpu/max(1, tasks))))
}
