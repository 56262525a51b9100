/**
 * Quotas per token through a real server (fs store): a commit over a token's quota of versions or bytes answers 413
 * QUOTA_EXCEEDED with what is used and allowed, and leaves nothing behind (no version, no change entry, no usage);
 * racing commits never both take the last room; retention gives the room back.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bearerTokens, tokenPrincipal } from "../../../src/depot/server/auth.js";
import { readUsage } from "../../../src/depot/store/quota.js";
import { runRetention } from "../../../src/depot/store/retention.js";
import { add, openTransaction, startDepot, tempDir } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const small = "q".repeat(1000);
const big = "Q".repeat(50_000);

describe("quotas per token (fs store, real server)", () => {
  it("refuses a commit over quota with a clear problem, leaves nothing, and retention gives room back", async () => {
    const tmp = await tempDir("depot-quota-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(`${tmp.dir}/s`, { unsafeNoSync: true });
    cleanups.push(async () => store.close?.());
    const capped = "capped-token";
    const free = "free-token";
    const depot = await startDepot(store, {
      authorize: bearerTokens({ [capped]: ["q*"], [free]: ["*"] }),
      quota: (principal) => (principal === tokenPrincipal(capped) ? { versions: 3, bytes: 40_000 } : undefined),
    });
    cleanups.push(() => depot.close());
    const as = (token: string) => ({ Authorization: `Bearer ${token}` });
    const stage = async (spec: string, body: string, token = capped) => {
      const id = await openTransaction(depot.url, spec, as(token));
      expect((await add(depot.url, id, { type: "file", path: "f", body }, as(token))).status).toBe(201);
      return id;
    };
    const commit = (id: string, token = capped) =>
      fetch(`${depot.url}/commit/${id}`, { method: "POST", headers: as(token) });
    const head = async () =>
      ((await (await fetch(`${depot.url}/catalog?since=0`, { headers: as(free) })).json()) as { position: number })
        .position;

    for (const v of ["1.0.0", "1.1.0"]) expect((await commit(await stage(`q@${v}`, `${small}${v}`))).status).toBe(201);
    const used = await readUsage(store, tokenPrincipal(capped));
    expect(used.versions).toBe(2);
    expect(used.bytes).toBeGreaterThan(2000);

    // Over the byte quota: 413, the problem says what is used, asked and allowed.
    const before = await head();
    const tooBig = await stage("q@2.0.0", big);
    const refused = await commit(tooBig);
    expect(refused.status).toBe(413);
    expect(refused.headers.get("content-type")).toContain("application/problem+json");
    const problem = (await refused.json()) as Record<string, unknown>;
    expect(problem).toMatchObject({
      code: "QUOTA_EXCEEDED",
      quotaBytes: 40_000,
      usedBytes: used.bytes,
      usedVersions: 2,
    });
    expect(problem.versionBytes as number).toBeGreaterThan(50_000);
    // Nothing behind: no version listed or stored, no change entry, the usage as it was.
    expect((await fetch(`${depot.url}/version/q@2.0.0`, { headers: as(free) })).status).toBe(404);
    expect(await store.getRecord("version/q/2.0.0")).toBeNull();
    expect(await head()).toBe(before);
    expect(await readUsage(store, tokenPrincipal(capped))).toEqual(used);
    // The transaction is open again: its publisher may abandon it.
    expect((await fetch(`${depot.url}/trans/${tooBig}`, { method: "DELETE", headers: as(capped) })).status).toBe(204);

    // Two commits race for the last version of room: exactly one wins, the other is refused.
    const [a, b] = [await stage("q@1.2.0", `${small}a`), await stage("q@1.3.0", `${small}b`)];
    const statuses = (await Promise.all([commit(a), commit(b)])).map((r) => r.status).sort();
    expect(statuses).toEqual([201, 413]);
    expect((await readUsage(store, tokenPrincipal(capped))).versions).toBe(3);

    // Another token is not bound by it.
    expect((await commit(await stage("other@1.0.0", big, free), free)).status).toBe(201);

    // Retention removes q's oldest version: its room comes back, and a commit fits again.
    const report = await runRetention(store, { keepLast: 2 });
    expect(report.removed.map((o) => `${o.name}@${o.version}`)).toEqual(["q@1.0.0"]);
    expect((await readUsage(store, tokenPrincipal(capped))).versions).toBe(2);
    expect((await commit(await stage("q@1.4.0", `${small}c`))).status).toBe(201);
  });
});
