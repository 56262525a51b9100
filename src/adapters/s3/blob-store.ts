/**
 * Depot blobs on S3 (or anything speaking its API: MinIO, Ceph, s3rver). Objects are
 * content-addressed at `<prefix>sha256/<hex>`; how a body gets there is blob-upload.ts.
 * Nothing is buffered beyond one upload's parts.
 * Why: docs/decisions/backends.md, "blob-store.ts: how S3 uploads stay content-addressed",
 * and docs/decisions/depot-blob-uploads.md.
 */
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  S3Client,
  UploadPartCopyCommand,
} from "@aws-sdk/client-s3";
import type { S3ClientConfig } from "@aws-sdk/client-s3";
import { createS3Client } from "./client.js";
import { MAX_RANGE_SKIP } from "./ranges.js";
import { getSignedUrl } from "@aws-sdk/s3-request-presigner";
import { RunnerDepotError } from "../../errors.js";
import type { BlobInfo, BlobStore, ByteRange, PutBlobOptions } from "../../depot/ports.js";
import { errorName, isNotFound, s3Failure } from "./errors.js";
import { uploadBlob, uploadKeyUnder, type UploadContext } from "./blob-upload.js";
import { createUploadSpool } from "./upload-spool.js";

/** Options of {@link createS3BlobStore}. */
export interface S3BlobStoreOptions {
  /** The bucket; it must exist. */
  bucket: string;
  /** Key prefix, e.g. `depot/`; default none. */
  prefix?: string;
  /** A configured client (the adapter never destroys a client it was given). */
  client?: S3Client;
  /** Or the configuration of a client the adapter creates (and destroys on close). */
  clientConfig?: S3ClientConfig;
  /** Multipart part size in bytes; default 8 MiB (S3's minimum is 5 MiB). */
  partSizeBytes?: number;
  /** Parts uploaded in parallel; default 4 (memory held: partSize × queueSize). */
  queueSize?: number;
  /** Default lifetime of signed URLs in seconds; default 300. */
  signedUrlExpiresInSeconds?: number;
  /** Part size of server-side copies of blobs over 5 GiB (S3's CopyObject limit); default 512 MiB. */
  copyPartBytes?: number;
  /** Keys per ListObjectsV2 page in `listBlobs`; default the server's (1 000 on S3). */
  listPageSize?: number;
  /**
   * Whether the server checks a request's signed payload hash (`x-amz-content-sha256`)
   * against the body and stores nothing on a mismatch, as AWS S3, MinIO and Ceph radosgw
   * do; default true. Then a declared digest of known size (`putBlob`'s `expectedDigest`
   * and `size`) streams in one `PutObject` straight to its content address, unhashed by
   * the depot. Set false for a server that does not (s3rver): such a body then goes by
   * multipart upload, completed only once the depot's own hash matched.
   */
  serverVerifiesPayload?: boolean;
  /**
   * Bytes of local copies kept of the blobs this process uploaded (upload-spool.ts), so a
   * commit hashes its items from the page cache, not read back from S3; default 1 GiB,
   * 0 keeps none. The copies live in a directory of their own under `spoolDir`
   * (default the OS temp dir), removed by `close()`.
   */
  spoolBytes?: number;
  /** Where the local copies' directory is made; default the OS temp dir. */
  spoolDir?: string;
}

const HEX = /^[0-9a-f]{64}$/;
const MAX_SINGLE_COPY = 5 * 1024 ** 3;

/**
 * Creates a {@link BlobStore} on S3.
 *
 * @example
 * const blobs = createS3BlobStore({
 *   bucket: "depot",
 *   clientConfig: { region: "eu-west-1" },
 * });
 * const store = composeStore({ blobs, records: createPostgresRecords({ connectionString }) });
 */
