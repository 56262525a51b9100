/**
 * How a blob's bytes reach S3 (the S3 blob store's `putBlob`), by the cheapest way that never lets a wrong body
 * sit at a content-addressed key:
 * - a body of at most one part: gathered, hashed, and sent in one `PutObject` to `sha256/<hex>`;
 * - a declared digest with a known size: streamed in one `PutObject` straight to `sha256/<hex>`, its signed
 *   payload hash (`x-amz-content-sha256`) set to the digest, so the server refuses a body that does not match;
 * - otherwise a multipart upload, each part's payload hash signed and checked by the server: to `sha256/<hex>`
 *   when declared (completed only once the depot's own hash matched), to `tmp/<uuid>` when not, then copied
 *   server-side to its content address.
 * Why: docs/decisions/depot-blob-uploads.md.
 */
import { createHash, randomUUID } from "node:crypto";
import { Readable } from "node:stream";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import type { S3Client } from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import type { BlobInfo, PutBlobOptions } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import { errorName, isS3Error, s3Failure } from "./errors.js";

/** S3's limit on one `PutObject` (5 GiB); a larger declared body goes by multipart upload. */
export const MAX_SINGLE_PUT = 5 * 1024 ** 3;

/** What an upload needs of its store. */
export interface UploadContext {
  client: S3Client;
  bucket: string;
  /** The blob's content-addressed key. */
  keyOf(hex: string): string;
  /** A fresh key for an upload whose digest is not known yet. */
  uploadKey(): string;
  partSize: number;
  queueSize: number;
  /** Whether the server checks a signed payload hash (`x-amz-content-sha256`); see S3BlobStoreOptions. */
  serverVerifiesPayload: boolean;
  /** Server-side copy of `from` to `to` (no bytes through the depot). */
  copy(from: string, to: string, size: number): Promise<void>;
  /** The object's size, or null when absent. */
  head(key: string): Promise<number | null>;
  /** Deletes an object; absent is fine. */
  remove(key: string): Promise<void>;
}

/** The answers by which an S3 server refuses a body that does not match its declared hash or checksum. */
const PAYLOAD_REFUSALS = new Set(["XAmzContentSHA256Mismatch", "BadDigest", "InvalidDigest"]);

/**
 * Whether S3 refused the body for not matching its declared SHA-256 (the signed payload
 * hash or `x-amz-checksum-sha256`). O(1).
 *
 * @example
 * isPayloadRefusal({ name: "XAmzContentSHA256Mismatch", $metadata: {} }) // true
 */
export function isPayloadRefusal(error: unknown): boolean {
  return isS3Error(error) && PAYLOAD_REFUSALS.has(errorName(error));
}

/** Stores `body` in S3 as described in the module comment. O(size) time; memory O(partSize × queueSize). */
export async function uploadBlob(
  ctx: UploadContext,
  body: AsyncIterable<Uint8Array>,
  options: PutBlobOptions,
): Promise<BlobInfo> {
  const { expectedDigest, maxBytes, size } = options;
  let expectedHex: string | null = null;
  if (expectedDigest !== undefined) {
    expectedHex = /^sha256:([0-9a-f]{64})$/.exec(expectedDigest)?.[1] ?? null;
    if (!expectedHex) throw new RunnerDepotError("DIGEST_MISMATCH", `not a sha256 digest: ${expectedDigest}`);
  }
  if (size !== undefined) {
    if (!Number.isSafeInteger(size) || size < 0) throw new RunnerDepotError("BAD_REQUEST", `bad body size ${size}`);
    if (maxBytes !== undefined && size > maxBytes)
      throw new RunnerDepotError("TOO_LARGE", `blob is ${size} bytes, more than ${maxBytes}`);
  }
  const counter = new BodyCounter(options);
  if (expectedHex && size !== undefined && size > ctx.partSize && size <= MAX_SINGLE_PUT && ctx.serverVerifiesPayload)
    return putStreamed(ctx, counter.count(body), expectedHex, size);

  // Gather up to one part: a small body goes whole in one PutObject, after the depot hashed it.
  const iterator = counter.count(body)[Symbol.asyncIterator]();
  const head: Uint8Array[] = [];
  let headBytes = 0;
  let ended = false;
  try {
    while (headBytes <= ctx.partSize && (size === undefined || size <= ctx.partSize)) {
      const next = await iterator.next();
      if (next.done) {
        ended = true;
        break;
      }
      head.push(next.value);
      headBytes += next.value.byteLength;
    }
  } catch (error) {
    await iterator.return?.(undefined);
    throw error;
  }
  if (ended) {
    const bytes = Buffer.concat(head, headBytes);
    const hex = createHash("sha256").update(bytes).digest("hex");
    if (expectedHex && hex !== expectedHex)
      throw new RunnerDepotError("DIGEST_MISMATCH", `body hashes to sha256:${hex}, not ${expectedDigest}`);
    await putWhole(ctx, bytes, hex);
    return { digest: `sha256:${hex}`, size: bytes.byteLength };
  }
  const rest = (async function* () {
    yield* head;
    for (;;) {
      const next = await iterator.next();
      if (next.done) return;
      yield next.value;
    }
  })();
  return putMultipart(ctx, rest, expectedHex);
}

