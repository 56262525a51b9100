/**
 * Archived job logs on S3 (or MinIO, Ceph, s3rver): one object per job at
 * `<prefix><key>`, uploaded through `@aws-sdk/lib-storage` (a single PutObject for small
 * logs, a multipart upload past one part), read with `Range` requests.
 */
import { Readable } from "node:stream";
import {
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  S3Client,
} from "@aws-sdk/client-s3";
import type { S3ClientConfig } from "@aws-sdk/client-s3";
import { createS3Client } from "./client.js";
import { MAX_RANGE_SKIP } from "./ranges.js";
import { Upload } from "@aws-sdk/lib-storage";
import { RunnerDepotError } from "../../errors.js";
import type { LogArchiveStore } from "../../runner/ports.js";
import { isNotFound, isS3Error, s3Failure } from "./errors.js";

/** Options of {@link createS3LogArchive}. */
export interface S3LogArchiveOptions {
  /** The bucket; it must exist. */
  bucket: string;
  /** Key prefix, e.g. `job-logs/`; default none. Keep it apart from a depot's blobs. */
  prefix?: string;
  /** A configured client (the adapter never destroys a client it was given). */
  client?: S3Client;
  /** Or the configuration of a client the adapter creates (and destroys on close). */
  clientConfig?: S3ClientConfig;
  /** Multipart part size in bytes; default 8 MiB (memory held per upload: partSize × 2). */
  partSizeBytes?: number;
}

/**
 * Creates a {@link LogArchiveStore} on S3.
 *
 * @example
 * const logs = createArchivingLogStore(createPostgresLogStore({ connectionString }), {
 *   archive: createS3LogArchive({ bucket: "ci-logs", prefix: "jobs/", clientConfig: { region: "eu-west-1" } }),
 * });
 */
export function createS3LogArchive(options: S3LogArchiveOptions): LogArchiveStore {
  const { bucket } = options;
  const prefix = options.prefix ?? "";
  const ownsClient = !options.client;
  const client = options.client ?? createS3Client(options.clientConfig);
  const partSize = Math.max(5 * 1024 * 1024, options.partSizeBytes ?? 8 * 1024 * 1024);
  let closed = false;

  function live() {
    if (closed) throw new RunnerDepotError("UNAVAILABLE", "log archive closed");
  }

  return {
    async put(key, body) {
      live();
      const upload = new Upload({
        client,
        params: { Bucket: bucket, Key: prefix + key, Body: Readable.from(body, { objectMode: false }) },
        partSize,
        queueSize: 2,
        leavePartsOnError: false,
      });
      try {
        await upload.done();
      } catch (error) {
        if (error instanceof RunnerDepotError || !isS3Error(error)) throw error;
        throw storeError(error);
      }
    },

    async read(key, start, end) {
      live();
      if (end <= start) return Buffer.alloc(0);
      let out;
      try {
        out = await client.send(
          new GetObjectCommand({ Bucket: bucket, Key: prefix + key, Range: `bytes=${start}-${end - 1}` }),
        );
      } catch (error) {
        if (isNotFound(error)) return null;
        throw storeError(error);
      }
      // Some S3-compatible servers serve a wider range than asked (s3rver: the whole object
      // for `bytes=0-0`; a proxy or endpoint that ignores Range: 200 and the whole object).
      // Read only up to the asked bytes, then drop the connection: O(end - start + skip).
      const served = /^bytes (\d+)-(\d+)\//.exec(out.ContentRange ?? "");
      const from = served ? Number(served[1]) : 0;
      const body = out.Body as unknown as AsyncIterable<Uint8Array> & { destroy?: () => void };
      try {
        if (from > start) throw new RunnerDepotError("UNAVAILABLE", `S3 served bytes from ${from}, not ${start}`);
        const skip = start - from;
        if (skip > MAX_RANGE_SKIP)
          throw new RunnerDepotError(
            "UNAVAILABLE",
            `S3 ignored the Range of ${key}: it served from byte ${from}, ${skip} bytes before the ${start} asked for`,
          );
        return await takeRange(body, skip, end - start);
      } finally {
        body.destroy?.();
      }
    },

    async delete(key) {
      live();
      try {
        await client.send(new DeleteObjectCommand({ Bucket: bucket, Key: prefix + key }));
      } catch (error) {
        if (!isNotFound(error)) throw storeError(error);
      }
    },

    async prune(before) {
      live();
      // O(objects under the prefix): a listing. On S3 a bucket lifecycle rule on the prefix
      // does the same without it.
      let count = 0;
      let token: string | undefined;
      try {
        do {
          const page = await client.send(
            new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix, ContinuationToken: token }),
          );
          const old = (page.Contents ?? []).filter(
            (o) => o.Key && o.LastModified && o.LastModified.getTime() < before.getTime(),
          );
          if (old.length > 0) {
            await client.send(
              new DeleteObjectsCommand({
                Bucket: bucket,
                Delete: { Objects: old.map((o) => ({ Key: o.Key! })), Quiet: true },
              }),
            );
            count += old.length;
          }
          token = page.IsTruncated ? page.NextContinuationToken : undefined;
        } while (token);
      } catch (error) {
        throw storeError(error);
      }
      return count;
    },

    async close() {
      if (closed) return;
      closed = true;
      if (ownsClient) client.destroy();
    },
  };
}

/** Any S3 failure becomes UNAVAILABLE (the runner's code for a backend that is down), cause kept. */
const storeError = (error: unknown) => s3Failure(error, "UNAVAILABLE");

/** `length` bytes after the first `skip` of `body`, reading no further than them. O(skip + length). */
async function takeRange(body: AsyncIterable<Uint8Array>, skip: number, length: number): Promise<Buffer> {
  const out = Buffer.allocUnsafe(length);
  let seen = 0;
  let got = 0;
  for await (const chunk of body) {
    const begin = Math.max(0, skip - seen);
    seen += chunk.length;
    if (begin < chunk.length) {
      const piece = chunk.subarray(begin, begin + (length - got));
      out.set(piece, got);
      got += piece.length;
    }
    if (got === length) break;
  }
  return out.subarray(0, got);
}
