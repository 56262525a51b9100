/**
 * Independent verifiers accept what the depot serves (issue 26): the bundle a real depot
 * answers on `GET /attestations` is verified by `@sigstore/verify` with the public key,
 * and its DSSE envelope by Debian's python3-securesystemslib (installed by
 * .ci/services.sh). Each is also shown to refuse the same bundle with one byte of its
 * payload changed, so neither check can pass on anything.
 */
import { execFile } from "node:child_process";
import { createPublicKey } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { bundleFromJSON } from "@sigstore/bundle";
import { toSignedEntity, Verifier, type TrustMaterial } from "@sigstore/verify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import type { SigstoreBundle } from "../../../src/depot/signing/bundle.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../../../src/depot/signing/keys.js";
import type { PackageStore } from "../../../src/depot/ports.js";

const run = promisify(execFile);
/** Debian's interpreter: the one python3-securesystemslib installs into (not a pyenv shim's). */
const PYTHON = "/usr/bin/python3";

const key = generateSigningKey();
let dir: string;
let store: PackageStore;
let server: PackageServer;
let served: SigstoreBundle;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "independent-verifiers-"));
  store = createFsStore(path.join(dir, "store"), { unsafeNoSync: true });
  const router = createPackageRouter(store, { trustedKeys: { keys: [trustedKeyEntry(key)] } });
  server = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
  const client = createDepotClient({ baseUrl: server.url });
  await client.publish({
    name: "tool",
    version: "2.1.0",
    items: [
      { type: "file", path: "bin/tool", content: "#!/bin/sh\n" },
      { type: "file", path: "lib/data.bin", content: new Uint8Array(70_000).fill(7) },
    ],
    sign: signingKeyFromPem(key.privateKey),
  });
  // What any client reads: the route's JSON, not an object of this process.
  const answer = await fetch(`${server.url}/attestations/tool@2.1.0`);
  served = ((await answer.json()) as { attestations: Array<{ bundle: SigstoreBundle }> }).attestations[0]!.bundle;
});
afterAll(async () => {
  await server?.close();
  await store?.close?.();
  await rm(dir, { recursive: true, force: true });
});

/** The bundle with one byte of its statement changed (a subject's digest), signature kept. */
function tampered(bundle: SigstoreBundle): SigstoreBundle {
  const payload = Buffer.from(bundle.dsseEnvelope.payload, "base64").toString("utf8");
  const changed = payload.replace(/"sha256":"(.)/, (_m, c: string) => `"sha256":"${c === "0" ? "1" : "0"}`);
  expect(changed).not.toBe(payload);
  return { ...bundle, dsseEnvelope: { ...bundle.dsseEnvelope, payload: Buffer.from(changed).toString("base64") } };
}

describe("@sigstore/verify", () => {
  const trust: TrustMaterial = {
    certificateAuthorities: [],
    timestampAuthorities: [],
    tlogs: [],
    ctlogs: [],
    publicKey: (hint) => {
      if (hint !== key.keyId) throw new Error(`unknown key ${hint}`);
      return { publicKey: createPublicKey(key.publicKey), validFor: () => true };
    },
  };
  // Public-key bundles carry no transparency log entry or timestamp: none is required.
  const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });

  it("verifies the served bundle with the public key", () => {
    const signer = verifier.verify(toSignedEntity(bundleFromJSON(served)));
    expect(signer.key.export({ type: "spki", format: "pem" })).toBe(key.publicKey);
  });

  it("refuses it with one byte of the statement changed", () => {
    expect(() => verifier.verify(toSignedEntity(bundleFromJSON(tampered(served))))).toThrow(/signature/i);
  });
});

describe("python3-securesystemslib", () => {
  /**
   * securesystemslib's Ed25519 check over the DSSE pre-authentication encoding, which the
   * script builds itself from the DSSE spec (Debian's 0.26 predates securesystemslib.dsse).
   */
  const script = `
import base64, json, sys
from securesystemslib.signer import SSlibKey, Signature
bundle = json.load(sys.stdin)
env = bundle["dsseEnvelope"]
payload = base64.b64decode(env["payload"])
ptype = env["payloadType"].encode()
pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype, len(payload), payload)
sig = env["signatures"][0]
key = SSlibKey.from_dict(sig["keyid"], {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": sys.argv[1]}})
key.verify_signature(Signature(sig["keyid"], base64.b64decode(sig["sig"]).hex()), pae)
statement = json.loads(payload)
print(json.dumps({"keyid": key.keyid, "type": statement["_type"], "subjects": [s["name"] for s in statement["subject"]]}))
`;
  const publicHex = Buffer.from(createPublicKey(key.publicKey).export({ format: "jwk" }).x!, "base64url").toString(
    "hex",
  );
  const verify = async (bundle: SigstoreBundle) => {
    const file = path.join(dir, "verify.py");
    await writeFile(file, script);
    const child = run(PYTHON, [file, publicHex]);
    child.child.stdin!.end(JSON.stringify(bundle));
    return child;
  };

  it("verifies the served envelope's signature and reads its statement", async () => {
    const { stdout } = await verify(served);
    expect(JSON.parse(stdout)).toEqual({
      keyid: key.keyId,
      type: "https://in-toto.io/Statement/v1",
      subjects: ["tool@2.1.0", "tool@2.1.0/bin/tool", "tool@2.1.0/lib/data.bin"],
    });
  });

  it("refuses it with one byte of the statement changed", async () => {
    await expect(verify(tampered(served))).rejects.toThrow(/UnverifiedSignatureError|Failed to verify/);
  });
});
