#!/usr/bin/env bash
# monitor.sh - run a local Prometheus that scrapes a pstrain training run.
#
# Usage: scripts/monitor.sh [extra prometheus flags...]
#
# Starts Debian's prometheus in the foreground, listening on
# 127.0.0.1:${PROM_PORT}, scraping the targets that `pstrain run` writes as
# file_sd JSON files into ${SD_DIR}. Stop it with Ctrl-C.
#
# Environment (relative paths are taken from the current directory, i.e. the
# directory `pstrain run` was started from):
#   PROM_PORT  port to listen on                      (default 9090)
#   SD_DIR     directory of file_sd target files      (default run/targets)
#   PROM_DIR   state: generated config and TSDB data  (default run/prometheus)
#
# The configuration is generated from scripts/prometheus/prometheus.yml into
# ${PROM_DIR}/prometheus.yml: the file_sd line marked "# __SD_DIR__" is
# replaced with the absolute path of ${SD_DIR}/*.json, because Prometheus
# resolves relative file_sd paths against the config file's directory.
# The TSDB lives in ${PROM_DIR}/data, so a finished run can still be browsed
# by starting this script again; delete ${PROM_DIR} to start afresh.
set -euo pipefail

PROM_PORT=${PROM_PORT:-9090}
SD_DIR=${SD_DIR:-run/targets}
PROM_DIR=${PROM_DIR:-run/prometheus}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
template=$repo/scripts/prometheus/prometheus.yml

if ! command -v prometheus >/dev/null 2>&1; then
	echo "monitor.sh: prometheus is not installed; install it with: apt-get install -y prometheus" >&2
	exit 1
fi
case $PROM_PORT in
'' | *[!0-9]*)
	echo "monitor.sh: PROM_PORT must be a port number, got '$PROM_PORT'" >&2
	exit 2
	;;
esac
# Something already listens there (Debian's prometheus service starts on
# :9090 when the package is installed; it is not ours to stop): say so
# rather than fail on "address already in use".
if (exec 3<>"/dev/tcp/127.0.0.1/$PROM_PORT") 2>/dev/null; then
	echo "monitor.sh: 127.0.0.1:$PROM_PORT is already in use (perhaps a Prometheus service); pick another port, e.g. PROM_PORT=19090 $0" >&2
	exit 1
fi

# The target directory may not exist yet if the run has not started; create it
# so that Prometheus can watch it.
mkdir -p "$SD_DIR" "$PROM_DIR/data"
sd_abs=$(cd "$SD_DIR" && pwd)
prom_abs=$(cd "$PROM_DIR" && pwd)
config=$prom_abs/prometheus.yml

# YAML single-quoted scalar: a quote is written as two quotes.
pattern="$sd_abs/*.json"
pattern=${pattern//\'/\'\'}
awk -v pattern="$pattern" '
	/# __SD_DIR__$/ {
		i = index($0, "- ")
		print substr($0, 1, i - 1) "- '\''" pattern "'\'' # __SD_DIR__"
		n++
		next
	}
	{ print }
	END { if (n != 1) exit 3 }
' "$template" >"$config.tmp" || {
	echo "monitor.sh: $template must have exactly one file_sd line marked '# __SD_DIR__'" >&2
	rm -f "$config.tmp"
	exit 1
}
mv "$config.tmp" "$config"

if command -v promtool >/dev/null 2>&1; then
	promtool check config --syntax-only "$config" >/dev/null
fi

url=http://127.0.0.1:$PROM_PORT
cat <<MSG
Prometheus for pstrain
  URL:      $url   (targets: $url/targets)
  targets:  $sd_abs/*.json
  config:   $config
  data:     $prom_abs/data
Press Ctrl-C to stop.
MSG

exec prometheus \
	--config.file="$config" \
	--storage.tsdb.path="$prom_abs/data" \
	--web.listen-address="127.0.0.1:$PROM_PORT" \
	--log.level=warn \
	"$@"
