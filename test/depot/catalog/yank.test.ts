/**
 * Yank over real HTTP on the fs store: the mark, `latest` and resolution skipping it, an exact
 * request still served with Pkg-Yanked, the change feed carrying yank and un-yank, and the refusals.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { installPackage as install } from "../../../src/depot/install/installer.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const yank = (url: string, spec: string, reason?: string, headers: Record<string, string> = {}) =>
  fetch(`${url}/yank/${spec}`, {
    method: reason === undefined ? "DELETE" : "POST",
    headers: reason === undefined ? headers : { ...headers, "Pkg-Reason": encodeURIComponent(reason) },
  });

describe("yank (fs store)", () => {
  let depot: LiveDepot;
  let dir: string;
  beforeAll(async () => {
    const tmp = await tempDir("depot-yank-");
    cleanups.push(tmp.cleanup);
    dir = tmp.dir;
    depot = await startDepot(createFsStore(`${dir}/store`, { unsafeNoSync: true }));
    cleanups.push(() => depot.close());
    for (const v of ["1.0.0", "1.1.0", "1.2.0"]) {
      const r = await publish(depot.url, `lib@${v}`, [{ type: "file", path: "v.txt", body: v }]);
      expect(r.status).toBe(201);
    }
  });

  it("skips a yanked version in latest and resolution, still serves it exactly, and the feed carries it", async () => {
    const before = (await (await fetch(`${depot.url}/catalog`)).json()) as { position: number };
    const reason = "breaks TLS, use 1.1.0 — ünïcode";
    const r = await yank(depot.url, "lib@1.2.0", reason);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ name: "lib", version: "1.2.0", yanked: reason });

    const listed = (await (await fetch(`${depot.url}/version/lib`)).json()) as {
      latest: string;
      versions: Array<{ version: string; yanked?: { reason: string } }>;
    };
    expect(listed.latest).toBe("1.1.0");
    expect(listed.versions.map((v) => [v.version, v.yanked?.reason ?? null])).toEqual([
      ["1.0.0", null],
      ["1.1.0", null],
      ["1.2.0", reason],
    ]);

    // No version: the newest not yanked, no header.
    const newest = await fetch(`${depot.url}/data/lib`);
    expect(newest.headers.get("content-disposition")).toContain("lib-1.1.0.tar");
    expect(newest.headers.get("pkg-yanked")).toBeNull();
    await newest.arrayBuffer();
    // Exactly: served, and said so.
    const exact = await fetch(`${depot.url}/data/lib@1.2.0`);
    expect(exact.status).toBe(200);
    expect(decodeURIComponent(exact.headers.get("pkg-yanked")!)).toBe(reason);
    await exact.arrayBuffer();
    const depend = await fetch(`${depot.url}/depend/lib@1.2.0`);
    expect(decodeURIComponent(depend.headers.get("pkg-yanked")!)).toBe(reason);
    expect(((await (await fetch(`${depot.url}/depend/lib`)).json()) as { version: string }).version).toBe("1.1.0");

    // The feed: one entry for the yank, with the reason; the package state names it.
    const feed = (await (await fetch(`${depot.url}/catalog?since=${before.position}`)).json()) as {
      changes: Array<{ version: string; yanked?: string | null }>;
      packages: Record<string, { latest: string; yanked?: Record<string, string> }>;
    };
    expect(feed.changes).toEqual([{ position: before.position + 1, name: "lib", version: "1.2.0", yanked: reason }]);
    expect(feed.packages.lib).toMatchObject({ latest: "1.1.0", yanked: { "1.2.0": reason } });
    // A page of the catalog shows it too.
    const page = (await (await fetch(`${depot.url}/catalog`)).json()) as {
      packages: Record<string, { latest: string; yanked?: Record<string, string> }>;
    };
    expect(page.packages.lib).toMatchObject({ latest: "1.1.0", yanked: { "1.2.0": reason } });

    // The installer resolves around it, and still takes it when asked for exactly.
    const client = createDepotClient({ baseUrl: depot.url });
    const ranged = await install(client, "lib@^1", `${dir}/t1`);
    expect(ranged.packages.map((p) => p.version)).toEqual(["1.1.0"]);
    const pinned = await install(client, "lib@1.2.0", `${dir}/t2`);
    expect(pinned.packages.map((p) => p.version)).toEqual(["1.2.0"]);

    // The same yank again appends nothing; an un-yank appends one entry with null.
    const again = await yank(depot.url, "lib@1.2.0", reason);
    expect(again.status).toBe(200);
    const unyank = await yank(depot.url, "lib@1.2.0");
    expect(await unyank.json()).toEqual({ name: "lib", version: "1.2.0", yanked: null });
    const after = (await (await fetch(`${depot.url}/catalog?since=${before.position + 1}`)).json()) as {
      changes: unknown[];
      packages: Record<string, { latest: string; yanked?: unknown }>;
    };
    expect(after.changes).toEqual([{ position: before.position + 2, name: "lib", version: "1.2.0", yanked: null }]);
    expect(after.packages.lib!.latest).toBe("1.2.0");
    expect(after.packages.lib!.yanked).toBeUndefined();
  });

  it("refuses what is not a yank, with the documented codes", async () => {
    const problem = async (r: Response) => ({ status: r.status, code: ((await r.json()) as { code: string }).code });
    expect(await problem(await yank(depot.url, "lib@9.9.9", "x"))).toEqual({
      status: 404,
      code: "VERSION_NOT_FOUND",
    });
    expect(await problem(await yank(depot.url, "nope@1.0.0", "x"))).toEqual({
      status: 404,
      code: "VERSION_NOT_FOUND",
    });
    expect(await problem(await yank(depot.url, "lib", "x"))).toEqual({ status: 400, code: "VERSION_INVALID" });
    expect(await problem(await fetch(`${depot.url}/yank/lib@1.0.0`, { method: "POST" }))).toEqual({
      status: 400,
      code: "HEADER_INVALID",
    });
    expect(await problem(await yank(depot.url, "lib@1.0.0", "a\u0007b"))).toEqual({
      status: 400,
      code: "BAD_REQUEST",
    });
    expect(await problem(await yank(depot.url, "lib@1.0.0", "x".repeat(1025)))).toEqual({
      status: 400,
      code: "BAD_REQUEST",
    });
  });

  it("needs publish permission on the package, and a fully yanked package has no newest version", async () => {
    const tmp = await tempDir("depot-yank-auth-");
    cleanups.push(tmp.cleanup);
    const guarded = await startDepot(createFsStore(tmp.dir, { unsafeNoSync: true }), {
      authorize: bearerTokens({ writer: ["*"], reader: { read: ["*"] } }),
    });
    cleanups.push(() => guarded.close());
    const w = { Authorization: "Bearer writer" };
    expect((await publish(guarded.url, "solo@1.0.0", [{ type: "file", path: "a", body: "a" }], w)).status).toBe(201);
    const denied = await yank(guarded.url, "solo@1.0.0", "bad", { Authorization: "Bearer reader" });
    expect(denied.status).toBe(403);
    expect((await yank(guarded.url, "solo@1.0.0", "bad", w)).status).toBe(200);
    const none = await fetch(`${guarded.url}/data/solo`, { headers: w });
    expect(none.status).toBe(404);
    expect(((await none.json()) as { code: string }).code).toBe("VERSION_NOT_FOUND");
    const exact = await fetch(`${guarded.url}/data/solo@1.0.0`, { headers: w });
    expect(exact.status).toBe(200);
    expect(exact.headers.get("pkg-yanked")).toBe("bad");
    await exact.arrayBuffer();
  });
});
