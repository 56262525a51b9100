/**
 * A mirror and a pull-through depot take from an upstream only versions the depot would publish itself: an upstream
 * (a crafted depot on a real socket, its archives laid out exactly as a depot's, so every digest matches) serves a
 * good version and then one breaking one publish rule or limit (docs/depot-api.md §8, §11). The bad version is refused
 * before any of its item bytes move: the mirror run reports it (`refused`, the rule named) and moves past it, never
 * reading it again unless its position is reset; a pull answers 503 UPSTREAM_UNAVAILABLE naming the rule, and
 * remembers the refusal `missTtlMs`. Nothing of it is stored or served by the local depot, and the good version is
 * copied and served. Also: the limits are the mirror's `publishLimits` and a pull-through router's `limits`; a
 * requirement may carry a newer upstream's extra members; the mirror's configured `limits.maxManifestBytes` bounds
 * the manifest read version by version and, in bytes, a batch feed's manifest.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { MAX_REFUSALS, mirrorDepot, mirrorKey, type MirrorOutcome } from "../../../src/depot/mirror/mirror.js";
import type { ManifestItem, PackageManifest } from "../../../src/depot/package/archive.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import type { VersionRecord } from "../../../src/depot/store/records.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import {
  craftedUpstream,
  craftVersion,
  sha,
  type CraftedChange,
  type CraftedVersion,
} from "../../fixtures/crafted-upstream.js";
import { startDepot, tempDir } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const file = (path: string, bytes: Buffer, mode = 0o644): ManifestItem => ({
  type: "file",
  path,
  mode,
  size: bytes.length,
  digest: sha(bytes),
});
const dir = (path: string): ManifestItem => ({ type: "dir", path, mode: 0o755, size: 0 });
const link = (path: string, target: string): ManifestItem => ({ type: "link", path, mode: 0o777, size: 0, target });
const manifest = (name: string, parts: Partial<PackageManifest>): PackageManifest => ({
  name,
  version: "1.0.0",
  publishedAt: "2026-01-01T00:00:00.000Z",
  attributes: {},
  requires: [],
  licenses: [],
  items: [],
  ...parts,
});

/** Bytes only the refused version holds: never stored here, never fetched past its manifest. */
const SECRET = Buffer.from("root:x:0:0:only in the refused version\n");
const TOOL = Buffer.from("#!/bin/sh\necho tool\n");
const MIT = Buffer.from("MIT licence text\n");
const mit = { name: "MIT", path: ".pkg/licenses/MIT", size: MIT.length, digest: sha(MIT) };

/** What a publish produces, using every rule's good side: a licence, links (one through another), attributes, a requirement. */
const good = await craftVersion(
  manifest("good", {
    attributes: { "build.id": "42", description: "a tool\twith a tab\nand two lines" },
    requires: [{ name: "lib", range: "^1.0.0" }],
    licenses: [mit],
    items: [
      dir("bin"),
      link("bin/t", "tool"),
      file("bin/tool", TOOL, 0o755),
      link("cur", "share/tool"),
      link("share", "bin"),
    ],
  }),
  [TOOL, MIT],
);

const many: Record<string, string> = {};
for (let i = 0; i <= 1000; i++) many[`k${i}`] = "v";

