/**
 * Retention on fs stores: an upstream depot and its mirror served on loopback sockets. A dry run lists versions and
 * bytes; the real run removes exactly those through the change feed, garbage collection reclaims exactly those bytes,
 * and the mirror converges.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { removeVersion } from "../../../src/depot/catalog/removal.js";
import { runRetention } from "../../../src/depot/store/retention.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";
import { listed, retentionScenario } from "../../fixtures/retention-scenario.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});
const track = (depot: LiveDepot) => cleanups.push(() => depot.close());

describe("retention (fs stores, two depots on real sockets)", () => {
  it("lists, removes, reclaims exactly, keeps what kept versions require, and mirrors converge", async () => {
    const tmp = await tempDir("depot-retention-");
    cleanups.push(tmp.cleanup);
    const up = createFsStore(`${tmp.dir}/up`, { unsafeNoSync: true });
    const down = createFsStore(`${tmp.dir}/down`, { unsafeNoSync: true });
    cleanups.push(async () => {
      await up.close?.();
      await down.close?.();
    });
    const { dry, real, reclaimed } = await retentionScenario(up, down, track);
    const names = (r: typeof dry) => r.removed.map((o) => `${o.name}@${o.version} ${o.reason}`);
    expect(names(dry)).toEqual([
      "lib@1.0.0 keep-last",
      "lib@1.2.0 keep-last",
      "lib@3.0.0-beta.1 prerelease",
      "tool@1.0.0 unused",
    ]);
    // lib@1.1.0 would go by keep-last, but app@1.0.0 (kept) requires lib@~1.1.0.
    expect(dry.required).toBe(1);
    expect(dry.bytes).toBeGreaterThan(4 * 3000);
    // The real run removes exactly what the dry run listed, and GC reclaims exactly those bytes: the blob lib's
    // versions share and the one tool@1.0.0 shares with dl@1.0.0 stay.
    expect(real.removed).toEqual(dry.removed);
    expect(real.bytes).toBe(dry.bytes);
    expect(reclaimed).toBe(dry.bytes);
    // A second pass finds nothing more.
    const again = await runRetention(up, { keepLast: 2, prereleaseDays: 30, unusedDays: 10 }, { dryRun: true });
    expect(again.removed.filter((o) => o.reason !== "unused")).toEqual([]);
  });

  it("finishes a removal a killed run left half done, and never removes latest", async () => {
    const tmp = await tempDir("depot-retention-kill-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(`${tmp.dir}/s`, { unsafeNoSync: true });
    cleanups.push(async () => store.close?.());
    const depot = await startDepot(store);
    track(depot);
    for (const v of ["1.0.0", "2.0.0"])
      expect((await publish(depot.url, `k@${v}`, [{ type: "file", path: "f", body: v }])).status).toBe(201);
    await depot.router.idle();
    expect(await removeVersion(store, "k", "2.0.0", new Date())).toBe("latest");
    // A run killed after unlisting k@1.0.0, before its entry and records: the mark stays on the package record.
    const key = "pkg/k";
    const record = (await store.getRecord<Record<string, unknown>>(key))!;
    const value = record.value as { versions: string[]; removing?: Record<string, string> };
    await store.putRecord(
      key,
      { ...value, versions: ["2.0.0"], latest: "2.0.0", removing: { "1.0.0": new Date().toISOString() } },
      { ifRevision: record.revision },
    );
    expect(await store.getRecord("version/k/1.0.0")).not.toBeNull();
    const report = await runRetention(store, { keepLast: 5 });
    expect(report.finished).toBe(1);
    expect(await store.getRecord("version/k/1.0.0")).toBeNull();
    expect((await store.getRecord<{ removing?: unknown }>(key))!.value.removing).toBeUndefined();
    const feed = (await (await fetch(`${depot.url}/catalog?since=0`)).json()) as {
      changes: Array<{ version: string; removed?: boolean }>;
    };
    expect(feed.changes.filter((c) => c.removed).map((c) => c.version)).toEqual(["1.0.0"]);
    expect(await listed(depot.url, "k")).toEqual(["2.0.0"]);
  });

  it("refuses a policy out of range", async () => {
    const tmp = await tempDir("depot-retention-bad-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(`${tmp.dir}/s`, { unsafeNoSync: true });
    cleanups.push(async () => store.close?.());
    for (const policy of [{}, { keepLast: 0 }, { prereleaseDays: -1 }, { unusedDays: Number.NaN }]) {
      const error = await runRetention(store, policy).catch((e: unknown) => e);
      expect(isRunnerDepotError(error) && error.code).toBe("BAD_REQUEST");
    }
  });
});
