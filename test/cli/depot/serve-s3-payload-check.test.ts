/**
 * `runner-depot serve --s3-no-payload-check`: the S3 store's `serverVerifiesPayload: false`
 * from the command line. Seen on the object S3 keeps: without the flag a declared digest of
 * known size is one `PutObject` (a plain ETag); with it, a multipart upload checked by the
 * depot (an ETag `…-<parts>`). Only on the server RUNNER_DEPOT_TEST_S3 names (radosgw,
 * test/setup/ceph-rgw.sh), which checks payload hashes, as the other radosgw-only tests.
 */
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { HeadObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { patternBytes } from "../../../src/testing/index.js";
import { startS3, type S3Fixture } from "../../fixtures/backends.js";
import {
  bundleCli,
  runBundledCli,
  serveArgs,
  spawnJsonLogged,
  type JsonLoggedProcess,
} from "../../fixtures/cli-bundle.js";
import { httpDigest, openTransaction } from "../../fixtures/depot.js";

const onRadosgw = process.env.RUNNER_DEPOT_TEST_S3 ? describe : () => undefined;

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let bundle: Awaited<ReturnType<typeof bundleCli>>;
beforeAll(async () => {
  bundle = await bundleCli();
}, 120_000);
afterAll(async () => {
  await bundle?.remove();
});

describe("serve --s3-no-payload-check", () => {
  it("is listed in serve's help", async () => {
    const help = await runBundledCli(bundle.file, ["serve", "--help"], tmpdir(), process.env);
    expect(help.out + help.err).toMatch(/--s3-no-payload-check +the S3 server does not check/);
  });
});

onRadosgw("serve --s3-no-payload-check (radosgw)", () => {
  let s3: S3Fixture;
  const started: Array<{ run: JsonLoggedProcess; dataDir: string }> = [];

  beforeAll(async () => {
    s3 = await startS3();
  }, 120_000);
  afterAll(async () => {
    for (const { run, dataDir } of started) {
      if (run.child.exitCode === null) {
        run.child.kill("SIGTERM");
        await run.exited;
      }
      await rm(dataDir, { recursive: true, force: true });
    }
    await s3?.close();
  });

  /** serve on S3 blobs with `extra` flags; its depot URL and admin token. */
  async function serve(extra: string[]): Promise<{ url: string; auth: Record<string, string> }> {
    const dataDir = await mkdtemp(path.join(tmpdir(), "serve-s3-check-"));
    const credentials = s3.clientConfig!.credentials as { accessKeyId: string; secretAccessKey: string };
    const run = spawnJsonLogged(
      [
        bundle.file,
        ...serveArgs(dataDir, ["--no-agent", "--s3-bucket", s3.bucket, "--s3-endpoint", s3.endpoint, ...extra]),
      ],
      {
        ...process.env,
        AWS_ACCESS_KEY_ID: credentials.accessKeyId,
        AWS_SECRET_ACCESS_KEY: credentials.secretAccessKey,
      },
    );
    started.push({ run, dataDir });
    while (!run.logs.some((l) => l.msg === "runner-depot serving") && run.child.exitCode === null) await pause(100);
    const serving = run.logs.find((l) => l.msg === "runner-depot serving");
    if (!serving) throw new Error(`serve did not start: ${JSON.stringify(run.logs)}`);
    const { adminToken } = JSON.parse(await readFile(path.join(dataDir, "serve.json"), "utf8")) as {
      adminToken: string;
    };
    return { url: String(serving.depotUrl), auth: { Authorization: `Bearer ${adminToken}` } };
  }

  /** Uploads `body` with its digest declared; the ETag S3 gives the object at its content address. */
  async function uploadedETag(depot: { url: string; auth: Record<string, string> }, body: Buffer, name: string) {
    const id = await openTransaction(depot.url, `${name}@1.0.0`, depot.auth);
    const added = await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { ...depot.auth, "Pkg-Path": "big.bin", "Content-Digest": httpDigest(body) },
      body: body as BodyInit,
    });
    expect(added.status, await added.clone().text()).toBe(201);
    const hex = createHash("sha256").update(body).digest("hex");
    const head = await s3.client.send(new HeadObjectCommand({ Bucket: s3.bucket, Key: `sha256/${hex}` }));
    expect(head.ContentLength).toBe(body.length);
    return head.ETag ?? "";
  }

  it("with the flag declared bodies go by multipart upload (checked by the depot); without it in one PutObject", async () => {
    const size = 9 * 1024 * 1024 + 5; // over one 8 MiB part
    const checked = await uploadedETag(await serve([]), patternBytes(size, 31), "checked");
    expect(checked).not.toMatch(/-\d+"?$/);
    const unchecked = await uploadedETag(await serve(["--s3-no-payload-check"]), patternBytes(size, 32), "unchecked");
    expect(unchecked).toMatch(/-2"?$/);
  }, 120_000);
});
