/**
 * Probes which S3 integrity and write features a server really verifies, for
 * docs/decisions/s3-servers.md: `x-amz-checksum-sha256`, `Content-MD5`, a signed
 * `x-amz-content-sha256` that does not match the body, multipart (with per-part SHA-256
 * checksums), `If-None-Match: *` on PUT, and CopyObject. "Verified" means a wrong value is
 * refused and leaves no object behind; "ignored" means a wrong value is stored anyway.
 *
 *   npx tsx scripts/s3-features.ts            s3rver (its own process), and the server
 *                                             RUNNER_DEPOT_TEST_S3 names when set
 *
 * bench/s3-servers.ts prints the same table into BENCHMARKS.md.
 */
import { createHash, randomUUID } from "node:crypto";
import {
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  GetObjectCommand,
  HeadObjectCommand,
  PutObjectCommand,
  UploadPartCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import { startExternalS3, startS3rver, type S3Fixture } from "../test/fixtures/backends.js";

/** One feature's verdict on one server: a short word and what was seen. */
export interface Verdict {
  verdict: "verified" | "ignored" | "works" | "refused" | "unsupported";
  seen: string;
}

/** The probes, in table order: the feature's name and how to try it. */
const PROBES: { feature: string; probe: (c: Ctx) => Promise<Verdict> }[] = [
  { feature: "`x-amz-checksum-sha256` on PutObject", probe: checksumSha256 },
  { feature: "`Content-MD5` on PutObject", probe: contentMd5 },
  { feature: "signed `x-amz-content-sha256` ≠ body", probe: contentSha256Mismatch },
  { feature: "multipart upload (5 MiB + 1 KiB)", probe: multipart },
  { feature: "multipart, `x-amz-checksum-sha256` per part", probe: multipartPartChecksum },
  { feature: "`If-None-Match: *` on PutObject", probe: ifNoneMatch },
  { feature: "CopyObject (1 MiB)", probe: copyObject },
];

interface Ctx {
  client: S3Client;
  bucket: string;
  key(): string;
}

const sha256 = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest();
const md5 = (bytes: Uint8Array) => createHash("md5").update(bytes).digest();

/** The HTTP status and S3 error code of a failed request, e.g. `400 BadDigest`. */
function failure(error: unknown): string {
  const e = error as { $metadata?: { httpStatusCode?: number }; Code?: string; name?: string; message?: string };
  return `${e.$metadata?.httpStatusCode ?? "?"} ${e.Code ?? e.name ?? e.message ?? "error"}`;
}

async function exists(c: Ctx, key: string): Promise<boolean> {
  try {
    await c.client.send(new HeadObjectCommand({ Bucket: c.bucket, Key: key }));
    return true;
  } catch {
    return false;
  }
}

/** Puts with a right value (must pass), then a wrong one: refused and absent is "verified". */
async function rightThenWrong(c: Ctx, put: (key: string, right: boolean) => Promise<unknown>): Promise<Verdict> {
  try {
    await put(c.key(), true);
  } catch (error) {
    return { verdict: "unsupported", seen: `the right value is refused: ${failure(error)}` };
  }
  const key = c.key();
  try {
    await put(key, false);
  } catch (error) {
    const left = (await exists(c, key)) ? ", but the object is there" : "";
    return { verdict: left ? "ignored" : "verified", seen: `wrong value: ${failure(error)}${left}` };
  }
  return { verdict: "ignored", seen: "wrong value: 200, stored" };
}

async function checksumSha256(c: Ctx): Promise<Verdict> {
  const body = Buffer.from(`checksum ${randomUUID()}`);
  const out = await rightThenWrong(c, (Key, right) =>
    c.client.send(
      new PutObjectCommand({
        Bucket: c.bucket,
        Key,
        Body: body,
        ChecksumSHA256: sha256(right ? body : Buffer.from("other")).toString("base64"),
      }),
    ),
  );
  if (out.verdict !== "verified") return out;
  // Whether the server keeps it for HeadObject (x-amz-checksum-mode: ENABLED).
  const key = c.key();
  await c.client.send(
    new PutObjectCommand({ Bucket: c.bucket, Key: key, Body: body, ChecksumSHA256: sha256(body).toString("base64") }),
  );
  const head = await c.client.send(new HeadObjectCommand({ Bucket: c.bucket, Key: key, ChecksumMode: "ENABLED" }));
  return { ...out, seen: `${out.seen}; HeadObject returns it: ${head.ChecksumSHA256 ? "yes" : "no"}` };
}

async function contentMd5(c: Ctx): Promise<Verdict> {
  const body = Buffer.from(`md5 ${randomUUID()}`);
  return rightThenWrong(c, (Key, right) =>
    c.client.send(
      new PutObjectCommand({
        Bucket: c.bucket,
        Key,
        Body: body,
        ContentMD5: md5(right ? body : Buffer.from("other")).toString("base64"),
      }),
    ),
  );
}

/**
 * The SigV4 signer takes an `x-amz-content-sha256` already on the request as the payload's
 * hash; set before signing to the hash of other bytes, the signature is valid and the body
 * is not what it claims.
 */
async function contentSha256Mismatch(c: Ctx): Promise<Verdict> {
  const body = Buffer.from(`payload ${randomUUID()}`);
  return rightThenWrong(c, (Key, right) => {
    const command = new PutObjectCommand({ Bucket: c.bucket, Key, Body: body });
    command.middlewareStack.add(
      (next) => async (args) => {
        const request = args.request as { headers: Record<string, string> };
        request.headers["x-amz-content-sha256"] = sha256(right ? body : Buffer.from("other")).toString("hex");
        return next(args);
      },
      { step: "build", name: "forgePayloadHash" },
    );
    return c.client.send(command);
  });
}

async function multipart(c: Ctx): Promise<Verdict> {
  const key = c.key();
  const parts = [Buffer.alloc(5 * 1024 * 1024, 7), Buffer.alloc(1024, 8)];
  try {
    const { UploadId } = await c.client.send(new CreateMultipartUploadCommand({ Bucket: c.bucket, Key: key }));
    const done = [];
    for (const [i, Body] of parts.entries()) {
      const out = await c.client.send(
        new UploadPartCommand({ Bucket: c.bucket, Key: key, UploadId, PartNumber: i + 1, Body }),
      );
      done.push({ PartNumber: i + 1, ETag: out.ETag });
    }
    const out = await c.client.send(
      new CompleteMultipartUploadCommand({ Bucket: c.bucket, Key: key, UploadId, MultipartUpload: { Parts: done } }),
    );
    const got = await c.client.send(new GetObjectCommand({ Bucket: c.bucket, Key: key }));
    const bytes = Buffer.from(await got.Body!.transformToByteArray());
    const same = bytes.equals(Buffer.concat(parts));
    return { verdict: same ? "works" : "refused", seen: `ETag ${out.ETag}; bytes back ${same ? "equal" : "differ"}` };
  } catch (error) {
    return { verdict: "unsupported", seen: failure(error) };
  }
}

async function multipartPartChecksum(c: Ctx): Promise<Verdict> {
  const body = Buffer.alloc(5 * 1024 * 1024, 9);
  return rightThenWrong(c, async (key, right) => {
    const { UploadId } = await c.client.send(
      new CreateMultipartUploadCommand({ Bucket: c.bucket, Key: key, ChecksumAlgorithm: "SHA256" }),
    );
    const part = await c.client.send(
      new UploadPartCommand({
        Bucket: c.bucket,
        Key: key,
        UploadId,
        PartNumber: 1,
        Body: body,
        ChecksumSHA256: sha256(right ? body : Buffer.from("other")).toString("base64"),
      }),
    );
    await c.client.send(
      new CompleteMultipartUploadCommand({
        Bucket: c.bucket,
        Key: key,
        UploadId,
        MultipartUpload: { Parts: [{ PartNumber: 1, ETag: part.ETag, ChecksumSHA256: part.ChecksumSHA256 }] },
      }),
    );
  });
}

async function ifNoneMatch(c: Ctx): Promise<Verdict> {
  const key = c.key();
  const put = (body: string) =>
    c.client.send(new PutObjectCommand({ Bucket: c.bucket, Key: key, Body: Buffer.from(body), IfNoneMatch: "*" }));
  try {
    await put("first");
  } catch (error) {
    return { verdict: "unsupported", seen: `on a new key: ${failure(error)}` };
  }
  try {
    await put("second");
  } catch (error) {
    return { verdict: "verified", seen: `on an existing key: ${failure(error)}` };
  }
  const got = await c.client.send(new GetObjectCommand({ Bucket: c.bucket, Key: key }));
  return { verdict: "ignored", seen: `on an existing key: 200, now "${await got.Body!.transformToString()}"` };
}

async function copyObject(c: Ctx): Promise<Verdict> {
  const from = c.key();
  const to = c.key();
  const body = Buffer.alloc(1024 * 1024, 3);
  try {
    await c.client.send(new PutObjectCommand({ Bucket: c.bucket, Key: from, Body: body }));
    await c.client.send(new CopyObjectCommand({ Bucket: c.bucket, Key: to, CopySource: `${c.bucket}/${from}` }));
    const got = await c.client.send(new GetObjectCommand({ Bucket: c.bucket, Key: to }));
    const same = Buffer.from(await got.Body!.transformToByteArray()).equals(body);
    return { verdict: same ? "works" : "refused", seen: `bytes back ${same ? "equal" : "differ"}` };
  } catch (error) {
    return { verdict: "unsupported", seen: failure(error) };
  }
}

/** Runs every probe on one server's bucket; the verdicts in table order. */
export async function probeFeatures(s3: S3Fixture): Promise<Verdict[]> {
  const prefix = `features-${randomUUID()}/`;
  let n = 0;
  const ctx: Ctx = { client: s3.client, bucket: s3.bucket, key: () => `${prefix}${n++}` };
  const verdicts: Verdict[] = [];
  for (const { probe } of PROBES)
    verdicts.push(await probe(ctx).catch((e) => ({ verdict: "unsupported", seen: failure(e) }) as Verdict));
  return verdicts;
}

/** The Markdown table: a row per feature, a column per server. */
export function featureTable(servers: { name: string; verdicts: Verdict[] }[]): string {
  const head = `| feature | ${servers.map((s) => s.name).join(" | ")} |`;
  const rule = `|---|${servers.map(() => "---").join("|")}|`;
  const rows = PROBES.map(
    ({ feature }, i) =>
      `| ${feature} | ${servers.map((s) => `**${s.verdicts[i]!.verdict}**: ${s.verdicts[i]!.seen}`).join(" | ")} |`,
  );
  return [head, rule, ...rows].join("\n");
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const servers: { name: string; verdicts: Verdict[] }[] = [];
  const s3rver = await startS3rver();
  try {
    servers.push({ name: "s3rver", verdicts: await probeFeatures(s3rver) });
  } finally {
    await s3rver.close();
  }
  const external = await startExternalS3();
  if (external) {
    try {
      servers.push({ name: `RUNNER_DEPOT_TEST_S3 (${external.endpoint})`, verdicts: await probeFeatures(external) });
    } finally {
      await external.close();
    }
  }
  console.log(featureTable(servers));
}
