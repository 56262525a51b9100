#!/usr/bin/env bash
# `npm run test:vm`: builds the single-file agents (npm run build:agent) and the Debian image
# (test/vm/image.sh, cached by recipe), then runs test/vm/*.vm.ts: the agent in a QEMU VM
# and the arm64 agent under qemu-user. Needs root (debootstrap) and the Debian packages
# .ci/services.sh installs with RUNNER_DEPOT_VM=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
npm run build:agent
echo "::: agents built in $(($(date +%s) - start)) s"
start=$(date +%s)
bash test/vm/image.sh >/dev/null
echo "::: image ready in $(($(date +%s) - start)) s"
npx vitest run --config vitest.vm.config.ts "$@"
