/**
 * Backends benchmark: job results published to RabbitMQ with publisher confirms (next to
 * the memory queue), and a 64 MiB package uploaded to and downloaded from the depot on
 * S3 (s3rver) + PostgreSQL (next to the filesystem store). Needs the local RabbitMQ and
 * PostgreSQL of the test setup.
 */
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createPostgresRecords } from "../src/adapters/postgres/index.js";
import { createRabbitMqQueue } from "../src/adapters/rabbitmq/index.js";
import { createS3BlobStore } from "../src/adapters/s3/index.js";
import { composeStore } from "../src/depot/store/compose.js";
import type { PackageStore } from "../src/depot/ports.js";
import type { JobResultQueue } from "../src/runner/ports.js";
import { patternBytes, sampleJobResult, sha256Digest } from "../src/testing/helpers.js";
import { createTestSchema, RABBITMQ_URL, startS3 } from "../test/fixtures/backends.js";
import { startDepot, tempDir } from "../test/fixtures/depot.js";

const RESULTS = 5000;
const FILE_BYTES = 64 * 1024 * 1024;

async function publishRate(queue: JobResultQueue, inFlight: number): Promise<number> {
  const results = Array.from({ length: RESULTS }, () => sampleJobResult());
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < results.length) await queue.publishJobResult(results[next++]!);
    }),
  );
  return RESULTS / ((performance.now() - t0) / 1000);
}

interface Transfer {
  upload: number;
  commit: number;
  download: number;
}

/** MB/s of one 64 MiB file: POST /add, POST /commit, GET /data (redirects followed). */
async function depotTransfer(store: PackageStore): Promise<Transfer> {
  const depot = await startDepot(store);
  try {
    const body = patternBytes(FILE_BYTES, 99);
    const open = await fetch(`${depot.url}/trans/bench@1.0.0`, { method: "POST" });
    const { transaction } = (await open.json()) as { transaction: string };
    let t0 = performance.now();
    const added = await fetch(`${depot.url}/add/${transaction}/file`, {
      method: "POST",
      headers: { "Pkg-Path": "data.bin" },
      body: body as unknown as BodyInit,
    });
    if (added.status !== 201) throw new Error(`add: ${added.status} ${await added.text()}`);
    const upload = performance.now() - t0;
    t0 = performance.now();
    const commit = await fetch(`${depot.url}/commit/${transaction}`, { method: "POST" });
    if (commit.status !== 201) throw new Error(`commit: ${commit.status} ${await commit.text()}`);
    const { digest } = (await commit.json()) as { digest: string };
    const committed = performance.now() - t0;
    t0 = performance.now();
    const response = await fetch(`${depot.url}/data/bench@1.0.0`);
    const bytes = new Uint8Array(await response.arrayBuffer());
    const download = performance.now() - t0;
    if (sha256Digest(bytes) !== digest) throw new Error("downloaded archive does not match its digest");
    const mb = FILE_BYTES / 1e6;
    return { upload: mb / (upload / 1000), commit: mb / (committed / 1000), download: mb / (download / 1000) };
  } finally {
    await depot.close();
  }
}

const fmt = (n: number) => (n >= 100 ? n.toFixed(0) : n.toFixed(1));

/** Runs the benchmark; returns its Markdown section. */
export async function run(): Promise<string> {
  // Queue: RabbitMQ with confirms vs memory, one at a time and 64 in flight.
  const queueName = `rd-bench-${randomUUID()}`;
  const rabbit = createRabbitMqQueue({ url: RABBITMQ_URL, queue: queueName, queueArguments: { "x-expires": 60_000 } });
  const memory = createMemoryQueue();
  await rabbit.ready();
  const rows: string[] = [];
  for (const inFlight of [1, 64]) {
    const mem = await publishRate(memory, inFlight);
    const rmq = await publishRate(rabbit, inFlight);
    rows.push(
      `| publish job results, ${inFlight} in flight | ${fmt(rmq)} results/s | memory queue ${fmt(mem)} results/s | ${(rmq / mem).toFixed(3)} |`,
    );
  }
  await rabbit.close();
  await memory.close?.();

  // Depot: S3 (s3rver, in-process) + PostgreSQL vs the filesystem store.
  const s3 = await startS3();
  const db = await createTestSchema();
  const dir = await tempDir();
  try {
    const fs = await depotTransfer(createFsStore(dir.dir));
    const composed = composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix: "bench/", clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
    const cloud = await depotTransfer(composed);
    await composed.close?.();
    for (const key of ["upload", "commit", "download"] as const) {
      const what = {
        upload: "upload (POST /add)",
        commit: "commit (archive build)",
        download: "download (GET /data → 302 → S3)",
      }[key];
      rows.push(
        `| depot ${what}, 64 MiB | ${fmt(cloud[key])} MB/s | fs store ${fmt(fs[key])} MB/s | ${(cloud[key] / fs[key]).toFixed(2)} |`,
      );
    }
  } finally {
    await dir.cleanup();
    await db.drop();
    await s3.close();
  }

  return [
    "## Backends: RabbitMQ queue, depot on S3 + PostgreSQL",
    "",
    `Method: ${RESULTS} job results published through \`createRabbitMqQueue\` (persistent, publisher confirms, local RabbitMQ) ` +
      "and through `createMemoryQueue`, with 1 and 64 publishes in flight; one 64 MiB file published to and downloaded from " +
      "the depot over real HTTP on `composeStore(S3 blobs on in-process s3rver, PostgreSQL records)` and on `createFsStore`. " +
      "s3rver writes to local disk, so the S3 figures measure the adapter's overhead (temp object, copy, signed redirect), not a network.",
    "",
    "| case | ours | peer | ratio |",
    "|---|---|---|---|",
    ...rows,
  ].join("\n");
}
