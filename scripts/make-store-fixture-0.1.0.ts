/**
 * Writes test/fixtures/store-0.1.0/: a small fs store written by runner-depot 0.1.0 (run
 * once, with that version's code, before the store format changed), plus expected.json with
 * every version's digest and the SHA-256 of its /data bytes, so the upgrade test has real
 * old data. Kept for the record; running it with newer code writes a newer store.
 */
import { createHash } from "node:crypto";
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createFsStore } from "../src/adapters/fs/store.js";
import { publish, startDepot } from "../test/fixtures/depot.js";

const out = join(import.meta.dirname, "..", "test", "fixtures", "store-0.1.0");
await rm(out, { recursive: true, force: true });
const store = createFsStore(join(out, "store"));
const depot = await startDepot(store, { now: () => new Date("2026-11-20T10:00:00Z") });
const specs: [string, Parameters<typeof publish>[2]][] = [
  [
    "tools@1.0.0",
    [
      { type: "dir", path: "bin" },
      { type: "file", path: "bin/run", body: "#!/bin/sh\necho one\n", mode: "755" },
      { type: "file", path: "README", body: "tools 1.0.0\n" },
      { type: "license", name: "MIT", body: "MIT licence text\n" },
      { type: "set", attrs: { description: "tools, first" } },
    ],
  ],
  [
    "tools@1.1.0",
    [
      { type: "dir", path: "bin" },
      { type: "file", path: "bin/run", body: "#!/bin/sh\necho two\n", mode: "755" },
      { type: "file", path: "README", body: "tools 1.0.0\n" },
      { type: "link", path: "bin/go", target: "run" },
      { type: "license", name: "MIT", body: "MIT licence text\n" },
    ],
  ],
  ["lib@0.1.0", [{ type: "file", path: "lib.so", body: new Uint8Array([0, 1, 2, 3, 255]) }]],
  [
    "app@2.0.0",
    [
      { type: "file", path: "app", body: "app\n" },
      { type: "link", path: "current", target: "app" },
      { type: "require", requires: ["tools@^1.0.0", "lib@>=0.1.0"] },
      { type: "license", name: "Apache-2.0", body: "Apache licence\n" },
    ],
  ],
  ["meta@1.0.0", [{ type: "require", requires: ["app@2"] }]],
];
for (const [spec, additions] of specs) {
  const response = await publish(depot.url, spec, additions);
  if (response.status !== 201) throw new Error(`${spec}: ${response.status} ${await response.text()}`);
}
const sha = async (url: string) => {
  const r = await fetch(url);
  if (r.status !== 200) throw new Error(`${url}: ${r.status}`);
  return `sha256:${createHash("sha256")
    .update(Buffer.from(await r.arrayBuffer()))
    .digest("hex")}`;
};
// A delta, built and kept as it would be on first request.
const delta = await sha(`${depot.url}/data/tools/1.0.0/1.1.0`);
const versions: Record<string, { digest: string; bytes: string }> = {};
for (const [spec] of specs) {
  const info = (await (await fetch(`${depot.url}/version/${spec}`)).json()) as { versions: { digest: string }[] };
  versions[spec] = { digest: info.versions[0]!.digest, bytes: await sha(`${depot.url}/data/${spec}`) };
}
const catalog = await (await fetch(`${depot.url}/catalog`)).json();
await writeFile(
  join(out, "expected.json"),
  JSON.stringify({ format: "0.1.0", versions, delta: { "tools/1.0.0/1.1.0": delta }, catalog }, null, 2) + "\n",
);
await depot.close();
await store.close?.();
