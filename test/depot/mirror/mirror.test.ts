/**
 * The mirror between two depots on real sockets: an upstream depot in its own process (fs store),
 * mirrored into a second fs store that is then served and read over HTTP. The upstream is killed
 * in the middle of a mirror and restarted on the same port; the mirror resumes without duplicates.
 */
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { mirrorDepot, mirrorKey } from "../../../src/depot/mirror/mirror.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { bundleDepotServer, spawnDepot, type DepotProcess } from "../../fixtures/depot-process.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

type Versions = { versions: Array<{ version: string; digest: string; size: number; yanked?: { reason: string } }> };
const versionsOf = async (url: string, name: string) =>
  ((await (await fetch(`${url}/version/${name}`)).json()) as Versions).versions;
const bytesOf = async (url: string, ref: string) =>
  Buffer.from(await (await fetch(`${url}/data/${ref}`)).arrayBuffer());
const sha = (bytes: Buffer) => createHash("sha256").update(bytes).digest("hex");

/** Every change of a depot's feed from the start. */
async function feed(url: string): Promise<Array<{ name: string; version: string; yanked?: string | null }>> {
  const out: Array<{ name: string; version: string; yanked?: string | null }> = [];
  let since = 0;
  for (;;) {
    const page = (await (await fetch(`${url}/catalog?since=${since}&limit=500`)).json()) as {
      position: number;
      changes: Array<{ name: string; version: string; yanked?: string | null }>;
    };
    out.push(...page.changes.map(({ name, version, yanked }) => ({ name, version, yanked })));
    if (page.position === since) return out;
    since = page.position;
  }
}

let bundle: string | null = null;
beforeAll(async () => {
  const tmp = await tempDir("depot-mirror-bundle-");
  cleanups.push(tmp.cleanup);
  bundle = await bundleDepotServer(tmp.dir);
});

async function upstreamAt(dir: string, port = 0): Promise<DepotProcess> {
  const up = await spawnDepot(dir, 0, bundle, port ? { DEPOT_PORT: String(port) } : {});
  cleanups.push(() => up.kill());
  return up;
}

async function localDepot(store: PackageStore): Promise<LiveDepot> {
  const depot = await startDepot(store);
  cleanups.push(() => depot.close());
  return depot;
}

