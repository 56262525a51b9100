/**
 * What signed versions cost (issue 26): a 256 MiB publish with `sign` against the same
 * publish without, and an install under `require` against one under `ignore`, through a
 * real depot (servePackageRouter over the fs store, in this process) and the client. Two
 * shapes: one 256 MiB file, and 4,096 files of 64 KiB (the statement names every file, so
 * its cost follows the file count). Signed and unsigned turns alternate within each round,
 * each publish on bytes new to the store, so the shared machine's load falls alike on both.
 */
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createDepotClient } from "../src/depot/client/depot-client.js";
import { createPackageRouter } from "../src/depot/server/router.js";
import { servePackageRouter } from "../src/depot/server/serve.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../src/depot/signing/keys.js";

const MiB = 2 ** 20;
/** 256 MiB; BENCH_FILE_MIB overrides it for a quick trial (the report states the size used). */
const TOTAL = (Number(process.env.BENCH_FILE_MIB) || 256) * MiB;
const ROUNDS = 5;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

/** Writes `files` files totalling TOTAL bytes under `dir`, each starting with `tag` so its bytes are new. */
async function fill(dir: string, files: number, tag: Buffer, body: Buffer): Promise<void> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const size = TOTAL / files;
  for (let i = 0; i < files; i++) {
    const bytes = Buffer.from(body.subarray(i * size, (i + 1) * size));
    tag.copy(bytes, 0);
    bytes.writeUInt32BE(i, tag.length);
    await writeFile(path.join(dir, `f${String(i).padStart(5, "0")}`), bytes);
  }
}

export async function run(): Promise<string> {
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-signing-"));
  const key = generateSigningKey();
  const trustedKeys = { keys: [trustedKeyEntry(key)] };
  const store = createFsStore(path.join(work, "store"), { unsafeNoSync: true });
  const server = await servePackageRouter(createPackageRouter(store, { trustedKeys }), { host: "127.0.0.1", port: 0 });
  const client = createDepotClient({ baseUrl: server.url });
  const body = randomBytes(TOTAL);
  const rows: string[] = [];
  const loadBefore = os.loadavg()[0]!;
  try {
    for (const files of [1, 4096]) {
      const times = { plain: [] as number[], signed: [] as number[], ignore: [] as number[], require: [] as number[] };
      const ratios = { publish: [] as number[], install: [] as number[] };
      for (let round = 0; round < ROUNDS; round++) {
        const cost: Record<string, number> = {};
        // Alternate which goes first, round by round.
        const order = round % 2 === 0 ? (["plain", "signed"] as const) : (["signed", "plain"] as const);
        for (const kind of order) {
          const src = path.join(work, `src-${kind}`);
          await fill(src, files, randomBytes(8), body);
          const version = `${files}.${round}.0-${kind}`;
          cost[kind] = await timed(() =>
            client.publish({
              name: "big",
              version,
              dir: src,
              byReference: false,
              ...(kind === "signed" ? { sign: signingKeyFromPem(key.privateKey) } : {}),
            }),
          );
          times[kind].push(cost[kind]!);
        }
        const spec = `big@${files}.${round}.0-signed`;
        for (const policy of round % 2 === 0 ? (["ignore", "require"] as const) : (["require", "ignore"] as const)) {
          const target = path.join(work, `install-${policy}`);
          await rm(target, { recursive: true, force: true });
          cost[policy] = await timed(() => client.install(spec, target, { signatures: { policy, trustedKeys } }));
          times[policy].push(cost[policy]!);
        }
        ratios.publish.push(cost.signed! / cost.plain!);
        ratios.install.push(cost.require! / cost.ignore!);
      }
      const shape =
        files === 1
          ? `one ${TOTAL / MiB} MiB file`
          : `${files.toLocaleString("en")} files of ${TOTAL / files / 1024} KiB`;
      const pct = (r: number) => `${((r - 1) * 100).toFixed(1)} %`;
      rows.push(
        `| publish, ${shape}: \`sign\` | ${(median(times.signed) / 1000).toFixed(2)} s | unsigned publish | ${(median(times.plain) / 1000).toFixed(2)} s | ${median(ratios.publish).toFixed(3)} (${pct(median(ratios.publish))}) | ≤ 1.05 |`,
        `| install, ${shape}: policy \`require\` | ${(median(times.require) / 1000).toFixed(2)} s | policy \`ignore\` | ${(median(times.ignore) / 1000).toFixed(2)} s | ${median(ratios.install).toFixed(3)} (${pct(median(ratios.install))}) | ≤ 1.05 |`,
      );
    }
  } finally {
    await server.close();
    await store.close?.();
    await rm(work, { recursive: true, force: true });
  }
  return [
    "## Depot: signing and verifying a 256 MiB version",
    "",
    `Method: \`servePackageRouter\` over \`createFsStore\` (fsync off, so the disk's flushes do not drown the difference) in this process, the client publishing from a folder with \`byReference: false\` (every byte sent) and installing into an empty folder. A signed publish adds reading the version and its manifest back, an Ed25519 signature over the in-toto statement and \`POST /attestations\` (the depot verifies it against the manifest); an install under \`require\` adds \`GET /attestations\` and the check of every file's digest against the statement. In each of ${ROUNDS} rounds the signed and unsigned turns alternate in order, each publish on bytes new to the store; figures are medians, the ratio the median over rounds of signed ÷ unsigned in the same round. 2 cores shared with other work: 1-minute load average ${loadBefore.toFixed(1)} before, ${os.loadavg()[0]!.toFixed(1)} after, so wall times are noisy; the ratios are the figures to read.`,
    "",
    "| operation | signed / verified | peer | peer | ratio | aim |",
    "|---|---:|---|---:|---:|---|",
    ...rows,
  ].join("\n");
}
