#!/usr/bin/env bash
# Builds the three images where a Docker engine runs (the project's CI machines have only the client, so CI lints
# docker/Dockerfile instead), timing each. Usage: docker/build.sh [TAG]   (default 0.1.0); build arguments as
# the Dockerfile's ARGs, e.g. EXTRA="--build-arg MAX_JOBS=4" docker/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-0.1.0}
for target in gateway drafter verifier; do
  began=$SECONDS
  # shellcheck disable=SC2086
  docker build -f docker/Dockerfile --target "$target" -t "specd/$target:$tag" ${EXTRA:-} .
  echo "docker/build.sh: specd/$target:$tag built in $((SECONDS - began)) s"
done
