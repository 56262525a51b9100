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
if tar -tzf "$work/$tarball" | grep -E '\.map$' >&2; then echo "source maps in the tarball" >&2; exit 1; fi
tar -tzf "$work/$tarball" | grep -qx 'package/dist/cli.js' || { echo "no dist/cli.js in the tarball" >&2; exit 1; }
npx publint "$work/$tarball" --strict
npx attw "$work/$tarball" --profile node16

subpaths=(runner-depot runner-depot/runner runner-depot/depot runner-depot/adapters/memory runner-depot/adapters/fs \
  runner-depot/adapters/rabbitmq runner-depot/adapters/s3 runner-depot/adapters/postgres runner-depot/testing runner-depot/console)

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
  for sub in "${subpaths[@]:1}"; do echo "import * as m$RANDOM from \"$sub\";"; done
  echo 'const r: JobResult | undefined = undefined; const s: PackageStore | undefined = undefined;'
  echo 'export { createRunnerService, createRunnerClient, createPackageRouter, createDepotClient, r, s };'
} > check.mts
cp check.mts check.cts
npx tsc --noEmit --strict --module node16 --moduleResolution node16 --target es2022 --skipLibCheck false --types node check.mts
npx tsc --noEmit --strict --module node16 --moduleResolution node16 --target es2022 --types node check.cts
# The README's tour, exactly as printed, against the installed tarball (what a reader who
# ran `npm install runner-depot` gets): it starts both servers on loopback and exits 0.
"$root/node_modules/.bin/tsx" "$root/scripts/readme-tour.ts" > tour.mts
"$root/node_modules/.bin/tsx" tour.mts > tour.out
grep -q "^agent exit code 0$" tour.out && grep -q "'installed toolchain@1.4.0'" tour.out || { cat tour.out >&2; echo "README tour failed against the tarball" >&2; exit 1; }
echo "README tour against the tarball: ok"
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