/** One publish rule each: the manifest of `bad@1.0.0` (besides `secret.txt`), and what the refusal says. */
const cases: Array<[string, Partial<PackageManifest>, RegExp]> = [
  [
    "a link leaving the package, with an item below it",
    { items: [link("escape", "../../../../etc"), file("escape/passwd", SECRET)] },
    /PATH_INVALID: .*leaves the package root/,
  ],
  [
    "an item below a link",
    { items: [dir("lib"), link("lib2", "lib"), file("lib2/x", SECRET)] },
    /PATH_INVALID: lib2\/x lies below the link lib2/,
  ],
  [
    "a link chain leaving the package through another link",
    { items: [dir("a"), dir("a/b"), link("a/b/up", "../.."), link("passwd", "a/b/up/../etc/passwd")] },
    /PATH_INVALID: .*leaves the package root through its links/,
  ],
  [
    "an item below a file",
    { items: [file("f", SECRET), file("f/g", SECRET)] },
    /PATH_INVALID: f\/g lies below the file f/,
  ],
  [
    "the same path twice",
    { items: [file("dup", SECRET), file("dup", SECRET)] },
    /PATH_EXISTS: dup is listed more than once/,
  ],
  ["two paths equal but for case", { items: [file("README", SECRET), file("readme", SECRET)] }, /differ only in case/],
  ["an item path not NFC-normalised", { items: [file("cafe\u0301", SECRET)] }, /PATH_INVALID: .*not NFC-normalised/],
  [
    "a licence path with '..'",
    { licenses: [{ name: "x", path: ".pkg/licenses/../../../tmp/pwned", size: SECRET.length, digest: sha(SECRET) }] },
    /licence entry ".pkg\/licenses\/..\/..\/..\/tmp\/pwned" is not as a publish stores it/,
  ],
  [
    "a licence name a publish refuses",
    { licenses: [{ name: "../x", path: ".pkg/licenses/../x", size: SECRET.length, digest: sha(SECRET) }] },
    /licence entry .* is not as a publish stores it/,
  ],
  [
    "the same licence twice",
    { licenses: [mit, mit] },
    /licence entry ".pkg\/licenses\/MIT" is not as a publish stores it/,
  ],
  ["a requirement that is no object", { requires: [42 as never] }, /a requirement is malformed/],
  ["a requirement naming no package", { requires: [{ name: "../../x", range: "*" }] }, /NAME_INVALID/],
  ["a requirement whose range is no string", { requires: [{ name: "lib", range: { not: 1 } as never }] }, /malformed/],
  ["a requirement whose range is invalid", { requires: [{ name: "lib", range: "not a range" }] }, /RANGE_INVALID/],
  ["a requirement on the package itself", { requires: [{ name: "bad", range: "*" }] }, /SELF_DEPENDENCY/],
  [
    "the same requirement twice",
    {
      requires: [
        { name: "lib", range: "^1.0.0" },
        { name: "lib", range: "^2.0.0" },
      ],
    },
    /requirement "lib" is listed twice/,
  ],
  ["more attributes than a publish takes", { attributes: many }, /TOO_MANY_ITEMS: more than 1000 attributes/],
  ["an attribute value over 4096 bytes", { attributes: { d: "v".repeat(4097) } }, /HEADER_INVALID: .*4096 bytes/],
  ["an attribute key a publish refuses", { attributes: { "../k": "v" } }, /HEADER_INVALID: attribute "..\/k"/],
  ["an attribute holding a control character", { attributes: { k: "a\u0000b" } }, /control character/],
  ["a delta's members", { removed: ["x"] }, /a delta's, not a version's/],
];

async function craftBad(parts: Partial<PackageManifest>): Promise<CraftedVersion> {
  const items = [...(parts.items ?? []), file("secret.txt", SECRET)];
  return craftVersion(manifest("bad", { ...parts, items }), [SECRET, MIT]);
}

async function fsStore(): Promise<PackageStore> {
  const tmp = await tempDir("mirror-rules-");
  cleanups.push(tmp.cleanup);
  return createFsStore(tmp.dir, { unsafeNoSync: true });
}

async function upstreamOf(versions: CraftedVersion[], batch: boolean, changes: CraftedChange[] = []) {
  const up = await craftedUpstream(versions, { batch, changes });
  cleanups.push(up.close);
  return up;
}

/** The local depot over `store`: `bad` unknown, `good` served byte for byte. */
async function expectServed(store: PackageStore) {
  const local = await startDepot(store);
  try {
    for (const path of ["/version/bad", "/data/bad@1.0.0", "/depend/bad@1.0.0"]) {
      const answer = await fetch(`${local.url}${path}`);
      expect(answer.status, path).toBe(404);
      expect(((await answer.json()) as { code: string }).code).toBe("PACKAGE_NOT_FOUND");
    }
    const data = await fetch(`${local.url}/data/good@1.0.0`);
    expect(data.status).toBe(200);
    expect(sha(Buffer.from(await data.arrayBuffer()))).toBe(good.digest);
  } finally {
    await local.close();
  }
}

