/**
 * Property test of the installer's tar extraction (issue 9, fuzzing): random archives
 * (hostile names — `..`, absolute, backslashes, control characters, `.pkg/` — links whose
 * targets climb, link chains, hard links, devices, entries that pass through links,
 * manifests that disagree with the entries) and mutated valid archives (flipped bytes,
 * truncations, spliced headers), extracted whole or as a delta over an installed tree.
 * Whatever happens: only RunnerDepotErrors are thrown, nothing outside the target
 * directory is written, and every link left in the target resolves inside it (or not at
 * all).
 */
import { createHash } from "node:crypto";
import { lstat, mkdir, mkdtemp, readdir, readFile, realpath, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import fc from "fast-check";
import tar from "tar-stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { extractPackage } from "../../src/depot/install/extract.js";
import type { ManifestItem } from "../../src/depot/install/manifest.js";
import { RunnerDepotError } from "../../src/errors.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

const sha = (s: string) => `sha256:${createHash("sha256").update(s).digest("hex")}`;

interface Entry {
  name: string;
  type: "file" | "directory" | "symlink" | "link" | "character-device" | "fifo";
  linkname?: string;
  content: string;
  /** Listed in the manifest as what (or not listed). */
  listed: "same" | "absent" | "file" | "dir" | "link";
}

async function pack(items: ManifestItem[], entries: Entry[], extra: Record<string, unknown>): Promise<Buffer> {
  const p = tar.pack();
  p.entry(
    { name: ".pkg/manifest.json", mode: 0o644 },
    JSON.stringify({ name: "pkg", version: "1.0.0", attributes: {}, requires: [], licenses: [], items, ...extra }),
  );
  for (const e of entries) {
    const header = { name: e.name, type: e.type, mode: 0o644, linkname: e.linkname };
    if (e.type === "file") p.entry(header, e.content);
    else p.entry(header);
  }
  p.finalize();
  const chunks: Buffer[] = [];
  for await (const c of p) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

const seg = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom("a", "b", "c", "l") },
  { weight: 2, arbitrary: fc.constant("..") },
  { weight: 1, arbitrary: fc.constantFrom(".", "", ".pkg", "\\", "a\u0001", "x\u0085", "/", "é") },
);
const name = fc.oneof(
  { weight: 5, arbitrary: fc.array(seg, { minLength: 1, maxLength: 4 }).map((s) => s.join("/")) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "/etc/passwd",
      "/tmp/x",
      "a/../../x",
      "../outside",
      ".pkg/manifest.json",
      ".pkg/licenses/MIT",
      "a/",
      "a//b",
    ),
  },
);
const entryArb: fc.Arbitrary<Entry> = fc.record({
  name,
  type: fc.constantFrom("file", "file", "directory", "symlink", "symlink", "link", "character-device", "fifo"),
  linkname: fc.oneof(name, fc.constantFrom("../../..", "../outside", "/", "/etc", "a/b/../../..")),
  content: fc.string({ maxLength: 12 }),
  listed: fc.constantFrom("same", "same", "same", "absent", "file", "dir", "link"),
});

/** The manifest item an entry claims to be (possibly lying about it). */
function itemOf(e: Entry): ManifestItem | null {
  const p = e.type === "directory" ? e.name.replace(/\/+$/, "") : e.name;
  const as = e.listed === "same" ? (e.type === "directory" ? "dir" : e.type === "symlink" ? "link" : "file") : e.listed;
  if (as === "absent") return null;
  if (as === "dir") return { type: "dir", path: p, mode: 0o755 };
  if (as === "link") return { type: "link", path: p, target: e.linkname };
  return { type: "file", path: p, mode: 0o644, size: Buffer.byteLength(e.content), digest: sha(e.content) };
}

const caseArb = fc.record({
  entries: fc.array(entryArb, { maxLength: 7 }),
  delta: fc.boolean(),
  removed: fc.array(name, { maxLength: 2 }),
  mutations: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
  cut: fc.option(fc.nat(), { nil: undefined }),
  splice: fc.option(fc.tuple(fc.nat(), fc.nat(), fc.integer({ min: 1, max: 1024 })), { nil: undefined }),
});

