/**
 * A mirror and a pull-through depot take from an upstream only versions the depot would publish itself: an upstream
 * (a crafted depot on a real socket, its archives laid out exactly as a depot's, so every digest matches) serves a
 * good version and then one breaking one publish rule or limit (docs/depot-api.md §8, §11). The bad version is refused
 * with UNAVAILABLE (the run stops before it, as for any bad upstream version; a pull answers 503
 * UPSTREAM_UNAVAILABLE) before any of its item bytes move; nothing of it is stored or served by the local depot, and
 * the good version is copied and served. Also: the mirror's configured `limits.maxManifestBytes` bounds the manifest
 * read version by version.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { mirrorDepot, mirrorKey } from "../../../src/depot/mirror/mirror.js";
import type { ManifestItem, PackageManifest } from "../../../src/depot/package/archive.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import type { VersionRecord } from "../../../src/depot/store/records.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { craftedUpstream, craftVersion, sha, type CraftedVersion } from "../../fixtures/crafted-upstream.js";
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

async function upstreamOf(versions: CraftedVersion[], batch: boolean) {
  const up = await craftedUpstream(versions, { batch });
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

describe("a mirror refuses an upstream version the depot would not publish", () => {
  describe.each([
    ["version by version", false],
    ["by batch reads", true],
  ])("%s", (_, batch) => {
    it.each(cases)("%s", async (_title, parts, reason) => {
      const bad = await craftBad(parts);
      const up = await upstreamOf([good, bad], batch);
      const store = await fsStore();
      for (let run = 0; run < 2; run++) {
        // Refused as any bad upstream version is: the run stops there, its position kept before it.
        const error = await mirrorDepot(store, { upstream: up.url }).then(
          () => null,
          (e: unknown) => e,
        );
        expect(refusal(error)).toMatch(/^UNAVAILABLE upstream: bad@1\.0\.0: /);
        expect(refusal(error)).toMatch(reason);
        expect((await store.getRecord<{ position: number }>(mirrorKey(up.url)))!.value.position).toBe(1);
        // What the mirror had stays as it was; nothing of the refused version is stored.
        expect((await store.getRecord<VersionRecord>("version/good/1.0.0"))!.value.digest).toBe(good.digest);
        expect(await store.getRecord("version/bad/1.0.0")).toBeNull();
        expect(await store.statBlob(sha(SECRET))).toBeNull();
      }
      // Only its manifest was read (the header, then its bytes), never an item.
      expect(new Set(up.asked.ranges.get("bad@1.0.0"))).toEqual(new Set([0, 512]));
      expect(up.asked.blobRefs).not.toContain("bad@1.0.0");
      await expectServed(store);
    });
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
      expect(((await answer.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    }
    const cause = errors.map((e) => (e as { cause?: unknown }).cause).find((c) => isRunnerDepotError(c));
    expect(refusal(cause)).toMatch(reason);
    expect(await store.getRecord("version/bad/1.0.0")).toBeNull();
    expect(await store.statBlob(sha(SECRET))).toBeNull();
    expect(new Set(up.asked.ranges.get("bad@1.0.0"))).toEqual(new Set([0, 512]));
    const data = await fetch(`${local.url}/data/good@1.0.0`);
    expect(data.status).toBe(200);
    expect(sha(Buffer.from(await data.arrayBuffer()))).toBe(good.digest);
    expect((await fetch(`${local.url}/version/bad`)).status).toBe(503);
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
    const error = await mirrorDepot(store, { upstream: up.url, limits: { maxManifestBytes: 1024 } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(refusal(error)).toMatch(/^UNAVAILABLE upstream: big@1\.0\.0: the manifest's size is out of bounds/);
    // Refused from its tar header: the manifest's bytes were never asked for.
    expect(up.asked.ranges.get("big@1.0.0")).toEqual([0]);
    expect(await store.getRecord("version/big/1.0.0")).toBeNull();
    expect((await store.getRecord<VersionRecord>("version/good/1.0.0"))!.value.digest).toBe(good.digest);
    // Within a larger bound the same version is copied.
    const report = await mirrorDepot(store, { upstream: up.url, limits: { maxManifestBytes: 8192 } });
    expect(report).toMatchObject({ copied: 1, position: 2 });
    expect((await store.getRecord<VersionRecord>("version/big/1.0.0"))!.value.digest).toBe(bigger.digest);
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