const refusal = (error: unknown) => (isRunnerDepotError(error) ? `${error.code} ${error.message}` : String(error));

/** The position the mirror of `url` saved in `store`. */
const savedPosition = async (store: PackageStore, url: string) =>
  (await store.getRecord<{ position: number }>(mirrorKey(url)))!.value.position;

/** Moves the saved position back to `position`, as an operator would (a run only moves it forward). */
async function resetPosition(store: PackageStore, url: string, position: number) {
  const current = (await store.getRecord<Record<string, unknown>>(mirrorKey(url)))!;
  const written = await store.putRecord(
    mirrorKey(url),
    { ...current.value, position },
    { ifRevision: current.revision },
  );
  expect(written).not.toBeNull();
}

/** The good version held as the upstream has it; nothing of the refused one. */
async function expectOnlyGood(store: PackageStore) {
  expect((await store.getRecord<VersionRecord>("version/good/1.0.0"))!.value.digest).toBe(good.digest);
  expect(await store.getRecord("version/bad/1.0.0")).toBeNull();
  expect(await store.statBlob(sha(SECRET))).toBeNull();
}

describe("a mirror refuses an upstream version the depot would not publish, and moves past it", () => {
  describe.each([
    ["version by version", false],
    ["by batch reads", true],
  ])("%s", (_, batch) => {
    it.each(cases)("%s", async (_title, parts, reason) => {
      const bad = await craftBad(parts);
      const up = await upstreamOf([good, bad], batch);
      const store = await fsStore();
      const outcomes: MirrorOutcome[] = [];
      // The run completes: the bad version reported with the rule it breaks, its position passed.
      const report = await mirrorDepot(store, { upstream: up.url, onChange: (_c, outcome) => outcomes.push(outcome) });
      expect(outcomes).toEqual(["copied", "refused"]);
      expect(report).toMatchObject({ position: 2, copied: 1, refusedCount: 1 });
      expect(report.refused).toEqual([{ position: 2, name: "bad", version: "1.0.0", reason: expect.any(String) }]);
      expect(report.refused[0]!.reason).toMatch(/^upstream: bad@1\.0\.0: /);
      expect(report.refused[0]!.reason).toMatch(reason);
      expect(await savedPosition(store, up.url)).toBe(2);
      await expectOnlyGood(store);
      // Only its manifest was read (the header, then its bytes), never an item.
      expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
      expect(up.asked.blobRefs).not.toContain("bad@1.0.0");

      // A second run does not read it again: the position is past it.
      const again = await mirrorDepot(store, { upstream: up.url });
      expect(again).toMatchObject({ position: 2, copied: 0, refused: [], refusedCount: 0 });
      expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
      // From a reset position it is read, and refused, again; the good one is found present.
      await resetPosition(store, up.url, 0);
      const reset = await mirrorDepot(store, { upstream: up.url });
      expect(reset).toMatchObject({ position: 2, copied: 0, present: 1, refusedCount: 1 });
      expect(reset.refused[0]!.reason).toMatch(reason);
      expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512, 0, 512]);
      await expectOnlyGood(store);
      await expectServed(store);
    });

    it("passes over a later yank or attestation of the refused version: nothing here to apply it to", async () => {
      const bad = await craftBad({ items: [file("f", SECRET), file("f/g", SECRET)] });
      const up = await upstreamOf([good, bad], batch, [
        { name: "bad", version: "1.0.0", yanked: "broken" },
        { name: "bad", version: "1.0.0", attested: sha("a bundle") },
        { name: "good", version: "1.0.0", yanked: "old" },
      ]);
      const store = await fsStore();
      const outcomes: MirrorOutcome[] = [];
      const report = await mirrorDepot(store, { upstream: up.url, onChange: (_c, outcome) => outcomes.push(outcome) });
      expect(outcomes).toEqual(["copied", "refused", "absent", "absent", "yank"]);
      expect(report).toMatchObject({ position: 5, copied: 1, yanks: 1, attestations: 0, refusedCount: 1 });
      expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
      await expectOnlyGood(store);
    });
  });
});