/**
 * Counts a body's bytes against `maxBytes` and the declared `size` (TOO_LARGE, BAD_REQUEST
 * as soon as either is passed, and at the end when it falls short of `size`). With a
 * declared size, each chunk is passed on only once the next arrived and the last only once
 * the body ended at that size: a request sized by it never gets all its bytes from a body
 * that turns out longer, so the server completes nothing.
 */
class BodyCounter {
  bytes = 0;
  constructor(private readonly options: PutBlobOptions) {}

  async *count(body: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
    const { maxBytes, size } = this.options;
    let held: Uint8Array | undefined;
    for await (const chunk of body) {
      this.bytes += chunk.byteLength;
      if (maxBytes !== undefined && this.bytes > maxBytes)
        throw new RunnerDepotError("TOO_LARGE", `blob is larger than ${maxBytes} bytes`);
      if (size !== undefined && this.bytes > size)
        throw new RunnerDepotError("BAD_REQUEST", `body is longer than its declared ${size} bytes`);
      if (size === undefined) yield chunk;
      else {
        if (held) yield held;
        held = chunk;
      }
    }
    if (size !== undefined && this.bytes !== size)
      throw new RunnerDepotError("BAD_REQUEST", `body is ${this.bytes} bytes, not its declared ${size}`);
    if (held) yield held;
  }
}

/**
 * A `PutObject` of `sha256/<hex>` whose signed payload hash is `hex` (and whose
 * `x-amz-checksum-sha256` is the same digest, for servers that check that instead): the
 * server hashes the body as it arrives and stores nothing unless it matches.
 */
function declaredPut(ctx: UploadContext, hex: string, body: Buffer | Readable, size: number): PutObjectCommand {
  const command = new PutObjectCommand({
    Bucket: ctx.bucket,
    Key: ctx.keyOf(hex),
    Body: body,
    ContentLength: size,
    ChecksumSHA256: Buffer.from(hex, "hex").toString("base64"),
  });
  // The signer takes a payload hash already set (it hashes nothing itself then): S3 checks it.
  command.middlewareStack.add(
    (next) => async (args) => {
      (args.request as { headers: Record<string, string> }).headers["x-amz-content-sha256"] = hex;
      return next(args);
    },
    { step: "build", name: "runnerDepotDeclaredPayloadHash" },
  );
  return command;
}

/** A whole small body the depot hashed: one PutObject (retried by the SDK as any request). */
async function putWhole(ctx: UploadContext, bytes: Buffer, hex: string): Promise<void> {
  try {
    await ctx.client.send(declaredPut(ctx, hex, bytes, bytes.byteLength));
  } catch (error) {
    if (isPayloadRefusal(error))
      throw new RunnerDepotError("STORE_UNAVAILABLE", "S3 refused bytes the depot hashed itself", { cause: error });
    throw s3Failure(error, "STORE_UNAVAILABLE");
  }
}

