/**
 * `runner-depot mirror` into a configured store: with serve's store flags (`--postgres`, `--s3-bucket`,
 * `--s3-endpoint`) the copy lands in PostgreSQL records and S3 blobs (s3rver in its own process), and a depot on
 * that store serves the upstream's feed and versions.
 */
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { bundleCli, runBundledCli } from "../../fixtures/cli-bundle.js";
import { createTestSchema, needs, POSTGRES_URL, startS3, type S3Fixture } from "../../fixtures/backends.js";
import { publish, startDepot, tempDir } from "../../fixtures/depot.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";

const haveDatabase = needs("postgres");

describe("runner-depot mirror into PostgreSQL + S3", () => {
  const cleanups: Array<() => Promise<unknown>> = [];
  let cli = "";
  let s3: S3Fixture;
  let db: Awaited<ReturnType<typeof createTestSchema>>;
  beforeAll(async () => {
    if (!haveDatabase) return;
    const built = await bundleCli();
    cleanups.push(built.remove);
    cli = built.file;
    s3 = await startS3();
    cleanups.push(() => s3.close());
    db = await createTestSchema();
    cleanups.push(() => db.drop());
    // A resident object keeps s3rver's tmp/ directory alive (see feed-on-postgres-s3.test.ts).
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: "tmp/.keep", Body: "" }));
  }, 120_000);
  afterAll(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  it("copies every version into the store the flags name, and a depot on it serves the same feed", async () => {
    const tmp = await tempDir("cli-mirror-pg-");
    cleanups.push(tmp.cleanup);
    const up = await startDepot(createFsStore(`${tmp.dir}/up`, { unsafeNoSync: true }));
    cleanups.push(() => up.close());
    for (let i = 0; i < 4; i++)
      expect((await publish(up.url, `q${i % 2}@2.0.${i}`, [{ type: "file", path: "f", body: `q${i}` }])).status).toBe(
        201,
      );
    const credentials = s3.clientConfig!.credentials as { accessKeyId: string; secretAccessKey: string };
    const env = {
      ...process.env,
      AWS_ACCESS_KEY_ID: credentials.accessKeyId,
      AWS_SECRET_ACCESS_KEY: credentials.secretAccessKey,
    };
    const flags = [
      "--data",
      `${tmp.dir}/data`,
      "--postgres",
      POSTGRES_URL!,
      "--postgres-schema",
      db.schema,
      "--s3-bucket",
      s3.bucket,
      "--s3-endpoint",
      s3.endpoint,
    ];
    const done = await runBundledCli(cli, ["mirror", up.url, ...flags], tmp.dir, env);
    expect(done.code, done.err).toBe(0);
    expect(done.err).toContain("4 copied");

    const store = composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
    const local = await startDepot(store);
    cleanups.push(() => local.close());
    const feedOf = async (url: string) =>
      (
        (await (await fetch(`${url}/catalog?since=0`)).json()) as { changes: Array<{ name: string; version: string }> }
      ).changes.map((c) => `${c.name}@${c.version}`);
    expect(await feedOf(local.url)).toEqual(await feedOf(up.url));
    const [a, b] = await Promise.all([fetch(`${local.url}/data/q1@2.0.3`), fetch(`${up.url}/data/q1@2.0.3`)]);
    expect(Buffer.from(await a.arrayBuffer())).toEqual(Buffer.from(await b.arrayBuffer()));
    // A second run resumes from the position saved in that same store: nothing left to copy.
    const again = await runBundledCli(cli, ["mirror", up.url, ...flags], tmp.dir, env);
    expect([again.code, again.err]).toEqual([0, expect.stringContaining("0 copied")]);
  });
});