describe("a run's report of refusals", () => {
  it.each([
    ["version by version", false],
    ["by batch reads", true],
  ])(`lists the first ${MAX_REFUSALS} and counts them all, across feed pages (%s)`, async (_, batch) => {
    const refused: CraftedVersion[] = [];
    for (let i = 0; i < MAX_REFUSALS + 2; i++)
      refused.push(await craftVersion(manifest(`bad${i}`, { items: [file("dup", TOOL), file("dup", TOOL)] }), [TOOL]));
    const up = await upstreamOf([...refused, good], batch);
    const store = await fsStore();
    const report = await mirrorDepot(store, { upstream: up.url });
    expect(report).toMatchObject({ position: MAX_REFUSALS + 3, copied: 1, refusedCount: MAX_REFUSALS + 2 });
    expect(report.refused.map((r) => r.position)).toEqual(Array.from({ length: MAX_REFUSALS }, (_, i) => i + 1));
    expect(report.refused[0]).toMatchObject({ name: "bad0", reason: expect.stringMatching(/PATH_EXISTS/) });
    expect((await store.getRecord<VersionRecord>("version/good/1.0.0"))!.value.digest).toBe(good.digest);
  });
});

describe("a pull-through depot refuses an upstream version the depot would not publish", () => {
  it.each(cases)("%s", async (_title, parts, reason) => {
    const bad = await craftBad(parts);
    const up = await upstreamOf([good, bad], false);
    const store = await fsStore();
    const errors: unknown[] = [];
    const local = await startDepot(store, {
      upstream: { url: up.url, allowAnonymous: true },
      onError: (error) => void errors.push(error),
    });
    cleanups.push(local.close);
    for (const path of ["/data/bad@1.0.0", "/version/bad"]) {
      const answer = await fetch(`${local.url}${path}`);
      expect(answer.status, path).toBe(503);
      const body = (await answer.json()) as { code: string; detail: string };
      expect(body.code).toBe("UPSTREAM_UNAVAILABLE");
      // The answer names the rule, the second (the latest, resolved to it) as the first.
      expect(body.detail).toMatch(/^the upstream's bad@1\.0\.0 breaks a publish rule or limit of this depot/);
      expect(body.detail).toMatch(reason);
    }
    const cause = errors.map((e) => (e as { cause?: unknown }).cause).find((c) => isRunnerDepotError(c));
    expect(refusal(cause)).toMatch(reason);
    expect(await store.getRecord("version/bad/1.0.0")).toBeNull();
    expect(await store.statBlob(sha(SECRET))).toBeNull();
    // Its manifest read once: the refusal is remembered (missTtlMs), not fetched again by the next reads.
    expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
    const data = await fetch(`${local.url}/data/good@1.0.0`);
    expect(data.status).toBe(200);
    expect(sha(Buffer.from(await data.arrayBuffer()))).toBe(good.digest);
    expect((await fetch(`${local.url}/version/bad`)).status).toBe(503);
    expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
  });

  it("remembers a refusal for missTtlMs: reads within it ask the upstream nothing, a read past it asks again", async () => {
    const bad = await craftBad({ items: [file("dup", SECRET), file("dup", SECRET)] });
    const up = await upstreamOf([good, bad], false);
    let clock = Date.parse("2026-06-01T00:00:00.000Z");
    const local = await startDepot(await fsStore(), {
      now: () => new Date(clock),
      upstream: { url: up.url, allowAnonymous: true, missTtlMs: 10_000 },
    });
    cleanups.push(local.close);
    const first = await fetch(`${local.url}/data/bad@1.0.0`);
    expect(first.status).toBe(503);
    expect(first.headers.get("retry-after")).toBe("10");
    const said = (await first.json()) as { code: string; detail: string };
    expect(said.code).toBe("UPSTREAM_UNAVAILABLE");
    expect(said.detail).toMatch(/bad@1\.0\.0 breaks a publish rule .*PATH_EXISTS: dup is listed more than once/);
    expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512]);
    const asked = up.asked.requests;

    clock += 4_000;
    for (const path of ["/data/bad@1.0.0", "/depend/bad@1.0.0", "/version/bad@1.0.0", "/data/bad@1.0.0"]) {
      const again = await fetch(`${local.url}${path}`);
      expect(again.status, path).toBe(503);
      expect(again.headers.get("retry-after"), path).toBe("6");
      expect(((await again.json()) as { detail: string }).detail, path).toBe(said.detail);
    }
    expect(up.asked.requests).toBe(asked);

    clock += 6_000;
    expect((await fetch(`${local.url}/data/bad@1.0.0`)).status).toBe(503);
    expect(up.asked.ranges.get("bad@1.0.0")).toEqual([0, 512, 0, 512]);
  });
});