/**
 * A declared body of known size streamed straight to its content address; the server
 * checks it against the digest, so the depot does not hash it. A stream is never retried
 * by the SDK (it cannot be replayed): a failure is the upload's.
 */
async function putStreamed(
  ctx: UploadContext,
  body: AsyncGenerator<Uint8Array>,
  hex: string,
  size: number,
): Promise<BlobInfo> {
  let refusal: unknown;
  // A body that fails mid-way aborts the request: the SDK would otherwise wait for an
  // answer the server holds back until the rest of Content-Length arrives.
  const abort = new AbortController();
  const guarded = (async function* () {
    try {
      yield* body;
    } catch (error) {
      refusal = error;
      abort.abort(error);
      throw error;
    }
  })();
  const stream = Readable.from(guarded, { objectMode: false });
  // The failure is `refusal`'s, thrown below; the SDK may have stopped listening by then.
  stream.on("error", () => {});
  try {
    await ctx.client.send(declaredPut(ctx, hex, stream, size), { abortSignal: abort.signal });
  } catch (error) {
    if (refusal) throw refusal;
    if (isPayloadRefusal(error))
      throw new RunnerDepotError("DIGEST_MISMATCH", `S3 found the body does not hash to sha256:${hex}`, {
        cause: error,
      });
    if (!isS3Error(error) && !(error instanceof RunnerDepotError)) throw error;
    throw s3Failure(error, "STORE_UNAVAILABLE");
  }
  return { digest: `sha256:${hex}`, size };
}

/**
 * A multipart upload (lib-storage: parts are buffers whose payload hash the SDK signs and
 * the server checks), hashed by the depot as it streams. Declared: to its content address,
 * failing before the last part so the upload never completes on a mismatch. Undeclared: to
 * a fresh upload key, then a server-side copy to its content address (none when the bytes
 * are stored already) and the upload key deleted.
 */
async function putMultipart(
  ctx: UploadContext,
  body: AsyncIterable<Uint8Array>,
  expectedHex: string | null,
): Promise<BlobInfo> {
  const hash = createHash("sha256");
  let size = 0;
  let digestHex = "";
  let refusal: unknown;
  async function* checked(): AsyncGenerator<Uint8Array> {
    try {
      for await (const chunk of body) {
        size += chunk.byteLength;
        hash.update(chunk);
        yield chunk;
      }
    } catch (error) {
      refusal = error;
      throw error;
    }
    digestHex = hash.digest("hex");
    // Failing here, before the stream ends, keeps the upload from completing.
    if (expectedHex && digestHex !== expectedHex) {
      refusal = new RunnerDepotError(
        "DIGEST_MISMATCH",
        `body hashes to sha256:${digestHex}, not sha256:${expectedHex}`,
      );
      throw refusal;
    }
  }
  const target = expectedHex ? ctx.keyOf(expectedHex) : ctx.uploadKey();
  try {
    const upload = new Upload({
      client: ctx.client,
      params: { Bucket: ctx.bucket, Key: target, Body: Readable.from(checked(), { objectMode: false }) },
      partSize: ctx.partSize,
      queueSize: ctx.queueSize,
      leavePartsOnError: false,
    });
    await upload.done();
  } catch (error) {
    if (!expectedHex) await ctx.remove(target).catch(() => {});
    if (refusal) throw refusal;
    if (error instanceof RunnerDepotError) throw error;
    // The body's own failure (a client hung up) passes through unchanged.
    if (!isS3Error(error)) throw error;
    throw s3Failure(error, "STORE_UNAVAILABLE");
  }
  if (expectedHex) return { digest: `sha256:${expectedHex}`, size };
  const finalKey = ctx.keyOf(digestHex);
  try {
    if ((await ctx.head(finalKey)) === null) await ctx.copy(target, finalKey, size);
  } catch (error) {
    throw s3Failure(error, "STORE_UNAVAILABLE");
  } finally {
    await ctx.remove(target).catch(() => {});
  }
  return { digest: `sha256:${digestHex}`, size };
}

/** A fresh upload key under `prefix` (for {@link UploadContext.uploadKey}). */
export const uploadKeyUnder = (prefix: string) => () => `${prefix}tmp/${randomUUID()}`;
