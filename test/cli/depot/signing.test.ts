/**
 * Signed versions through the `runner-depot` command (issue 26): `keys generate` makes a
 * key and its trusted-keys entry, `publish --sign-key` signs, `verify` prints who signed
 * what or names the refusal, and `install --signatures require` installs only what holds.
 * The depot is a real listening one trusting the generated key.
 */
import { mkdir, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import type { TrustedKey } from "../../../src/depot/signing/keys.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { bundleCli, runBundledCli, type CliRun } from "../../fixtures/cli-bundle.js";
import { tempDir } from "../../fixtures/depot.js";

let cli: Awaited<ReturnType<typeof bundleCli>>;
let tmp: Awaited<ReturnType<typeof tempDir>>;
let store: PackageStore;
let server: PackageServer;
let entry: TrustedKey;
let keyFile: string;

/** Runs the command; its exit code, stdout and stderr. */
function run(args: string[]): Promise<CliRun> {
  return runBundledCli(cli.file, args, tmp.dir, { ...process.env, RUNNER_DEPOT_TOKEN: "" });
}

async function trustFile(name: string, keys: TrustedKey[]): Promise<string> {
  const file = path.join(tmp.dir, name);
  await writeFile(file, JSON.stringify({ keys }));
  return file;
}

beforeAll(async () => {
  cli = await bundleCli();
  tmp = await tempDir("cli-signing-");
  const generated = await run(["keys", "generate", "--out", path.join(tmp.dir, "keys"), "--name", "release"]);
  expect(generated.code).toBe(0);
  entry = JSON.parse(generated.out) as TrustedKey;
  keyFile = path.join(tmp.dir, "keys", `${entry.keyId}.key`);
  store = createFsStore(path.join(tmp.dir, "store"), { unsafeNoSync: true });
  server = await servePackageRouter(createPackageRouter(store, { trustedKeys: { keys: [entry] } }), {
    host: "127.0.0.1",
    port: 0,
  });
}, 120_000);

afterAll(async () => {
  await server?.close();
  await store?.close?.();
  await cli?.remove();
  await tmp?.cleanup();
});

describe("runner-depot keys, publish --sign-key, verify, install --signatures", () => {
  it("generates a private key only its owner reads, and an entry naming it", async () => {
    expect(entry).toMatchObject({ keyId: expect.stringMatching(/^[0-9a-f]{64}$/), name: "release" });
    expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
  });

  it("signs at publish; verify prints who signed; install under require says so", async () => {
    const src = path.join(tmp.dir, "src");
    await mkdir(path.join(src, "bin"), { recursive: true });
    await writeFile(path.join(src, "bin/tool"), "#!/bin/sh\necho hi\n");
    const published = await run(["publish", src, "tool@1.0.0", "--url", server.url, "--sign-key", keyFile]);
    expect(published.code, published.err).toBe(0);

    const trusted = await trustFile("trusted.json", [entry]);
    const verified = await run(["verify", "tool@1.0.0", "--url", server.url, "--trusted-keys", trusted]);
    expect(verified.code, verified.err).toBe(0);
    expect(verified.out).toMatch(
      new RegExp(`^tool@1\\.0\\.0: release \\(${entry.keyId}\\) signed the archive and every file, at \\S+Z\\n$`),
    );

    const installed = await run([
      "install",
      "tool@1.0.0",
      path.join(tmp.dir, "vendor"),
      "--url",
      server.url,
      "--signatures",
      "require",
      "--trusted-keys",
      trusted,
    ]);
    expect(installed.code, installed.err).toBe(0);
    expect(installed.err).toContain("  signed by release\n");
  });

  it("verify exits 1 naming package, version and reason for a revoked key", async () => {
    const revoked = await trustFile("revoked.json", [{ ...entry, revokedAt: new Date().toISOString() }]);
    const got = await run(["verify", "tool@1.0.0", "--url", server.url, "--trusted-keys", revoked]);
    expect(got.code).toBe(1);
    expect(got.err.trim()).toBe(
      `runner-depot: verify refused: tool@1.0.0: signed by key ${entry.keyId}, which is revoked`,
    );
  });

  it("refuses a policy without keys before any request", async () => {
    const got = await run(["install", "tool", path.join(tmp.dir, "v2"), "--url", server.url, "--signatures", "verify"]);
    expect(got.code).toBe(2);
    expect(got.err.trim()).toBe("runner-depot: --signatures verify needs --trusted-keys <file>");
  });
});
