#!/usr/bin/env bash
# Regenerates the Go code from pstrain.proto. Needs protoc (Debian:
# protobuf-compiler) and the two Go plugins at the versions pinned below.
set -euo pipefail
cd "$(dirname "$0")"
GOFLAGS= go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOFLAGS= go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
PATH="$(go env GOPATH)/bin:$PATH" protoc --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative pstrain.proto
