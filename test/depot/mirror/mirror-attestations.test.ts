/**
 * Attestations through the mirror (issues 26 and 27): an upstream depot with trusted keys, on a real
 * socket, mirrored into a second fs store that is served by a second depot. The mirror copies each
 * version's bundles (their feed entries say `attested`), checks their subjects against the content it
 * copied, and the client verifies them on the mirror. A lying upstream's bundle is refused.
 */
import { createHash } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import type { DepotClient } from "../../../src/depot/client/types.js";
import { mirrorDepot, mirrorKey } from "../../../src/depot/mirror/mirror.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../../../src/depot/signing/keys.js";
import { signBundle } from "../../../src/depot/signing/bundle.js";
import { signedVersionStatement } from "../../../src/depot/signing/statement.js";
import { addAttestation, versionContent, type AttestationRecord } from "../../../src/depot/store/attestations.js";
import { keys, type VersionRecord } from "../../../src/depot/store/records.js";
import { failure } from "../../fixtures/errors.js";

interface Depot {
  url: string;
  store: PackageStore;
  client: DepotClient;
  close(): Promise<void>;
}

let root: string;
const depots: Depot[] = [];
const release = generateSigningKey();
const releaseKey = release;
const auditor = generateSigningKey();
const bothKeys = { keys: [trustedKeyEntry(release, "release"), trustedKeyEntry(auditor, "auditor")] };

async function serve(store: PackageStore): Promise<Depot> {
  const router = createPackageRouter(store, { trustedKeys: bothKeys, onError: () => undefined });
  const http = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
  const depot = {
    url: http.url,
    store,
    client: createDepotClient({ baseUrl: http.url }),
    async close() {
      await http.close();
      await store.close?.();
    },
  };
  depots.push(depot);
  return depot;
}
const newStore = async () => createFsStore(await mkdtemp(path.join(root, "store-")), { unsafeNoSync: true });

const items = (text: string) => [
  { type: "file" as const, path: "bin/tool", content: text, mode: 0o755 },
  { type: "file" as const, path: "share/README", content: "read me\n" },
];

type FeedChange = { position: number; name: string; version: string; attested?: string };
async function feed(url: string): Promise<FeedChange[]> {
  const page = (await (await fetch(`${url}/catalog?since=0&limit=500`)).json()) as { changes: FeedChange[] };
  return page.changes;
}

let up: Depot;
beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "mirror-attest-"));
  up = await serve(await newStore());
  await up.client.publish({
    name: "tool",
    version: "1.0.0",
    items: items("#!/bin/sh\necho 1\n"),
    sign: signingKeyFromPem(release.privateKey),
  });
});
afterAll(async () => {
  for (const d of depots) await d.close();
  await rm(root, { recursive: true, force: true });
});