/** Every path below `dir` with its kind and, for files, content (links not followed). */
async function snapshot(dir: string, skip: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (abs: string, rel: string): Promise<void> => {
    for (const e of await readdir(abs, { withFileTypes: true })) {
      const childAbs = path.join(abs, e.name);
      if (childAbs === skip) continue;
      const childRel = `${rel}/${e.name}`;
      if (e.isDirectory()) {
        out.push(`${childRel}/`);
        await walk(childAbs, childRel);
      } else if (e.isFile()) out.push(`${childRel}=${await readFile(childAbs, "utf8")}`);
      else out.push(`${childRel}@`);
    }
  };
  await walk(dir, "");
  return out.sort();
}

describe("installer tar extraction fuzz", () => {
  let work: string;
  let sandbox: string;
  let baseline: string[];
  let n = 0;
  beforeAll(async () => {
    // tmpfs when there is one: thousands of small trees, made and removed.
    const base = await stat("/dev/shm").then(
      (st) => (st.isDirectory() ? "/dev/shm" : os.tmpdir()),
      () => os.tmpdir(),
    );
    work = await mkdtemp(path.join(base, "fuzz-extract-"));
    sandbox = path.join(work, "sandbox");
    // Sentinels beside and above every target (<sandbox>/pkg/t<n>): anything written
    // through `..` or a link lands among them.
    for (const d of ["a/b", "c", "l", "pkg/a", "pkg/l"]) await mkdir(path.join(sandbox, d), { recursive: true });
    await writeFile(path.join(sandbox, "passwd"), "root:x:0:0\n");
    await writeFile(path.join(sandbox, "pkg", "a", "keep"), "keep\n");
    baseline = await snapshot(sandbox, "");
  });
  afterAll(() => rm(work, { recursive: true, force: true }));

  it(
    "never writes outside the target; only RunnerDepotErrors; links left inside resolve inside",
    async () => {
      for (const params of fuzzParams("installer extraction")) {
        await fc.assert(
          fc.asyncProperty(caseArb, async (c) => {
            // A fresh target beside the others, inside the shared sandbox whose sentinels
            // (`baseline`) must never change.
            const target = path.join(sandbox, "pkg", `t${n++}`);
            await mkdir(target);
            if (c.delta) {
              // An installed tree to apply the delta onto, with a link that climbs to the root.
              await mkdir(path.join(target, "a", "b"), { recursive: true });
              await writeFile(path.join(target, "a", "f"), "old\n");
              await symlink("../..", path.join(target, "a", "b", "up"));
            }
            const items = c.entries.map(itemOf).filter((i): i is ManifestItem => i !== null);
            let bytes = await pack(items, c.entries, c.delta ? { from: "0.9.0", removed: c.removed } : {});
            if (c.mutations.length > 0 || c.cut !== undefined || c.splice !== undefined) {
              bytes = Buffer.from(bytes);
              for (const [at, value] of c.mutations) bytes[at % bytes.length] = value;
              if (c.splice) {
                const [from, to, len] = c.splice;
                bytes.copy(
                  bytes,
                  to % bytes.length,
                  from % bytes.length,
                  Math.min(bytes.length, (from % bytes.length) + len),
                );
              }
              if (c.cut !== undefined) bytes = bytes.subarray(0, c.cut % (bytes.length + 1));
            }

            await extractPackage([bytes], target, { delta: c.delta }).catch((error: unknown) => {
              expect(error, String((error as Error)?.stack)).toBeInstanceOf(RunnerDepotError);
            });

            expect(await snapshot(sandbox, target)).toEqual(baseline);
            const realTarget = await realpath(target);
            const links: string[] = [];
            const walk = async (abs: string): Promise<void> => {
              for (const e of await readdir(abs, { withFileTypes: true })) {
                const child = path.join(abs, e.name);
                if (e.isSymbolicLink()) links.push(child);
                else if (e.isDirectory()) await walk(child);
              }
            };
            await walk(target);
            for (const link of links) {
              const resolved = await realpath(link).catch(() => null);
              if (resolved !== null)
                expect(resolved === realTarget || resolved.startsWith(`${realTarget}/`), `${link} → ${resolved}`).toBe(
                  true,
                );
            }
            expect((await lstat(target)).isDirectory()).toBe(true);
            await rm(target, { recursive: true, force: true });
          }),
          params,
        );
      }
    },
    fuzzTimeout(300_000),
  );
});