/** A version with 1,001 attributes: over the default limit of 1,000, within a raised one. */
const wide = craftVersion(manifest("wide", { attributes: many }), []);

describe("the publish limits are the mirror's publishLimits and a pull-through router's limits", () => {
  it.each([
    ["version by version", false],
    ["by batch reads", true],
  ])("a mirror with publishLimits raised copies a version over the default (%s)", async (_, batch) => {
    const version = await wide;
    const up = await upstreamOf([good, version], batch);
    const refused = await mirrorDepot(await fsStore(), { upstream: up.url });
    expect(refused).toMatchObject({ copied: 1, refusedCount: 1, position: 2 });
    expect(refused.refused[0]!.reason).toMatch(/TOO_MANY_ITEMS: more than 1000 attributes/);

    const store = await fsStore();
    const report = await mirrorDepot(store, { upstream: up.url, publishLimits: { attributes: 1001 } });
    expect(report).toMatchObject({ copied: 2, refusedCount: 0, refused: [], position: 2 });
    // The batch path checks with the same limits: the raised run takes it from the feed, reading no range of it.
    expect(up.asked.ranges.get("wide@1.0.0")).toEqual(batch ? [0, 512] : [0, 512, 0, 512]);
    const local = await startDepot(store);
    cleanups.push(local.close);
    const data = await fetch(`${local.url}/data/wide@1.0.0`);
    expect(data.status).toBe(200);
    expect(sha(Buffer.from(await data.arrayBuffer()))).toBe(version.digest);
  });

  it("a pull-through router with its limits raised pulls it", async () => {
    const version = await wide;
    const up = await upstreamOf([good, version], false);
    const strict = await startDepot(await fsStore(), { upstream: { url: up.url, allowAnonymous: true } });
    cleanups.push(strict.close);
    expect((await fetch(`${strict.url}/data/wide@1.0.0`)).status).toBe(503);

    const local = await startDepot(await fsStore(), {
      limits: { attributes: 1001 },
      upstream: { url: up.url, allowAnonymous: true },
    });
    cleanups.push(local.close);
    const data = await fetch(`${local.url}/data/wide@1.0.0`);
    expect(data.status).toBe(200);
    expect(sha(Buffer.from(await data.arrayBuffer()))).toBe(version.digest);
  });
});

