/**
 * The depot client against a real listening depot (H3's router + servePackageRouter
 * over the fs store), through real fetch.
 */
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, readFile, readdir, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { readInstalled } from "../../../src/depot/install/installer.js";
import {
  corruptingFetch,
  cuttingFetch,
  loggingFetch,
  snapshotTree,
  startDepot,
} from "../../fixtures/depot-client-harness.js";
import { failure } from "../../fixtures/errors.js";

type Depot = Awaited<ReturnType<typeof startDepot>>;
let depot: Depot;

beforeAll(async () => {
  depot = await startDepot();
});
afterAll(async () => {
  await depot?.close();
});

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
// The depot refuses a package without items (COMMIT_INVALID, EMPTY).
const readme = () => [{ type: "file" as const, path: "README", content: "readme" }];

/** A source tree with what a real package holds: nesting, modes, links, odd names. */
async function makeTree(root: string, seed: string) {
  await mkdir(path.join(root, "bin"), { recursive: true });
  await mkdir(path.join(root, "lib/deep/er"), { recursive: true });
  await mkdir(path.join(root, "empty"));
  await mkdir(path.join(root, "private"));
  await writeFile(path.join(root, "bin/tool"), `#!/bin/sh\necho ${seed}\n`);
  await chmod(path.join(root, "bin/tool"), 0o755);
  await writeFile(path.join(root, "lib/deep/er/data.bin"), randomBytes(200_000));
  await writeFile(path.join(root, "lib/empty-file"), "");
  await writeFile(path.join(root, "private/secret"), `secret ${seed}`);
  await chmod(path.join(root, "private/secret"), 0o600);
  await chmod(path.join(root, "private"), 0o700);
  // Commas, spaces, percent signs and non-ASCII must survive header encoding.
  await writeFile(path.join(root, "lib/ünï cödé, 100%.txt"), `unicode ${seed}`);
  // Longer than ustar's 100-byte name field: the archive needs a pax header.
  await writeFile(path.join(root, "lib/deep/er", `${"long-name-".repeat(14)}${seed}.txt`), `long ${seed}`);
  await symlink("../bin/tool", path.join(root, "lib/tool-link"));
  await symlink("deep/er", path.join(root, "lib/er-link"));
}