describe("mirror (two fs depots on real sockets)", () => {
  it("copies versions with identical digests, only the blobs it lacks, and yanks; a rerun moves nothing", async () => {
    const tmp = await tempDir("depot-mirror-");
    cleanups.push(tmp.cleanup);
    const up = await upstreamAt(`${tmp.dir}/up`);
    const shared = "shared payload ".repeat(4000); // 60,000 bytes in both versions of lib
    for (const [spec, files] of [
      ["lib@1.0.0", { "share/big.txt": shared, "v.txt": "1.0.0" }],
      ["lib@1.1.0", { "share/big.txt": shared, "v.txt": "1.1.0" }],
      ["app@2.0.0", { "bin/app": "#!/bin/sh\necho app\n" }],
    ] as const) {
      const additions = Object.entries(files).map(([path, body]) => ({ type: "file" as const, path, body }));
      expect((await publish(up.url, spec, additions)).status).toBe(201);
    }
    const yank = await fetch(`${up.url}/yank/lib@1.1.0`, { method: "POST", headers: { "Pkg-Reason": "bad%20build" } });
    expect(yank.status).toBe(200);

    const store = createFsStore(`${tmp.dir}/local`, { unsafeNoSync: true });
    const first = await mirrorDepot(store, { upstream: up.url });
    expect(first).toMatchObject({ copied: 3, present: 0, yanks: 1, position: 4 });
    // big.txt once: the second version of lib found it held.
    expect(first.blobsReused).toBe(1);
    expect(first.bytesFetched).toBeLessThan(60_000 * 2);

    const local = await localDepot(store);
    for (const name of ["lib", "app"])
      expect(await versionsOf(local.url, name)).toEqual(await versionsOf(up.url, name));
    expect((await versionsOf(local.url, "lib"))[1]!.yanked?.reason).toBe("bad build");
    const upBytes = await bytesOf(up.url, "lib@1.1.0");
    expect(sha(await bytesOf(local.url, "lib@1.1.0"))).toBe(sha(upBytes));
    expect(((await (await fetch(`${local.url}/depend/lib`)).json()) as { version: string }).version).toBe("1.0.0");

    const again = await mirrorDepot(store, { upstream: up.url });
    expect(again).toMatchObject({ copied: 0, present: 0, yanks: 0, bytesFetched: 0, position: 4 });

    // Incremental: one new version moves its own new bytes and its manifest, not the shared blob.
    const v3 = [
      { type: "file" as const, path: "share/big.txt", body: shared },
      { type: "file" as const, path: "v.txt", body: "1.2.0" },
    ];
    expect((await publish(up.url, "lib@1.2.0", v3)).status).toBe(201);
    const next = await mirrorDepot(store, { upstream: up.url });
    expect(next).toMatchObject({ copied: 1, blobsReused: 1, position: 5 });
    expect(next.bytesFetched).toBeLessThan(2_000);
    expect(await versionsOf(local.url, "lib")).toEqual(await versionsOf(up.url, "lib"));
  });

  it("an upstream killed mid-mirror: the run fails, the next resumes from the saved position without duplicates", async () => {
    const tmp = await tempDir("depot-mirror-kill-");
    cleanups.push(tmp.cleanup);
    let up = await upstreamAt(`${tmp.dir}/up`);
    const port = Number(new URL(up.url).port);
    const count = 12;
    for (let i = 0; i < count; i++)
      expect(
        (await publish(up.url, `pkg${i % 3}@1.0.${i}`, [{ type: "file", path: "f", body: `body ${i}\n` }])).status,
      ).toBe(201);
    await fetch(`${up.url}/yank/pkg0@1.0.3`, { method: "POST", headers: { "Pkg-Reason": "x" } });

    const store = createFsStore(`${tmp.dir}/local`, { unsafeNoSync: true });
    let applied = 0;
    const killed = mirrorDepot(store, {
      upstream: up.url,
      onChange: () => {
        // Killed while the mirror is between two changes: its next read meets a dead socket.
        if (++applied === 5) void up.kill();
      },
    });
    const error = await killed.then(
      () => null,
      (e: unknown) => e,
    );
    expect(isRunnerDepotError(error) && error.code).toBe("UNAVAILABLE");
    const saved = (await store.getRecord<{ position: number }>(mirrorKey(up.url)))!.value;
    expect(saved.position).toBeGreaterThanOrEqual(5);
    expect(saved.position).toBeLessThan(count + 1);

    up = await upstreamAt(`${tmp.dir}/up`, port);
    const resumed = await mirrorDepot(store, { upstream: up.url });
    expect(resumed.position).toBe(count + 1);
    expect(resumed.copied + resumed.present).toBe(count - saved.position);

    const local = await localDepot(store);
    const localFeed = await feed(local.url);
    const upFeed = await feed(up.url);
    // Every version once, in the upstream's order, and the yank after its version.
    expect(localFeed).toEqual(upFeed);
    for (let i = 0; i < 3; i++)
      expect(await versionsOf(local.url, `pkg${i}`)).toEqual(await versionsOf(up.url, `pkg${i}`));
  });

  it("follows: a version published upstream while following is copied, and an abort ends the run", async () => {
    const tmp = await tempDir("depot-mirror-follow-");
    cleanups.push(tmp.cleanup);
    const up = await upstreamAt(`${tmp.dir}/up`);
    expect((await publish(up.url, "f@1.0.0", [{ type: "file", path: "f", body: "1" }])).status).toBe(201);
    const store = createFsStore(`${tmp.dir}/local`, { unsafeNoSync: true });
    const stop = new AbortController();
    const seen: string[] = [];
    let copiedSecond!: () => void;
    const second = new Promise<void>((resolve) => (copiedSecond = resolve));
    const following = mirrorDepot(store, {
      upstream: up.url,
      follow: true,
      intervalMs: 50,
      signal: stop.signal,
      onChange: (change, outcome) => {
        seen.push(`${change.name}@${change.version} ${outcome}`);
        if (change.version === "1.1.0") copiedSecond();
        if (change.version === "1.0.0") void publish(up.url, "f@1.1.0", [{ type: "file", path: "f", body: "2" }]);
      },
    });
    await second;
    stop.abort();
    const report = await following;
    expect(seen).toEqual(["f@1.0.0 copied", "f@1.1.0 copied"]);
    expect(report).toMatchObject({ copied: 2, position: 2 });
  });

  it("bounds what a hostile upstream sends: an endless feed answer is cut, nothing is written", async () => {
    const { createServer } = await import("node:http");
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    let sent = 0;
    const hostile = createServer((req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.write('{"position": 1, "changes": [');
      const pump = () => {
        while (sent < 64 * 2 ** 20 && res.write(chunk)) sent += chunk.length;
        if (sent < 64 * 2 ** 20) res.once("drain", pump);
        else res.end("]}");
      };
      pump();
      req.socket.once("close", () => res.destroy());
    });
    await new Promise<void>((resolve) => hostile.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise((resolve) => hostile.close(resolve)));
    const url = `http://127.0.0.1:${(hostile.address() as { port: number }).port}`;
    const tmp = await tempDir("depot-mirror-hostile-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir, { unsafeNoSync: true });
    const error = await mirrorDepot(store, { upstream: url, limits: { maxJsonBytes: 2 ** 20 } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(isRunnerDepotError(error) && error.code).toBe("TOO_LARGE");
    expect(sent).toBeLessThan(64 * 2 ** 20);
    expect(await store.getRecord(mirrorKey(url))).toBeNull();
  });

  it("refuses an upstream whose bytes do not match its listing, and makes nothing visible", async () => {
    const tmp = await tempDir("depot-mirror-lie-");
    cleanups.push(tmp.cleanup);
    const up = await upstreamAt(`${tmp.dir}/up`);
    expect((await publish(up.url, "lie@1.0.0", [{ type: "file", path: "f", body: "true\n" }])).status).toBe(201);
    // A lying front: the feed and listing pass through, every item's bytes come back altered (an archive range
    // past the manifest, or the batch of blobs).
    const { createServer } = await import("node:http");
    const front = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const upstream = await fetch(`${up.url}${req.url}`, {
        method: req.method,
        headers: req.headers as Record<string, string>,
        ...(req.method === "POST" ? { body: Buffer.concat(chunks) } : {}),
      });
      const body = Buffer.from(await upstream.arrayBuffer());
      // The manifest (the first ranges) passes; an item's bytes come back with one bit flipped.
      const start = Number(/^bytes=(\d+)-/.exec(String(req.headers.range))?.[1] ?? 0);
      const item = (req.url!.startsWith("/data/") && start >= 1024) || req.url!.startsWith("/mirror/blobs");
      if (item && body.length > 0) body[0]! ^= 1;
      const headers: Record<string, string> = {};
      upstream.headers.forEach((v, k) => {
        if (k !== "content-length" && k !== "transfer-encoding" && k !== "content-encoding") headers[k] = v;
      });
      res.writeHead(upstream.status, headers).end(body);
    });
    await new Promise<void>((resolve) => front.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise((resolve) => front.close(resolve)));
    const frontUrl = `http://127.0.0.1:${(front.address() as { port: number }).port}`;

    const store = createFsStore(`${tmp.dir}/local`, { unsafeNoSync: true });
    const error = await mirrorDepot(store, { upstream: frontUrl }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(isRunnerDepotError(error) && error.code).toBe("DIGEST_MISMATCH");
    const local = await localDepot(store);
    expect((await fetch(`${local.url}/version/lie`)).status).toBe(404);
    expect((await store.getRecord<{ position: number }>(mirrorKey(frontUrl)))?.value.position ?? 0).toBe(0);
  });
});
