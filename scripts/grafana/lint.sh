#!/usr/bin/env bash
# lint.sh - lint the pstrain Grafana dashboard(s) with grafana/dashboard-linter.
#
# Usage: scripts/grafana/lint.sh [dashboard.json...]
#        (default: every scripts/grafana/dashboards/*.json)
#
# Runs `dashboard-linter lint --strict`, which fails on any error or warning.
# Rules that must not apply to a dashboard are excluded, with a reason, in a
# .lint file next to it (see the linter's docs/index.md).
#
# The linter is installed if missing, at the pinned version below, with
#   GONOSUMDB=github.com/grafana/dashboard-linter GOFLAGS= go install ...
# run from a temporary directory so no go.mod is touched. If `go install`
# fails because the module proxy refuses the deprecation lookup (it needs
# the proxy's version list, which some proxies block), the script downloads
# the same pinned module with `go mod download` and builds it from the module
# cache instead.
#
# Environment:
#   DASHBOARD_LINTER  path of the linter binary to use (skips the lookup and
#                     the install)
set -euo pipefail

MODULE=github.com/grafana/dashboard-linter
VERSION=v0.0.0-20241224134444-1765d94aec4a

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

find_linter() {
	if [[ -n ${DASHBOARD_LINTER:-} ]]; then
		echo "$DASHBOARD_LINTER"
		return
	fi
	if command -v dashboard-linter >/dev/null 2>&1; then
		command -v dashboard-linter
		return
	fi
	local gobin
	gobin=$(go env GOBIN 2>/dev/null || true)
	if [[ -z $gobin ]]; then
		gobin=$(go env GOPATH 2>/dev/null | cut -d: -f1)/bin
	fi
	if [[ -x $gobin/dashboard-linter ]]; then
		echo "$gobin/dashboard-linter"
	fi
}

install_linter() {
	command -v go >/dev/null 2>&1 || {
		echo "lint.sh: dashboard-linter is missing and go is not installed" >&2
		exit 1
	}
	local tmp gobin dir
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' RETURN
	echo "lint.sh: installing $MODULE@$VERSION" >&2
	if (cd "$tmp" && GONOSUMDB=$MODULE GOFLAGS= go install "$MODULE@$VERSION"); then
		return
	fi
	echo "lint.sh: go install failed; building $MODULE@$VERSION from the module cache" >&2
	gobin=$(go env GOBIN)
	if [[ -z $gobin ]]; then
		gobin=$(go env GOPATH | cut -d: -f1)/bin
	fi
	dir=$(cd "$tmp" && GONOSUMDB=$MODULE GOFLAGS= go mod download -json "$MODULE@$VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z $dir || ! -d $dir ]]; then
		echo "lint.sh: could not download $MODULE@$VERSION" >&2
		exit 1
	fi
	mkdir -p "$gobin"
	(cd "$dir" && GONOSUMDB=$MODULE GOFLAGS=-buildvcs=false go build -o "$gobin/dashboard-linter" .)
}

linter=$(find_linter)
if [[ -z $linter ]]; then
	install_linter
	linter=$(find_linter)
fi
if [[ -z $linter || ! -x $linter ]]; then
	echo "lint.sh: dashboard-linter not found after installing it (is \$GOBIN or \$GOPATH/bin writable?)" >&2
	exit 1
fi

if [[ $# -eq 0 ]]; then
	set -- "$here"/dashboards/*.json
fi
status=0
for dashboard in "$@"; do
	echo "== $dashboard"
	# The linter prints the description of every rule it ran; only findings
	# are of interest.
	out=$("$linter" lint --strict "$dashboard" 2>&1) || status=1
	grep -v '^Checks ' <<<"$out" || true
done
if [[ $status -eq 0 ]]; then
	echo "dashboard-linter --strict: no findings"
fi
exit $status