describe("publish and install", () => {
  it("installs into an empty directory exactly what was published, with its dependency", async () => {
    const src = await depot.tempDir("src-app");
    const libSrc = await depot.tempDir("src-lib");
    await makeTree(src, "app");
    await writeFile(path.join(libSrc, "lib.txt"), "the library");
    const client = createDepotClient({ baseUrl: depot.url });

    const lib = await client.publish({
      name: "lib",
      version: "1.2.0",
      dir: libSrc,
      attributes: { description: "a lib, with commas = fine" },
    });
    const app = await client.publish({
      name: "app",
      version: "1.0.0",
      dir: src,
      requires: { lib: "^1.0.0" },
      license: { name: "MIT", text: "Permission is hereby granted…" },
    });
    expect(app).toMatchObject({ name: "app", version: "1.0.0" });
    expect(app.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(lib.digest).toMatch(/^sha256:/);

    expect((await client.depends("app@1.0.0")).requires).toEqual([{ name: "lib", range: "^1.0.0" }]);
    const versions = await client.versions("lib");
    expect(versions.latest).toBe("1.2.0");
    expect(versions.versions[0]!.attributes).toMatchObject({ description: "a lib, with commas = fine" });

    const target = await depot.tempDir("install");
    const events: string[] = [];
    const result = await client.install("app", target, { onProgress: (e) => events.push(e.phase) });
    expect(result.root).toEqual({ name: "app", version: "1.0.0" });
    expect(result.packages.map((p) => [p.name, p.version, p.action, p.via])).toEqual([
      ["lib", "1.2.0", "installed", "full"],
      ["app", "1.0.0", "installed", "full"],
    ]);
    expect(events).toContain("resolved");
    expect(events.at(-1)).toBe("done");
    expect(await snapshotTree(path.join(target, "app"))).toEqual(await snapshotTree(src));
    expect(await snapshotTree(path.join(target, "lib"))).toEqual(await snapshotTree(libSrc));
    expect((await readdir(target)).sort()).toEqual([".runner-depot", "app", "lib"]);
    const installed = await readInstalled(target);
    expect(installed.packages.app).toMatchObject({ version: "1.0.0", digest: app.digest });
    expect(installed.packages.lib).toMatchObject({ version: "1.2.0", digest: lib.digest });

    // Installing again changes nothing and downloads nothing.
    const again = await client.install("app", target);
    expect(again.packages.every((p) => p.action === "unchanged" && p.bytes === 0)).toBe(true);
  });

  it("sends a file's bytes once: a second version takes known files by reference", async () => {
    const src = await depot.tempDir("src-ref");
    await makeTree(src, "ref");
    const client = createDepotClient({ baseUrl: depot.url });
    const first = await client.publish({ name: "reftool", version: "1.0.0", dir: src });
    const fileBytes = (await snapshotTree(src)) as Record<string, { type: string; size?: number }>;
    const total = Object.values(fileBytes).reduce((n, f) => n + (f.size ?? 0), 0);
    expect(first.bytesSent).toBe(total);

    const added = randomBytes(50_000);
    await writeFile(path.join(src, "new.bin"), added);
    const putsBefore = depot.store.puts.length;
    const second = await client.publish({ name: "reftool", version: "1.1.0", dir: src });
    // The empty file travels as an empty upload; every other old file by reference.
    expect(second.bytesSent).toBe(added.length);
    expect(second.uploaded).toBe(2);
    expect(second.byReference).toBe(first.uploaded - 1);
    // What reached the store's putBlob during the second publish: of the package's files,
    // only the new one (the rest is the archive and the manifest the server builds).
    const fileDigests = new Set<string>();
    for (const [, node] of Object.entries(await snapshotTree(src)))
      if (node.type === "file") fileDigests.add(`sha256:${node.sha256}`);
    const filePuts = depot.store.puts.slice(putsBefore).filter((p) => fileDigests.has(p.digest) && p.bytes > 0);
    expect(filePuts).toEqual([{ digest: `sha256:${sha(added)}`, bytes: added.length }]);
  });

  it("keeps the catalog's ETag and position: a 304 when nothing changed, only the changes (?since=) when something did", async () => {
    const { fetch, log } = loggingFetch();
    const client = createDepotClient({ baseUrl: depot.url, fetch });
    const first = await client.catalog();
    expect(first.packages.app?.versions).toContain("1.0.0");
    expect(first.position).toBeGreaterThan(0);
    const second = await client.catalog();
    expect(second).toEqual(first);
    const catalogCalls = log.filter((r) => new URL(r.url).pathname.endsWith("/catalog"));
    expect(catalogCalls.map((r) => [new URL(r.url).search, r.status])).toEqual([
      ["", 200],
      [`?since=${first.position}`, 304],
    ]);
    expect(catalogCalls[1]!.headers["if-none-match"]).toBeTruthy();

    await client.publish({ name: "fresh", version: "0.1.0", items: [{ type: "file", path: "f", content: "f" }] });
    const third = await client.catalog();
    expect(third.packages.fresh?.versions).toEqual(["0.1.0"]);
    expect(third.position).toBe(first.position! + 1);
    expect({ ...third.packages, fresh: undefined }).toEqual({ ...first.packages, fresh: undefined });
    expect(third.count).toBe(first.count + 1);
    const last = log.filter((r) => new URL(r.url).pathname.endsWith("/catalog")).at(-1)!;
    expect([new URL(last.url).search, last.status]).toEqual([`?since=${first.position}`, 200]);
  });

  it("follows the catalog's pages (a depot that answers 2 packages a page)", async () => {
    const { fetch, log } = loggingFetch();
    // A fetch that asks for pages of 2, as a depot with a small default would answer.
    const paged: typeof globalThis.fetch = (input, init) => {
      const target = new URL(String(input instanceof Request ? input.url : input));
      if (
        target.pathname.endsWith("/catalog") &&
        !target.searchParams.has("limit") &&
        !target.searchParams.has("since")
      )
        target.searchParams.set("limit", "2");
      return fetch(target.href, init);
    };
    const whole = await createDepotClient({ baseUrl: depot.url }).catalog();
    const client = createDepotClient({ baseUrl: depot.url, fetch: paged });
    const walked = await client.catalog();
    expect(walked.packages).toEqual(whole.packages);
    const pages = log.filter((r) => new URL(r.url).pathname.endsWith("/catalog"));
    expect(pages.length).toBe(Math.ceil(Object.keys(whole.packages).length / 2));
    expect(pages.length).toBeGreaterThan(1);
  });

  it("turns problem documents into RunnerDepotError and abandons a failed transaction", async () => {
    const { fetch, log } = loggingFetch();
    const client = createDepotClient({ baseUrl: depot.url, fetch });
    const exists = await failure(client.publish({ name: "lib", version: "1.2.0", items: [] }));
    expect(exists.code).toBe("VERSION_EXISTS");
    expect(exists.status).toBe(409);

    const bad = await failure(
      client.publish({
        name: "badpath",
        version: "1.0.0",
        items: [
          { type: "file", path: "ok", content: "ok" },
          { type: "file", path: "../escape", content: "x" },
        ],
      }),
    );
    expect(bad.code).toBe("PATH_INVALID");
    expect(bad.status).toBe(400);
    const abandon = log.find((r) => r.method === "DELETE" && r.url.includes("/trans/"));
    expect(abandon?.status).toBe(204);
    const notFound = await failure(client.versions("badpath"));
    expect(notFound.status).toBe(404);
    expect(notFound.code).toMatch(/NOT_FOUND$/);
  });
});

describe("download", () => {
  let archive: Buffer;
  let spec: string;
  beforeAll(async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    // Incompressible, several MiB, so a cut lands mid-transfer.
    await client.publish({
      name: "blob",
      version: "1.0.0",
      items: [{ type: "file", path: "big.bin", content: randomBytes(3 * 2 ** 20) }],
    });
    spec = "blob@1.0.0";
    const out = path.join(await depot.tempDir("dl"), "whole.tar");
    const whole = await client.download(spec, { to: out });
    expect(whole.resumes).toBe(0);
    archive = await readFile(out);
    expect(`sha256:${sha(archive)}`).toBe(whole.digest);
    expect((await client.versions("blob")).versions[0]!.digest).toBe(whole.digest);
  });

  for (const mode of ["error", "end"] as const) {
    it(`resumes with Range after a broken transfer (${mode === "error" ? "connection reset" : "early clean end"})`, async () => {
      const { fetch, log } = loggingFetch(cuttingFetch({ afterBytes: 1_000_000, breaks: 2, mode }));
      const client = createDepotClient({ baseUrl: depot.url, fetch, retryDelayMs: 1 });
      const out = path.join(await depot.tempDir("dl"), "resumed.tar");
      const progress: number[] = [];
      const result = await client.download(spec, { to: out, onProgress: (p) => progress.push(p.received) });
      expect(result.resumes).toBe(2);
      expect(Buffer.compare(await readFile(out), archive)).toBe(0);
      expect(result.digest).toBe(`sha256:${sha(archive)}`);
      const data = log.filter((r) => r.url.includes("/data/"));
      expect(data.map((r) => r.status)).toEqual([200, 206, 206]);
      expect(data[1]!.headers.range).toBe("bytes=1000000-");
      expect(data[2]!.headers.range).toBe("bytes=2000000-");
      expect(data[1]!.headers["if-range"]).toBeTruthy();
      expect(progress.at(-1)).toBe(archive.length);
    });
  }

  it("gives up after the retries and removes the partial file", async () => {
    const client = createDepotClient({
      baseUrl: depot.url,
      fetch: cuttingFetch({ afterBytes: 0, breaks: 100, mode: "error" }),
      retries: 2,
      retryDelayMs: 1,
    });
    const dir = await depot.tempDir("dl");
    const error = await failure(client.download(spec, { to: path.join(dir, "x.tar") }));
    expect(error.code).toBe("UNAVAILABLE");
    expect(await readdir(dir)).toEqual([]);
  });

  it("detects a corrupted body and leaves no file behind", async () => {
    const client = createDepotClient({ baseUrl: depot.url, fetch: corruptingFetch(123_456) });
    const dir = await depot.tempDir("dl");
    const error = await failure(client.download(spec, { to: path.join(dir, "bad.tar") }));
    expect(error.code).toBe("DIGEST_MISMATCH");
    expect(await readdir(dir)).toEqual([]);
  });

  it("streams to a writable and reads the manifest with a Range request", async () => {
    const { fetch, log } = loggingFetch();
    const client = createDepotClient({ baseUrl: depot.url, fetch });
    const chunks: Uint8Array[] = [];
    const result = await client.download(spec, { to: new WritableStream({ write: (c) => void chunks.push(c) }) });
    expect(result.path).toBeUndefined();
    expect(Buffer.compare(Buffer.concat(chunks), archive)).toBe(0);
    const manifest = await client.manifest(spec);
    expect(manifest.items.map((i) => i.path)).toEqual(["big.bin"]);
    expect(log.at(-1)!.status).toBe(206);
  });
});

