/**
 * Pull-through between two real depots on loopback sockets (fs stores): a miss is copied from the
 * upstream, checked, held and served; held versions are still served once the upstream is closed;
 * an upstream "no such version" is remembered only for the miss TTL.
 */
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { publish, startDepot, tempDir } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const sha = (bytes: ArrayBuffer) => createHash("sha256").update(Buffer.from(bytes)).digest("hex");

async function depot(options: Parameters<typeof startDepot>[1] = {}) {
  const { dir, cleanup } = await tempDir("pull-through-");
  cleanups.push(cleanup);
  const live = await startDepot(createFsStore(dir), options);
  cleanups.push(() => live.close().catch(() => undefined));
  return live;
}

describe("pull-through (two real depots)", () => {
  it("serves a miss from the upstream and then holds it; keeps serving while the upstream is down", async () => {
    const up = await depot();
    expect((await publish(up.url, "tool@1.0.0", [{ type: "file", path: "bin", body: "x".repeat(5000) }])).status).toBe(
      201,
    );
    const local = await depot({ upstream: { url: up.url, allowAnonymous: true } });
    const first = await fetch(`${local.url}/data/tool@1.0.0`);
    expect(first.status).toBe(200);
    const bytes = await first.arrayBuffer();
    expect(sha(bytes)).toBe(sha(await (await fetch(`${up.url}/data/tool@1.0.0`)).arrayBuffer()));
    // Held: listed in the local catalog and stored under the local store.
    type Listing = { versions: Array<{ version: string; pulled?: boolean }> };
    const listed = (await (await fetch(`${local.url}/version/tool`)).json()) as Listing;
    const upstreamListed = (await (await fetch(`${up.url}/version/tool`)).json()) as Listing;
    expect(listed.versions[0]!.pulled).toBe(true);
    expect(upstreamListed.versions[0]!.pulled).toBeUndefined();
    expect(listed.versions.map((v) => v.version)).toEqual(["1.0.0"]);
    expect(await local.router.store.getRecord("version/tool/1.0.0")).not.toBeNull();

    await up.close();
    const held = await fetch(`${local.url}/data/tool@1.0.0`);
    expect(held.status).toBe(200);
    expect(sha(await held.arrayBuffer())).toBe(sha(bytes));
    expect((await fetch(`${local.url}/depend/tool@1.0.0`)).status).toBe(200);
    // A miss while the upstream is down is an outage, not a 404.
    const down = await fetch(`${local.url}/data/other@1.0.0`);
    expect(down.status).toBe(503);
    expect(((await down.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    expect(down.headers.get("retry-after")).toBe("5");
  });

  it("pulls a package's latest when asked without a version, and a new version of a held package", async () => {
    const up = await depot();
    expect((await publish(up.url, "lib@1.0.0", [{ type: "file", path: "a", body: "one" }])).status).toBe(201);
    const local = await depot({ upstream: { url: up.url, allowAnonymous: true } });
    expect((await fetch(`${local.url}/data/lib`)).status).toBe(200);
    expect((await publish(up.url, "lib@1.1.0", [{ type: "file", path: "a", body: "two" }])).status).toBe(201);
    const exact = await fetch(`${local.url}/version/lib@1.1.0`);
    expect(exact.status).toBe(200);
    const all = (await (await fetch(`${local.url}/version/lib`)).json()) as { versions: Array<{ version: string }> };
    expect(all.versions.map((v) => v.version).sort()).toEqual(["1.0.0", "1.1.0"]);
  });

  it("remembers an upstream miss only for the miss TTL: no stuck 404", async () => {
    const up = await depot();
    let clock = Date.parse("2026-11-29T10:00:00Z");
    const local = await depot({
      upstream: { url: up.url, allowAnonymous: true, missTtlMs: 60_000 },
      now: () => new Date(clock),
    });
    expect((await fetch(`${local.url}/data/late@2.0.0`)).status).toBe(404);
    expect((await publish(up.url, "late@2.0.0", [{ type: "file", path: "f", body: "late" }])).status).toBe(201);
    // Within the TTL the miss is remembered: the upstream is not asked again.
    expect((await fetch(`${local.url}/data/late@2.0.0`)).status).toBe(404);
    clock += 60_001;
    const found = await fetch(`${local.url}/data/late@2.0.0`);
    expect(found.status).toBe(200);
    expect(sha(await found.arrayBuffer())).toBe(sha(await (await fetch(`${up.url}/data/late@2.0.0`)).arrayBuffer()));
  });

  it("lets no anonymous reader trigger a pull unless allowed", async () => {
    const up = await depot();
    expect((await publish(up.url, "tool@1.0.0", [{ type: "file", path: "bin", body: "b" }])).status).toBe(201);
    // Public read: anyone reads what is held, but only a token's holder makes the depot fetch and store.
    const token = "reader-token-0123456789";
    const local = await depot({
      upstream: { url: up.url },
      authorize: bearerTokens({ [token]: { read: ["*"] } }, { publicRead: true }),
    });
    expect((await fetch(`${local.url}/data/tool@1.0.0`)).status).toBe(404);
    expect(await local.router.store.getRecord("version/tool/1.0.0")).toBeNull();
    const named = await fetch(`${local.url}/data/tool@1.0.0`, { headers: { Authorization: `Bearer ${token}` } });
    expect(named.status).toBe(200);
    // Held now: the anonymous reader gets it from the store.
    expect((await fetch(`${local.url}/data/tool@1.0.0`)).status).toBe(200);
  });
});

describe("pull-through with the upstream killed mid-copy", () => {
  it("makes nothing visible, answers 503, and pulls whole once the upstream is back", async () => {
    const { dir, cleanup } = await tempDir("pull-through-up-");
    cleanups.push(cleanup);
    const upStore = createFsStore(dir);
    const upRouter = createPackageRouter(upStore, { onError: () => undefined });
    let server = await servePackageRouter(upRouter);
    const port = Number(new URL(server.url).port);
    const additions = ["one", "two", "three", "four"].map((path) => ({
      type: "file" as const,
      path,
      body: `${path} `.repeat(4000),
    }));
    expect((await publish(server.url, "big@1.0.0", additions)).status).toBe(201);
    const whole = sha(await (await fetch(`${server.url}/data/big@1.0.0`)).arrayBuffer());

    // The upstream process goes away at the second item range: after the listing and the manifest.
    const served = upRouter.fetch.bind(upRouter);
    let ranges = 0;
    let cut = true;
    upRouter.fetch = (async (request: Request) => {
      if (cut && request.headers.has("range") && ++ranges === 4) {
        void server.close();
        return new Response(null, { status: 500 });
      }
      return served(request);
    }) as typeof upRouter.fetch;
    const local = await depot({ upstream: { url: server.url, allowAnonymous: true } });
    const failed = await fetch(`${local.url}/data/big@1.0.0`);
    expect(failed.status).toBe(503);
    expect(((await failed.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    expect(ranges).toBe(4);
    expect(await local.router.store.getRecord("version/big/1.0.0")).toBeNull();
    // Still a miss (not listed), so a read asks the closed upstream again: 503, not a stale 404.
    expect((await fetch(`${local.url}/version/big`)).status).toBe(503);

    await server.close();
    cut = false;
    server = await servePackageRouter(upRouter, { port });
    cleanups.push(() => server.close());
    const again = await fetch(`${local.url}/data/big@1.0.0`);
    expect(again.status).toBe(200);
    expect(sha(await again.arrayBuffer())).toBe(whole);
  });
});

describe("pull-through bounds", () => {
  it("runs at most maxConcurrent upstream copies; more misses answer 503 TOO_MANY_PULLS", async () => {
    // An upstream that takes requests and never answers: each pull holds its slot until the socket is cut.
    const seen: Array<() => void> = [];
    let arrived: () => void = () => undefined;
    const hung = createServer((request, response) => {
      seen.push(() => response.destroy());
      arrived();
    });
    await new Promise<void>((resolve) => hung.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(hung.address() as AddressInfo).port}`;
    const local = await depot({ upstream: { url, allowAnonymous: true, maxConcurrent: 2 } });
    const waitFor = (n: number) =>
      new Promise<void>((resolve) => {
        arrived = () => seen.length >= n && resolve();
        arrived();
      });
    const held = [fetch(`${local.url}/data/a@1.0.0`), fetch(`${local.url}/data/b@1.0.0`)];
    // The same version again shares the running copy instead of taking a slot.
    held.push(fetch(`${local.url}/data/a@1.0.0`));
    await waitFor(2);
    const refused = await fetch(`${local.url}/data/c@1.0.0`);
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as { code: string }).code).toBe("TOO_MANY_PULLS");
    expect(refused.headers.get("retry-after")).toBe("1");
    expect(seen.length).toBe(2);
    for (const cut of seen) cut();
    const answers = await Promise.all(held);
    expect(answers.map((r) => r.status)).toEqual([503, 503, 503]);
    expect(((await answers[0]!.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    // The slots are free again: the next miss reaches the upstream.
    const again = fetch(`${local.url}/data/c@1.0.0`);
    await waitFor(3);
    seen[2]!();
    expect((await again).status).toBe(503);
    hung.closeAllConnections();
    await new Promise((resolve) => hung.close(resolve));
  });
});
