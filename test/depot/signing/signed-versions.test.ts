/**
 * Signed versions end to end (issue 26): a real depot (router + servePackageRouter over
 * the fs store) with trusted keys, the client signing at publish, and the installer
 * judging what the depot serves under each policy. A second depot plays the lying mirror:
 * its store is written directly, as an attacker holding it would.
 */
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import type { DepotClient } from "../../../src/depot/client/types.js";
import { createPackageRouter, type PackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { signBundle } from "../../../src/depot/signing/bundle.js";
import {
  generateSigningKey,
  signingKeyFromPem,
  trustedKeyEntry,
  type GeneratedKey,
  type TrustedKey,
} from "../../../src/depot/signing/keys.js";
import { signedVersionStatement } from "../../../src/depot/signing/statement.js";
import { keys, updateRecord } from "../../../src/depot/store/records.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { failure } from "../../fixtures/errors.js";

interface Depot {
  url: string;
  store: PackageStore;
  router: PackageRouter;
  client: DepotClient;
  close(): Promise<void>;
}

let root: string;
const depots: Depot[] = [];
const release = generateSigningKey();
const stranger = generateSigningKey();

async function startDepot(trusted: TrustedKey[], options: { gcGraceMs?: number } = {}): Promise<Depot> {
  const dir = await mkdtemp(path.join(root, "depot-"));
  const store = createFsStore(dir, { unsafeNoSync: true });
  const router = createPackageRouter(store, { trustedKeys: { keys: trusted }, ...options });
  const http = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
  const depot = {
    url: http.url,
    store,
    router,
    client: createDepotClient({ baseUrl: http.url }),
    async close() {
      await http.close();
      await store.close?.();
    },
  };
  depots.push(depot);
  return depot;
}

const items = (tool: string) => [
  { type: "file" as const, path: "bin/tool", content: tool, mode: 0o755 },
  { type: "file" as const, path: "share/doc/README", content: "read me\n" },
  { type: "link" as const, path: "tool", target: "bin/tool" },
];
const signer = (key: GeneratedKey) => signingKeyFromPem(key.privateKey);
const trustOnly = (...entries: TrustedKey[]) => ({ keys: entries });

let depot: Depot;

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "signed-versions-"));
  depot = await startDepot([trustedKeyEntry(release, "release")]);
  await depot.client.publish({
    name: "tool",
    version: "1.0.0",
    items: items("#!/bin/sh\necho 1\n"),
    sign: signer(release),
  });
  await depot.client.publish({ name: "plain", version: "1.0.0", items: items("unsigned") });
});
afterAll(async () => {
  for (const d of depots) await d.close();
  await rm(root, { recursive: true, force: true });
});