describe("install failures", () => {
  it("reports a dependency cycle and an unknown dependency, leaving the target untouched", async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    await client.publish({ name: "cyc-a", version: "1.0.0", items: readme(), requires: { "cyc-b": "^1" } });
    await client.publish({ name: "cyc-b", version: "1.0.0", items: readme(), requires: { "cyc-a": "^1" } });
    await client.publish({ name: "needs-ghost", version: "1.0.0", items: readme(), requires: { ghost: "^2" } });
    const target = await depot.tempDir("fail");
    const cycle = await failure(client.install("cyc-a", target));
    expect(cycle.code).toBe("DEPENDENCY_CYCLE");
    expect(cycle.message).toBe("dependency cycle: cyc-a@1.0.0 → cyc-b@1.0.0 → cyc-a@1.0.0");
    const ghost = await failure(client.install("needs-ghost", target));
    expect(ghost.code).toBe("DEPENDENCY_UNRESOLVED");
    expect(ghost.message).toContain("ghost is not in the depot (required as ^2 by needs-ghost@1.0.0)");
    expect(await readdir(target)).toEqual([".runner-depot"]);
    expect(await readdir(path.join(target, ".runner-depot"))).toEqual([]);
  });

  it("reports a version conflict between two dependents", async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    await client.publish({ name: "conf-c", version: "1.0.0", items: readme() });
    await client.publish({ name: "conf-c", version: "2.0.0", items: readme() });
    await client.publish({ name: "conf-a", version: "1.0.0", items: readme(), requires: { "conf-c": "^1" } });
    await client.publish({ name: "conf-b", version: "1.0.0", items: readme(), requires: { "conf-c": "^2" } });
    await client.publish({
      name: "conf-app",
      version: "1.0.0",
      items: readme(),
      requires: { "conf-a": "*", "conf-b": "*" },
    });
    const error = await failure(client.install("conf-app", await depot.tempDir("conf")));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toContain("^1 (required by conf-app@1.0.0 → conf-a@1.0.0)");
    expect(error.message).toContain("^2 (required by conf-app@1.0.0 → conf-b@1.0.0)");
  });

  it("refuses to run while another live install holds the lock, and takes over a dead one's", async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    await client.publish({ name: "locked", version: "1.0.0", items: readme() });
    const target = await depot.tempDir("lock");
    await mkdir(path.join(target, ".runner-depot"));
    const lock = path.join(target, ".runner-depot", "lock");
    await writeFile(lock, String(process.pid));
    const error = await failure(client.install("locked", target));
    expect(error.code).toBe("CONFLICT");
    expect(error.message).toContain(`pid ${process.pid}`);
    expect(existsSync(path.join(target, "locked"))).toBe(false);
    // A pid no process has (beyond pid_max): the lock is stale.
    await writeFile(lock, "4194305");
    await client.install("locked", target);
    expect(await readFile(path.join(target, "locked", "README"), "utf8")).toBe("readme");
    expect(existsSync(lock)).toBe(false);
  });

  it("keeps the previous install when a later package fails to verify", async () => {
    const good = createDepotClient({ baseUrl: depot.url });
    await good.publish({
      name: "keep-dep",
      version: "1.0.0",
      items: [{ type: "file", path: "dep.txt", content: "dep v1" }],
    });
    await good.publish({
      name: "keep-dep",
      version: "1.1.0",
      items: [{ type: "file", path: "dep.txt", content: "dep v1.1" }],
    });
    await good.publish({
      name: "keep",
      version: "1.0.0",
      items: [{ type: "file", path: "k.txt", content: "k1" }],
      requires: { "keep-dep": "1.0.0" },
    });
    await good.publish({
      name: "keep",
      version: "2.0.0",
      items: [{ type: "file", path: "k.txt", content: "k2".repeat(1000) }],
      requires: { "keep-dep": "^1.1.0" },
    });
    const target = await depot.tempDir("keep");
    await good.install("keep@1.0.0", target);
    const before = await snapshotTree(target);

    // Every /data body corrupted: keep-dep stages (via delta or whole), keep fails.
    const bad = createDepotClient({ baseUrl: depot.url, fetch: corruptingFetch(700) });
    const error = await failure(bad.install("keep@2.0.0", target));
    expect(error.code).toBe("DIGEST_MISMATCH");
    expect(await snapshotTree(target)).toEqual(before);
    expect((await readInstalled(target)).packages.keep?.version).toBe("1.0.0");
    expect(existsSync(path.join(target, ".runner-depot", "lock"))).toBe(false);
  });
});