export function createS3BlobStore(options: S3BlobStoreOptions): BlobStore & { readonly client: S3Client } {
  const { bucket } = options;
  const prefix = options.prefix ?? "";
  const ownsClient = !options.client;
  const client = options.client ?? createS3Client(options.clientConfig);
  const partSize = Math.max(5 * 1024 * 1024, options.partSizeBytes ?? 8 * 1024 * 1024);
  const queueSize = options.queueSize ?? 4;
  const expiresDefault = options.signedUrlExpiresInSeconds ?? 300;
  const copyPartBytes = options.copyPartBytes ?? 512 * 1024 * 1024;
  let closed = false;
  const serverVerifiesPayload = options.serverVerifiesPayload ?? true;
  const spool = createUploadSpool({ maxBytes: options.spoolBytes ?? 1024 ** 3, parent: options.spoolDir });

  const keyOf = (hex: string) => `${prefix}sha256/${hex}`;

  function hexOf(digest: string): string | null {
    if (typeof digest !== "string" || !digest.startsWith("sha256:")) return null;
    const hex = digest.slice(7);
    return HEX.test(hex) ? hex : null;
  }

  async function head(key: string): Promise<number | null> {
    try {
      const out = await client.send(new HeadObjectCommand({ Bucket: bucket, Key: key }));
      return out.ContentLength ?? 0;
    } catch (error) {
      if (isNotFound(error)) return null;
      throw storeError(error);
    }
  }

  async function remove(key: string): Promise<void> {
    try {
      await client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
    } catch (error) {
      if (!isNotFound(error)) throw storeError(error);
    }
  }

  async function copy(from: string, to: string, size: number): Promise<void> {
    const source = `${bucket}/${from.split("/").map(encodeURIComponent).join("/")}`;
    if (size <= MAX_SINGLE_COPY) {
      await client.send(new CopyObjectCommand({ Bucket: bucket, Key: to, CopySource: source }));
      return;
    }
    // Past S3's single-copy limit: a server-side multipart copy, no bytes through us.
    const { UploadId } = await client.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: to }));
    try {
      const parts = [];
      for (let start = 0, n = 1; start < size; start += copyPartBytes, n++) {
        const end = Math.min(size, start + copyPartBytes) - 1;
        const out = await client.send(
          new UploadPartCopyCommand({
            Bucket: bucket,
            Key: to,
            UploadId,
            PartNumber: n,
            CopySource: source,
            CopySourceRange: `bytes=${start}-${end}`,
          }),
        );
        parts.push({ PartNumber: n, ETag: out.CopyPartResult?.ETag });
      }
      await client.send(
        new CompleteMultipartUploadCommand({ Bucket: bucket, Key: to, UploadId, MultipartUpload: { Parts: parts } }),
      );
    } catch (error) {
      await client.send(new AbortMultipartUploadCommand({ Bucket: bucket, Key: to, UploadId })).catch(() => {});
      throw error;
    }
  }

  const uploads: UploadContext = {
    client,
    bucket,
    keyOf,
    uploadKey: uploadKeyUnder(prefix),
    partSize,
    queueSize,
    serverVerifiesPayload,
    copy,
    head,
    remove,
  };

  const store: BlobStore & { readonly client: S3Client } = {
    client,

    async putBlob(body: AsyncIterable<Uint8Array>, putOptions: PutBlobOptions = {}): Promise<BlobInfo> {
      if (closed) throw new RunnerDepotError("STORE_UNAVAILABLE", "blob store closed");
      const copy = spool.begin(putOptions.size);
      if (!copy) return uploadBlob(uploads, body, putOptions);
      let info: BlobInfo;
      try {
        info = await uploadBlob(uploads, copy.tee(body), putOptions);
      } catch (error) {
        await copy.drop();
        throw error;
      }
      await copy.keep(info.digest.slice(7), info.size);
      return info;
    },

    /**
     * Only this process's local copy of its own upload, for reads into the caller's buffers (a commit hashing a
     * large item, archive.ts); null for any other blob, which the caller reads with getBlob. As getBlob, S3 is
     * asked first whether the blob is there, so a blob deleted there is absent here too. O(1) requests.
     */
    async openBlob(digest: string) {
      const hex = hexOf(digest);
      const local = hex ? spool.sizeOf(hex) : null;
      if (!hex || local === null) return null;
      const size = await head(keyOf(hex));
      if (size === null) {
        spool.forget(hex);
        return null;
      }
      return size === local ? spool.open(hex) : null;
    },
    async getBlob(digest: string, range?: ByteRange) {
      const hex = hexOf(digest);
      if (!hex) return null;
      const local = spool.sizeOf(hex);
      if (local !== null && (range?.start ?? 0) < local) {
        // This process's copy of its upload: read from the page cache, not back from S3. S3
        // is still asked whether the blob is there (a HEAD), so a blob deleted there (GC on
        // another replica) is absent here too and a commit never names a lost item.
        const size = await head(keyOf(hex));
        if (size === null) {
          spool.forget(hex);
          return null;
        }
        const body = size === local ? await spool.read(hex, range) : null;
        if (body) return body;
      }
      try {
        const out = await client.send(
          new GetObjectCommand({
            Bucket: bucket,
            Key: keyOf(hex),
            Range: range ? `bytes=${range.start}-${range.end}` : undefined,
          }),
        );
        const body = out.Body as unknown as AsyncIterable<Uint8Array>;
        if (!range) return body;
        // Some S3-compatible servers ignore a range or serve a wider one (s3rver answers
        // `bytes=0-0` with the whole object): trim to what was asked for.
        const served = /^bytes (\d+)-(\d+)\//.exec(out.ContentRange ?? "");
        const from = served ? Number(served[1]) : 0;
        const skip = range.start - from;
        if (skip < 0 || skip > MAX_RANGE_SKIP) {
          (body as { destroy?: () => void }).destroy?.();
          throw new RunnerDepotError(
            "STORE_UNAVAILABLE",
            skip < 0
              ? `S3 served bytes from ${from}, not ${range.start}`
              : `S3 ignored the Range: it served from byte ${from}, ${skip} bytes before the ${range.start} asked for`,
          );
        }
        const wanted = range.end - range.start + 1;
        const servedLength = out.ContentLength ?? -1;
        if (skip === 0 && servedLength === wanted) return body;
        return slice(body, skip, wanted);
      } catch (error) {
        if (isNotFound(error)) return null;
        if (errorName(error) === "InvalidRange") {
          throw new RunnerDepotError(
            "RANGE_NOT_SATISFIABLE",
            `range ${range?.start}-${range?.end} is outside the blob`,
          );
        }
        throw storeError(error);
      }
    },

    async statBlob(digest: string) {
      const hex = hexOf(digest);
      if (!hex) return null;
      const size = await head(keyOf(hex));
      return size === null ? null : { size };
    },

    async deleteBlob(digest: string) {
      const hex = hexOf(digest);
      if (!hex) return;
      spool.forget(hex);
      await remove(keyOf(hex));
    },

    async *listBlobs() {
      let token: string | undefined;
      const base = `${prefix}sha256/`;
      do {
        let out;
        try {
          out = await client.send(
            new ListObjectsV2Command({
              Bucket: bucket,
              Prefix: base,
              ContinuationToken: token,
              MaxKeys: options.listPageSize,
            }),
          );
        } catch (error) {
          throw storeError(error);
        }
        for (const item of out.Contents ?? []) {
          const hex = item.Key?.slice(base.length) ?? "";
          if (HEX.test(hex)) yield `sha256:${hex}`;
        }
        token = out.IsTruncated ? out.NextContinuationToken : undefined;
      } while (token);
    },

    async signBlobUrl(digest: string, signOptions: { expiresInSeconds?: number; filename?: string } = {}) {
      const hex = hexOf(digest);
      if (!hex) return null;
      const filename = signOptions.filename?.replace(/["\\\r\n]/g, "_");
      return getSignedUrl(
        client,
        new GetObjectCommand({
          Bucket: bucket,
          Key: keyOf(hex),
          ResponseContentDisposition: filename ? `attachment; filename="${filename}"` : undefined,
        }),
        { expiresIn: signOptions.expiresInSeconds ?? expiresDefault },
      );
    },

    async close() {
      if (closed) return;
      closed = true;
      await spool.close();
      if (ownsClient) client.destroy();
    },
  };

  return store;
}

/** Skips `skip` bytes of a stream and yields the next `take`, then stops reading. */
async function* slice(body: AsyncIterable<Uint8Array>, skip: number, take: number): AsyncGenerator<Uint8Array> {
  for await (const chunk of body) {
    if (take <= 0) break;
    if (skip >= chunk.byteLength) {
      skip -= chunk.byteLength;
      continue;
    }
    const part = chunk.subarray(skip, Math.min(chunk.byteLength, skip + take));
    skip = 0;
    take -= part.byteLength;
    yield part;
  }
}

/** Any backend failure becomes STORE_UNAVAILABLE (503 at the depot), keeping the cause. */
const storeError = (error: unknown) => s3Failure(error, "STORE_UNAVAILABLE");