describe("a requirement with members a publish does not write (a newer upstream's)", () => {
  const extra = craftVersion(
    manifest("extra", { requires: [{ name: "lib", range: "^1.0.0", optional: true } as never] }),
    [],
  );

  it.each([
    ["version by version", false],
    ["by batch reads", true],
  ])("is copied, its record holding the name and range (%s)", async (_, batch) => {
    const version = await extra;
    const up = await upstreamOf([good, version], batch);
    const store = await fsStore();
    const report = await mirrorDepot(store, { upstream: up.url });
    expect(report).toMatchObject({ copied: 2, refusedCount: 0, position: 2 });
    const record = (await store.getRecord<VersionRecord>("version/extra/1.0.0"))!.value;
    expect(record.digest).toBe(version.digest);
    expect(record.requires).toEqual([{ name: "lib", range: "^1.0.0" }]);
  });

  it("is pulled", async () => {
    const up = await upstreamOf([good, await extra], false);
    const local = await startDepot(await fsStore(), { upstream: { url: up.url, allowAnonymous: true } });
    cleanups.push(local.close);
    expect((await fetch(`${local.url}/data/extra@1.0.0`)).status).toBe(200);
  });
});

describe("the configured limits.maxManifestBytes", () => {
  // A valid version whose manifest is about 4 KiB; good's is under 1 KiB.
  const big = craftVersion(manifest("big", { attributes: { description: "x".repeat(4000) } }), []);

  it.each([
    ["version by version", false],
    ["by batch reads", true],
  ])("bounds the mirror's manifest read (%s)", async (_, batch) => {
    const bigger = await big;
    expect(good.json.length).toBeLessThan(1024);
    expect(bigger.json.length).toBeGreaterThan(1024);
    const up = await upstreamOf([good, bigger], batch);
    const store = await fsStore();
    const refused = await mirrorDepot(store, { upstream: up.url, limits: { maxManifestBytes: 1024 } });
    expect(refused).toMatchObject({ copied: 1, refusedCount: 1, position: 2 });
    expect(refused.refused[0]!.reason).toMatch(/^upstream: big@1\.0\.0: the manifest's size is out of bounds/);
    // Refused from its tar header: the manifest's bytes were never asked for.
    expect(up.asked.ranges.get("big@1.0.0")).toEqual([0]);
    expect(await store.getRecord("version/big/1.0.0")).toBeNull();
    expect((await store.getRecord<VersionRecord>("version/good/1.0.0"))!.value.digest).toBe(good.digest);
    // Within a larger bound, from a reset position, the same version is copied.
    await resetPosition(store, up.url, 1);
    const report = await mirrorDepot(store, { upstream: up.url, limits: { maxManifestBytes: 8192 } });
    expect(report).toMatchObject({ copied: 1, refusedCount: 0, position: 2 });
    expect((await store.getRecord<VersionRecord>("version/big/1.0.0"))!.value.digest).toBe(bigger.digest);
  });

  it("bounds a batch feed's manifest in bytes, not characters", async () => {
    // About 2,100 characters, 4,100 bytes: within 3,000 by its length, over it in bytes.
    const accented = await craftVersion(manifest("big", { attributes: { description: "é".repeat(2000) } }), []);
    expect(accented.json.toString("utf8").length).toBeLessThan(3000);
    expect(accented.json.length).toBeGreaterThan(3000);
    const up = await upstreamOf([good, accented], true);
    const store = await fsStore();
    const report = await mirrorDepot(store, { upstream: up.url, limits: { maxManifestBytes: 3000 } });
    expect(report).toMatchObject({ copied: 1, refusedCount: 1, position: 2 });
    expect(report.refused[0]!.reason).toMatch(/^upstream: big@1\.0\.0: the manifest's size is out of bounds/);
    // Left to the one-by-one read (not copied from the feed), which refuses it from its tar header.
    expect(up.asked.ranges.get("big@1.0.0")).toEqual([0]);
    expect(await store.getRecord("version/big/1.0.0")).toBeNull();
  });

  it("bounds a pull-through's manifest read", async () => {
    const up = await upstreamOf([good, await big], false);
    const store = await fsStore();
    const local = await startDepot(store, {
      upstream: { url: up.url, allowAnonymous: true, limits: { maxManifestBytes: 1024 } },
    });
    cleanups.push(local.close);
    const refused = await fetch(`${local.url}/data/big@1.0.0`);
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    expect(await store.getRecord("version/big/1.0.0")).toBeNull();
    expect((await fetch(`${local.url}/data/good@1.0.0`)).status).toBe(200);
  });
});
