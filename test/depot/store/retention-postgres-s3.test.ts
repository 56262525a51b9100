/**
 * Retention on PostgreSQL records + S3 blobs (s3rver in its own process) at both ends: the same scenario as the fs
 * test, where the store keeps each version's archive blob (signed-URL redirects), so the bytes a removal frees
 * include it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startPostgresS3Stores, type PostgresS3Stores } from "../../fixtures/postgres-s3-stores.js";
import type { LiveDepot } from "../../fixtures/depot.js";
import { retentionScenario } from "../../fixtures/retention-scenario.js";

describe("retention (PostgreSQL records + S3 blobs at both ends)", () => {
  let backends: PostgresS3Stores;
  const depots: LiveDepot[] = [];
  beforeAll(async () => {
    backends = await startPostgresS3Stores(2);
  });
  afterAll(async () => {
    for (const depot of depots) await depot.close();
    await backends?.close();
  });

  const openStore = (index: number) => backends.open(index, "retention");

  it("lists, removes, reclaims exactly (archive blobs included), and the mirror converges", async () => {
    const { dry, real, reclaimed } = await retentionScenario(await openStore(0), await openStore(1), (d) =>
      depots.push(d),
    );
    expect(dry.removed.map((o) => `${o.name}@${o.version}`)).toEqual([
      "lib@1.0.0",
      "lib@1.2.0",
      "lib@3.0.0-beta.1",
      "tool@1.0.0",
    ]);
    expect(real.removed).toEqual(dry.removed);
    expect(reclaimed).toBe(dry.bytes);
    // Each removed version's archive blob (over 3,000 bytes of its own file) is part of it.
    expect(dry.bytes).toBeGreaterThan(2 * 4 * 3000);
  });
});