describe("mirroring attestations between two real depots", () => {
  it("carries each bundle in the feed, copies it, and copies one added after the first run on the next", async () => {
    const upFeed = await feed(up.url);
    const [bundle] = (await up.client.attestations("tool@1.0.0")).attestations;
    expect(upFeed).toEqual([
      expect.objectContaining({ position: 1, name: "tool", version: "1.0.0" }),
      { position: 2, name: "tool", version: "1.0.0", attested: bundle!.digest },
    ]);
    expect(upFeed[0]).not.toHaveProperty("attested");
    // An attestation entry changes no package's versions, on a catalog page or in a since answer.
    for (const query of ["", "?since=0"]) {
      const answer = (await (await fetch(`${up.url}/catalog${query}`)).json()) as {
        packages: Record<string, { versions: string[]; latest: string }>;
      };
      expect(answer.packages.tool).toMatchObject({ versions: ["1.0.0"], latest: "1.0.0" });
    }

    const store = await newStore();
    const first = await mirrorDepot(store, { upstream: up.url });
    expect(first).toMatchObject({ copied: 1, attestations: 1, position: 2 });
    const mirror = await serve(store);
    const copied = (await mirror.client.attestations("tool@1.0.0")).attestations;
    expect(copied).toHaveLength(1);
    expect(copied[0]!.bundle).toEqual(bundle!.bundle);
    expect(copied[0]).toMatchObject({ keyId: release.keyId, predicateType: bundle!.predicateType });
    expect(copied[0]).not.toHaveProperty("unsequenced");
    const trustRelease = { keys: [trustedKeyEntry(release, "release")] };
    expect(await mirror.client.verify("tool@1.0.0", { policy: "require", trustedKeys: trustRelease })).toEqual([
      expect.objectContaining({ keyId: release.keyId, keyName: "release" }),
    ]);

    // A second signature after the first run: a new feed entry upstream, copied by the next run.
    await up.client.sign("tool@1.0.0", signingKeyFromPem(auditor.privateKey));
    const second = await mirrorDepot(store, { upstream: up.url });
    expect(second).toMatchObject({ copied: 0, present: 0, attestations: 1, position: 3 });
    const held = await mirror.client.verify("tool@1.0.0", { policy: "require", trustedKeys: bothKeys });
    expect(held.map((a) => a.keyName).sort()).toEqual(["auditor", "release"]);
    // Only release trusted: the auditor's bundle now on the mirror is refused, as on the upstream.
    expect(
      (await failure(mirror.client.verify("tool@1.0.0", { policy: "verify", trustedKeys: trustRelease }))).code,
    ).toBe("KEY_UNTRUSTED");
    // The mirror's own feed carries what it stored, so a mirror of the mirror copies it too.
    expect((await feed(mirror.url)).filter((c) => c.attested !== undefined)).toHaveLength(2);
    const third = await mirrorDepot(store, { upstream: up.url });
    expect(third).toMatchObject({ copied: 0, attestations: 0, position: 3 });
  });

  it("under require: an unsigned version waits for its signature, then is copied; an untrusted signer is refused", async () => {
    const origin = await serve(await newStore());
    const release = signingKeyFromPem(releaseKey.privateKey);
    await origin.client.publish({ name: "signed", version: "1.0.0", items: items("s\n"), sign: release });
    await origin.client.publish({ name: "plain", version: "1.0.0", items: items("p\n") });
    const store = await newStore();
    const policy = { policy: "require" as const, trustedKeys: { keys: [trustedKeyEntry(releaseKey, "release")] } };
    const first = await mirrorDepot(store, { upstream: origin.url, signatures: policy });
    expect(first).toMatchObject({ copied: 1, deferred: 1, attestations: 1 });
    const mirror = await serve(store);
    expect((await fetch(`${mirror.url}/version/plain`)).status).toBe(404);
    expect(await mirror.client.verify("signed@1.0.0", policy)).toHaveLength(1);

    // Signed later: its attestation entry brings the version over, with the bundle.
    await origin.client.sign("plain@1.0.0", release);
    const second = await mirrorDepot(store, { upstream: origin.url, signatures: policy });
    expect(second).toMatchObject({ copied: 1, deferred: 0, attestations: 1 });
    expect(await mirror.client.verify("plain@1.0.0", policy)).toHaveLength(1);

    // Signed by a key the mirror does not trust: refused, nothing listed, the position kept.
    await origin.client.publish({
      name: "other",
      version: "1.0.0",
      items: items("o\n"),
      sign: signingKeyFromPem(auditor.privateKey),
    });
    const refused = await failure(mirrorDepot(store, { upstream: origin.url, signatures: policy }));
    expect(refused.code).toBe("KEY_UNTRUSTED");
    expect((await fetch(`${mirror.url}/version/other`)).status).toBe(404);
  });

  it("refuses a bundle whose subjects are another version's, storing nothing and keeping its position", async () => {
    await up.client.publish({ name: "tool", version: "2.0.0", items: items("#!/bin/sh\necho 2\n") });
    const store = await newStore();
    const before = await mirrorDepot(store, { upstream: up.url });
    // The upstream's store is written directly, as an attacker holding it would: 1.0.0's bundle on 2.0.0.
    const [bundle] = (await up.client.attestations("tool@1.0.0")).attestations;
    const record = (await up.store.getRecord<VersionRecord>(keys.version("tool", "2.0.0")))!.value;
    await addAttestation(
      up.store,
      record,
      bundle!.bundle,
      { keyId: release.keyId, predicateType: bundle!.predicateType, signedAt: bundle!.signedAt },
      new Date(),
    );
    // Written behind the router's back: its held head catches up within HEAD_STALE_MS (depot/catalog/head.ts).
    await vi.waitFor(
      async () => expect((await feed(up.url)).at(-1)).toMatchObject({ version: "2.0.0", attested: expect.any(String) }),
      { timeout: 10_000 },
    );
    const error = await failure(mirrorDepot(store, { upstream: up.url }));
    expect(error).toMatchObject({ code: "SUBJECT_MISMATCH" });
    expect(error.message).toContain("tool@2.0.0");
    const mirror = await serve(store);
    expect((await mirror.client.attestations("tool@2.0.0")).attestations).toEqual([]);
    expect((await feed(mirror.url)).some((c) => c.version === "2.0.0" && c.attested !== undefined)).toBe(false);
    // The run stopped at the refused entry: the saved position is still the one before it.
    const saved = await store.getRecord<{ position: number }>(mirrorKey(up.url));
    expect(saved?.value.position).toBe(before.position);
  });

  it("with trustedKeys, refuses a bundle signed by a key the mirror does not trust", async () => {
    const store = await newStore();
    const error = await failure(
      mirrorDepot(store, { upstream: up.url, trustedKeys: { keys: [trustedKeyEntry(auditor, "auditor")] } }),
    );
    expect(error).toMatchObject({ code: "KEY_UNTRUSTED" });
    expect(error.message).toContain("tool@1.0.0");
  });
  it("a bundle listed but never sequenced (a kill between) gets its entry when it is added again", async () => {
    await up.client.publish({ name: "tool", version: "3.0.0", items: items("#!/bin/sh\necho 3\n") });
    const record = (await up.store.getRecord<VersionRecord>(keys.version("tool", "3.0.0")))!.value;
    const content = await versionContent(up.store, record);
    const statement = signedVersionStatement(content, new Date());
    const body = JSON.stringify(
      signBundle(Buffer.from(JSON.stringify(statement)), signingKeyFromPem(release.privateKey)),
    );
    const digest = `sha256:${createHash("sha256").update(body).digest("hex")}`;
    // What a call killed after listing the bundle leaves: its blob, and its entry flagged unsequenced.
    await up.store.putBlob(
      (async function* () {
        yield Buffer.from(body);
      })(),
    );
    const listed = {
      digest,
      size: Buffer.byteLength(body),
      keyId: release.keyId,
      predicateType: statement.predicateType,
    };
    await up.store.putRecord(
      keys.attestation("tool", "3.0.0"),
      {
        name: "tool",
        version: "3.0.0",
        attestations: [
          { ...listed, signedAt: new Date().toISOString(), addedAt: new Date().toISOString(), unsequenced: true },
        ],
      } satisfies AttestationRecord,
      { ifRevision: null },
    );
    expect((await feed(up.url)).some((c) => c.attested === digest)).toBe(false);
    const again = await fetch(`${up.url}/attestations/tool@3.0.0`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    expect(again.status).toBe(200);
    const answer = (await again.json()) as Record<string, unknown>;
    expect(answer).toMatchObject({ digest });
    expect(answer).not.toHaveProperty("unsequenced");
    expect((await feed(up.url)).filter((c) => c.attested === digest)).toHaveLength(1);
    // Repeated once sequenced: nothing more is appended.
    await fetch(`${up.url}/attestations/tool@3.0.0`, { method: "POST", body });
    expect((await feed(up.url)).filter((c) => c.attested === digest)).toHaveLength(1);
  });
});