describe("signed versions through a real depot", () => {
  it("lists the publisher's bundle and installs under require, saying who signed", async () => {
    const list = await depot.client.attestations("tool@1.0.0");
    expect(list.attestations).toHaveLength(1);
    expect(list.attestations[0]).toMatchObject({
      keyId: release.keyId,
      predicateType: expect.stringContaining("signed-version"),
    });
    const target = await mkdtemp(path.join(root, "install-"));
    const result = await depot.client.install("tool@1.0.0", target, {
      signatures: { policy: "require", trustedKeys: trustOnly(trustedKeyEntry(release, "release")) },
    });
    expect(result.packages[0]!.verified).toEqual([
      { keyId: release.keyId, keyName: "release", predicateType: "urn:runner-depot:predicate:signed-version:v1" },
    ]);
    expect(await readFile(path.join(target, "tool/bin/tool"), "utf8")).toBe("#!/bin/sh\necho 1\n");
  });

  it("refuses an unsigned version under require, naming package, version and reason; takes it under verify", async () => {
    const target = await mkdtemp(path.join(root, "install-"));
    const trustedKeys = trustOnly(trustedKeyEntry(release));
    const error = await failure(
      depot.client.install("plain@1.0.0", target, { signatures: { policy: "require", trustedKeys } }),
    );
    expect(error).toMatchObject({ code: "SIGNATURE_REQUIRED", details: { package: "plain", version: "1.0.0" } });
    expect(error.message).toMatch(/^plain@1\.0\.0: unsigned/);
    const ok = await depot.client.install("plain@1.0.0", target, { signatures: { policy: "verify", trustedKeys } });
    expect(ok.packages[0]).toMatchObject({ action: "installed", verified: [] });
  });

  it("refuses a key the installer does not trust, and a revoked one, installing nothing", async () => {
    const target = await mkdtemp(path.join(root, "install-"));
    const unknown = await failure(
      depot.client.install("tool@1.0.0", target, {
        signatures: { policy: "verify", trustedKeys: trustOnly(trustedKeyEntry(stranger)) },
      }),
    );
    expect(unknown).toMatchObject({ code: "KEY_UNTRUSTED", details: { package: "tool", version: "1.0.0" } });
    expect(unknown.message).toContain(release.keyId);
    const revoked = await failure(
      depot.client.install("tool@1.0.0", target, {
        signatures: {
          policy: "verify",
          trustedKeys: trustOnly({ ...trustedKeyEntry(release), revokedAt: new Date().toISOString() }),
        },
      }),
    );
    expect(revoked).toMatchObject({ code: "KEY_REVOKED", details: { package: "tool", version: "1.0.0" } });
    await expect(readFile(path.join(target, "tool/bin/tool"))).rejects.toThrow(/ENOENT/);
  });

  it("judges a rotated-out key by when it signed: inside its window holds, after it does not", async () => {
    const past = new Date(Date.now() - 3600_000).toISOString();
    const error = await failure(
      depot.client.verify("tool@1.0.0", {
        policy: "verify",
        trustedKeys: trustOnly({ ...trustedKeyEntry(release), validUntil: past }),
      }),
    );
    expect(error).toMatchObject({ code: "KEY_UNTRUSTED" });
    expect(error.message).toMatch(/outside its validity window/);
    const held = await depot.client.verify("tool@1.0.0", {
      policy: "verify",
      trustedKeys: trustOnly({ ...trustedKeyEntry(release), validFrom: past }),
    });
    expect(held.map((a) => a.keyId)).toEqual([release.keyId]);
  });

  it("the depot refuses a bundle by a key it does not trust, for another version, or not a bundle", async () => {
    const post = (spec: string, body: string) =>
      fetch(`${depot.url}/attestations/${spec}`, {
        method: "POST",
        body,
        headers: { "content-type": "application/json" },
      });
    const content = await describe1("tool", "1.0.0");
    const byStranger = signBundle(
      Buffer.from(JSON.stringify(signedVersionStatement(content, new Date()))),
      signer(stranger),
    );
    const r1 = await post("tool@1.0.0", JSON.stringify(byStranger));
    expect(r1.status).toBe(422);
    expect(await r1.json()).toMatchObject({ code: "KEY_UNTRUSTED" });
    await depot.client.publish({ name: "tool", version: "1.0.1", items: items("#!/bin/sh\necho 1\n") });
    const forOld = signBundle(
      Buffer.from(JSON.stringify(signedVersionStatement(content, new Date()))),
      signer(release),
    );
    const r2 = await post("tool@1.0.1", JSON.stringify(forOld));
    expect(r2.status).toBe(422);
    expect(await r2.json()).toMatchObject({ code: "SUBJECT_MISMATCH", detail: expect.stringContaining("tool@1.0.0") });
    const r3 = await post("tool@1.0.0", "{}");
    expect(r3.status).toBe(400);
    expect(await r3.json()).toMatchObject({ code: "ATTESTATION_INVALID" });
    const r4 = await post("tool@1.0.0", "x".repeat(16 * 2 ** 20 + 1));
    expect(r4.status).toBe(413);
    expect((await depot.client.attestations("tool@1.0.1")).attestations).toEqual([]);
  });

  it("a lying depot: a flipped byte in one file, or another version's signature, is refused naming it", async () => {
    // The mirror holds what an attacker made: the same name and version with one byte of
    // bin/tool flipped, carrying the genuine bundle (its store written directly).
    const mirror = await startDepot([]);
    await mirror.client.publish({ name: "tool", version: "1.0.0", items: items("#!/bin/sh\necho 2\n") });
    await mirror.client.publish({ name: "tool", version: "1.0.1", items: items("#!/bin/sh\necho 1\n") });
    const genuine = (await depot.client.attestations("tool@1.0.0")).attestations[0]!.bundle;
    for (const version of ["1.0.0", "1.0.1"]) await inject(mirror.store, "tool", version, genuine);
    const trustedKeys = trustOnly(trustedKeyEntry(release));
    const target = await mkdtemp(path.join(root, "install-"));
    const flipped = await failure(
      mirror.client.install("tool@1.0.0", target, { signatures: { policy: "verify", trustedKeys } }),
    );
    expect(flipped).toMatchObject({
      code: "SUBJECT_MISMATCH",
      details: { package: "tool", version: "1.0.0", file: "bin/tool" },
    });
    expect(flipped.message).toBe("tool@1.0.0: bin/tool is not the file signed");
    // 1.0.1's bytes equal the signed 1.0.0's: only the version named in the statement differs.
    const other = await failure(
      mirror.client.install("tool@1.0.1", target, { signatures: { policy: "require", trustedKeys } }),
    );
    expect(other).toMatchObject({ code: "SUBJECT_MISMATCH", details: { package: "tool", version: "1.0.1" } });
    expect(other.message).toMatch(/about tool@1\.0\.0, not this version/);
    // Under ignore the same lies install: the policy is what refused them.
    await mirror.client.install("tool@1.0.0", target, { signatures: { policy: "ignore" } });
  });

  it("a replayed bundle, re-spaced, padded or with its base64 rewritten, is the attestation already listed", async () => {
    // An attack round (2026-12-02): 15 padded copies of the public bundle each took a place, locking out real ones.
    const replay = await startDepot([trustedKeyEntry(release)]);
    await replay.client.publish({ name: "rp", version: "1.0.0", items: items("r"), sign: signer(release) });
    const [first] = (await replay.client.attestations("rp@1.0.0")).attestations;
    const bundle = first!.bundle as { dsseEnvelope: { payload: string } };
    const unpadded = bundle.dsseEnvelope.payload.replace(/=+$/, "");
    const copies = [
      JSON.stringify(bundle, null, 2),
      JSON.stringify({ ...bundle, pad: "A".repeat(1 << 20) }),
      JSON.stringify({ ...bundle, dsseEnvelope: { ...bundle.dsseEnvelope, payload: unpadded, extra: [1, 2] } }),
    ];
    for (const body of copies) {
      const answer = await fetch(`${replay.url}/attestations/rp@1.0.0`, { method: "POST", body });
      expect(answer.status).toBe(200);
      expect(await answer.json()).toMatchObject({ digest: first!.digest, addedAt: first!.addedAt });
    }
    const listed = (await replay.client.attestations("rp@1.0.0")).attestations;
    expect(listed).toEqual([first]);
    // What is stored and served is the bundle in one shape, whatever the first copy carried.
    expect(Object.keys(listed[0]!.bundle as object)).toEqual(["mediaType", "verificationMaterial", "dsseEnvelope"]);
  });

  it("a bundle stored as received before bundles were rebuilt is the one listed when it comes again", async () => {
    const legacy = await startDepot([trustedKeyEntry(release)]);
    await legacy.client.publish({ name: "old", version: "1.0.0", items: items("o"), sign: signer(release) });
    const [first] = (await legacy.client.attestations("old@1.0.0")).attestations;
    // What a depot before the change kept: the bytes as received (re-spaced here), listed by their digest.
    const asReceived = Buffer.from(JSON.stringify(first!.bundle, null, 4));
    const blob = await legacy.store.putBlob(
      (async function* () {
        yield asReceived;
      })(),
    );
    await updateRecord<{ name: string; version: string; attestations: Array<Record<string, unknown>> }>(
      legacy.store,
      keys.attestation("old", "1.0.0"),
      (current) => ({
        ...current!.value,
        attestations: [{ ...current!.value.attestations[0]!, digest: blob.digest, size: blob.size }],
      }),
    );
    const answer = await fetch(`${legacy.url}/attestations/old@1.0.0`, {
      method: "POST",
      body: JSON.stringify(first!.bundle),
    });
    expect(answer.status).toBe(200);
    expect(await answer.json()).toMatchObject({ digest: blob.digest });
    expect((await legacy.client.attestations("old@1.0.0")).attestations).toHaveLength(1);
  });

  it("a body that is not UTF-8 is ATTESTATION_INVALID, and a version's bundles are bounded in bytes in all", async () => {
    const bound = await startDepot([trustedKeyEntry(release)]);
    await bound.client.publish({ name: "big", version: "1.0.0", items: items("b") });
    const body = Buffer.concat([Buffer.from('{"pad":"'), Buffer.alloc(64, 0xff), Buffer.from('"}')]);
    const invalid = await fetch(`${bound.url}/attestations/big@1.0.0`, { method: "POST", body });
    expect(invalid.status).toBe(400);
    expect(await invalid.json()).toMatchObject({ code: "ATTESTATION_INVALID" });
    // Statements signed by the trusted key, each with a 3 MiB predicate (a 4 MiB bundle): fewer than 16 fit in 32 MiB.
    const content = await bound.client.versions("big");
    const manifest = await bound.client.manifest("big@1.0.0");
    const versionContent = {
      name: "big",
      version: "1.0.0",
      digest: content.versions[0]!.digest,
      files: manifest.items.flatMap((i) => (i.type === "file" ? [{ path: i.path, digest: i.digest! }] : [])),
    };
    const statuses: number[] = [];
    for (let i = 0; i < 16 && !statuses.includes(413); i++) {
      const statement = signedVersionStatement(versionContent, new Date(Date.now() - 60_000 + i));
      const padded = { ...statement, predicate: { ...statement.predicate, note: `${i}`.padEnd(3 * 2 ** 20, ".") } };
      const bundle = signBundle(Buffer.from(JSON.stringify(padded)), signer(release));
      const answer = await fetch(`${bound.url}/attestations/big@1.0.0`, {
        method: "POST",
        body: JSON.stringify(bundle),
      });
      statuses.push(answer.status);
      if (answer.status === 413) expect(await answer.json()).toMatchObject({ code: "TOO_LARGE" });
    }
    expect(statuses.at(-1)).toBe(413);
    expect(statuses.slice(0, -1).every((s) => s === 201)).toBe(true);
    const held = (await bound.client.attestations("big@1.0.0")).attestations;
    expect(held.length).toBe(statuses.length - 1);
    expect(held.reduce((n, a) => n + (a as { size: number }).size, 0)).toBeLessThanOrEqual(32 * 2 ** 20);
  });

  it("a bundle by a key the depot does not trust is refused before the version's manifest is read", async () => {
    const dir = await mkdtemp(path.join(root, "depot-reads-"));
    const store = createFsStore(dir, { unsafeNoSync: true });
    const read: string[] = [];
    const counted: PackageStore = Object.create(store);
    counted.getBlob = (digest, ...rest) => {
      read.push(digest);
      return store.getBlob(digest, ...rest);
    };
    const router = createPackageRouter(counted, { trustedKeys: { keys: [trustedKeyEntry(release)] } });
    const http = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
    try {
      const client = createDepotClient({ baseUrl: http.url });
      await client.publish({ name: "cheap", version: "1.0.0", items: items("c") });
      const record = (await store.getRecord<{ manifest: string }>(keys.version("cheap", "1.0.0")))!.value;
      const content = {
        name: "cheap",
        version: "1.0.0",
        digest: (await client.versions("cheap")).versions[0]!.digest,
        files: [],
      };
      const byStranger = signBundle(
        Buffer.from(JSON.stringify(signedVersionStatement(content, new Date()))),
        signer(stranger),
      );
      read.length = 0;
      const answer = await fetch(`${http.url}/attestations/cheap@1.0.0`, {
        method: "POST",
        body: JSON.stringify(byStranger),
      });
      expect(answer.status).toBe(422);
      expect(await answer.json()).toMatchObject({ code: "KEY_UNTRUSTED", package: "cheap", version: "1.0.0" });
      expect(read).not.toContain(record.manifest);
      // A trusted key's bundle does read it (its subjects are checked against the files).
      await client.sign("cheap@1.0.0", signer(release));
      expect(read).toContain(record.manifest);
    } finally {
      await http.close();
      await store.close?.();
    }
  });

  it("garbage collection keeps a version's bundles", async () => {
    const gc = await startDepot([trustedKeyEntry(release)], { gcGraceMs: 0 });
    await gc.client.publish({ name: "kept", version: "1.0.0", items: items("k"), sign: signer(release) });
    const before = (await gc.client.attestations("kept@1.0.0")).attestations;
    await gc.router.collectGarbage();
    await gc.router.collectGarbage();
    expect(await gc.store.statBlob(before[0]!.digest)).not.toBeNull();
    expect((await gc.client.attestations("kept@1.0.0")).attestations).toEqual(before);
  });
});

/** The content of a version on the main depot, as a statement names it. */
async function describe1(name: string, version: string) {
  const manifest = await depot.client.manifest(`${name}@${version}`);
  const info = await depot.client.versions(name);
  return {
    name,
    version,
    digest: info.versions.find((v) => v.version === version)!.digest,
    files: manifest.items.flatMap((i) => (i.type === "file" ? [{ path: i.path, digest: i.digest! }] : [])),
  };
}

/** Writes a bundle into a store as an attacker holding it would: blob and record, no check. */
async function inject(store: PackageStore, name: string, version: string, bundle: unknown): Promise<void> {
  const bytes = Buffer.from(JSON.stringify(bundle));
  const blob = await store.putBlob(
    (async function* () {
      yield bytes;
    })(),
  );
  const entry = {
    digest: blob.digest,
    size: blob.size,
    keyId: release.keyId,
    predicateType: "urn:runner-depot:predicate:signed-version:v1",
    signedAt: new Date().toISOString(),
    addedAt: new Date().toISOString(),
  };
  await store.putRecord(
    keys.attestation(name, version),
    { name, version, attestations: [entry] },
    { ifRevision: null },
  );
}
