#!/usr/bin/env bash
# Packs the package as npm would publish it, checks it with publint and
# @arethetypeswrong/cli, installs the tarball into an empty project, and there
# imports and requires every subpath and type-checks an import of each, and runs the
# README's tour against it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# `npm pack` builds first (the prepack script), as it does in a fresh clone.
tarball=$(npm pack --silent --pack-destination "$work" | tail -n1)
echo "packed $tarball"
# No source maps in the package (dist/ is readable as built).
tar -tzf "$work/$tarball" > "$work/files.txt"
if grep -E '\.map$' "$work/files.txt" >&2; then echo "source maps in the tarball" >&2; exit 1; fi
grep -qx 'package/dist/cli.js' "$work/files.txt" || { echo "no dist/cli.js in the tarball" >&2; exit 1; }
echo "tarball: $(wc -l < "$work/files.txt") files, $(wc -c < "$work/$tarball") bytes"
npx publint "$work/$tarball" --strict
npx attw "$work/$tarball" --profile node16

subpaths=(runner-depot runner-depot/runner runner-depot/depot runner-depot/adapters/memory runner-depot/adapters/fs \
  runner-depot/adapters/rabbitmq runner-depot/adapters/s3 runner-depot/adapters/postgres runner-depot/testing runner-depot/console)

# What a host that embeds the library installs: the tarball alone, no peers (serve's
# logger and OpenTelemetry SDK are optional peers). Counted with npm's own tree and
# measured with du; README "Installing" keeps the figures. Issue 29's bound: 12 MB
# (docs/decisions/public-surface.md, "What an embedder installs").
mkdir "$work/host" && cd "$work/host"
npm init -y >/dev/null
npm install --no-audit --no-fund --silent "$work/$tarball"
host_packages=$(npm ls --all --parseable 2>/dev/null | tail -n +2 | wc -l)
host_bytes=$(du -sb node_modules | cut -f1)
package_bytes=$(du -sb node_modules/runner-depot | cut -f1)
echo "host install: $host_packages packages, $host_bytes bytes of node_modules ($package_bytes of them runner-depot itself)"
[ "$host_bytes" -le 12000000 ] || { npm ls --all >&2; echo "a host's node_modules is over 12 MB" >&2; exit 1; }
# serve without its optional packages names them and the install command, and exits 1.
if npx --no-install runner-depot serve --data "$work/host/data" 2>serve.err; then echo "serve started without pino" >&2; exit 1; fi
grep -q "npm install @opentelemetry/core@" serve.err || { cat serve.err >&2; echo "serve did not name its missing packages" >&2; exit 1; }
echo "serve without its optional packages: $(cut -c1-60 serve.err)…"
# An Express host, installed from the tarball: the shipped examples run as shipped (they
# import the package by name), the depot and the console mounted in Express 5.
npm install --no-audit --no-fund --silent express@5
for example in depot-express console-express; do
  "$root/node_modules/.bin/tsx" "node_modules/runner-depot/examples/$example.ts" > "$example.out" 2>&1 ||
    { cat "$example.out" >&2; echo "examples/$example.ts failed in an Express host installed from the tarball" >&2; exit 1; }
done
grep -q "verified" depot-express.out && grep -q "login -> 303" console-express.out ||
  { cat depot-express.out console-express.out >&2; echo "the Express examples did not publish, download and sign in" >&2; exit 1; }
echo "Express host from the tarball: examples/depot-express.ts and console-express.ts ran"

mkdir "$work/app" && cd "$work/app"
npm init -y >/dev/null
# The optional peers the adapters load, so importing those subpaths works too.
npm install --no-audit --no-fund --silent "$work/$tarball" amqplib pg @aws-sdk/client-s3 @aws-sdk/lib-storage @aws-sdk/s3-request-presigner @types/pg @types/amqplib vitest@4 typescript@5.9 @types/node@22
for sub in "${subpaths[@]}"; do
  node --input-type=module -e "const m = await import('$sub'); if (Object.keys(m).length === 0) throw new Error('$sub exports nothing'); console.log('import  $sub:', Object.keys(m).length, 'exports')"
  if [ "$sub" != "runner-depot/testing" ]; then
    node -e "const m = require('$sub'); if (Object.keys(m).length === 0) throw new Error('$sub exports nothing'); console.log('require $sub:', Object.keys(m).length, 'exports')"
  fi
done
{
  echo 'import { createRunnerService, createRunnerClient, createPackageRouter, createDepotClient } from "runner-depot";'
  echo 'import type { JobResult, PackageStore } from "runner-depot";'
  # One name a subpath, by its index ($RANDOM names collided about once in 700 runs).
  for ((i = 1; i < ${#subpaths[@]}; i++)); do echo "import * as m$i from \"${subpaths[$i]}\";"; done
  echo 'const r: JobResult | undefined = undefined; const s: PackageStore | undefined = undefined;'
  echo 'export { createRunnerService, createRunnerClient, createPackageRouter, createDepotClient, r, s };'
} > check.mts
cp check.mts check.cts
npx tsc --noEmit --strict --module node16 --moduleResolution node16 --target es2022 --skipLibCheck false --types node check.mts
npx tsc --noEmit --strict --module node16 --moduleResolution node16 --target es2022 --types node check.cts
# The README's tour, exactly as printed, against the installed tarball (what a reader who
# ran `npm install runner-depot` gets): it starts both servers on loopback and exits 0.
"$root/node_modules/.bin/tsx" "$root/scripts/readme-tour.ts" > tour.mts
# Twice: a reader runs it again, and the second run must not trip over the first's data.
for run in 1 2; do
  "$root/node_modules/.bin/tsx" tour.mts > tour.out
  grep -q "^agent exit code 0$" tour.out && grep -q "'installed toolchain@1.4.0'" tour.out || { cat tour.out >&2; echo "README tour failed against the tarball (run $run)" >&2; exit 1; }
done
echo "README tour against the tarball, twice: ok"
# The console works from the tarball alone: its page, script and style are in the package.
node --input-type=module -e "
const { createConsole } = await import('runner-depot/console');
const c = createConsole({ base: '/c' });
const page = await c.fetch(new Request('http://127.0.0.1/c/'));
const html = await page.text();
const src = /src=\"([^\"]+console\.js[^\"]*)\"/.exec(html);
if (page.status !== 200 || !src) throw new Error('console page without its script');
const js = await c.fetch(new Request('http://127.0.0.1' + src[1]));
const text = await js.text();
if (js.status !== 200 || !text.includes('parseAnsi') && !text.includes('EventSource')) throw new Error('console script missing');
new Function(text.replace(/^\"use strict\";/, ''));
console.log('console  runner-depot/console: page and script served from the tarball (' + text.length + ' bytes of script)');
"
echo "pack check: ok"
