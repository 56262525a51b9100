/**
 * The deterministic package archive: a POSIX tar whose first entry is
 * `.pkg/manifest.json`, then every entry in UTF-8 byte order of its path, all with the
 * same mtime, uid/gid 0 and no user or group names.
 * Why: docs/decisions/depot-archives.md, "archive.ts: archives assembled from parts at read time".
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { readBorrowed } from "../store/blob-chunks.js";
import { compareUtf8 } from "./paths.js";
import type { BlobInfo, ByteRange, PackageStore } from "../ports.js";
import { END_OF_ARCHIVE_BYTES, encodeTarHeader, paddingAfter, type TarHeaderFields } from "./tar-header.js";

/** The manifest's path inside every archive. */
export const MANIFEST_PATH = ".pkg/manifest.json";
/** Where licence texts live inside an archive. */
export const LICENSES_DIR = ".pkg/licenses";

/** One item of a package: a file, a directory or a symbolic link. */
export interface ManifestItem {
  type: "file" | "dir" | "link";
  /** Relative POSIX path inside the package. */
  path: string;
  /** Permission bits as a number (420 = 0644). */
  mode: number;
  /** Bytes of a file; 0 for dir and link. */
  size: number;
  /** `sha256:<hex>` of a file's bytes. */
  digest?: string;
  /** A link's target, relative to the link's own directory. */
  target?: string;
}

/** A licence shipped with a package, stored at `.pkg/licenses/<name>`. */
export interface ManifestLicense {
  /** Its name, e.g. an SPDX identifier. */
  name: string;
  path: string;
  size: number;
  digest: string;
}

/** A requirement of a package on another. */
export interface Requirement {
  name: string;
  range: string;
}

/** The `.pkg/manifest.json` of a package or delta archive. */
export interface PackageManifest {
  name: string;
  version: string;
  publishedAt: string;
  attributes: Record<string, string>;
  requires: Requirement[];
  licenses: ManifestLicense[];
  items: ManifestItem[];
  /** A delta's base version. */
  from?: string;
  /** A delta's paths to delete (present in `from`, absent in `version`). */
  removed?: string[];
}

/**
 * One contiguous part of an assembled archive. `header` parts are re-encoded when read
 * (so a layout of 100,000 items holds no header bytes), `blob` parts are read from the
 * item's blob, `zeros` are padding and the end blocks, `bytes` is the manifest's JSON.
 */
type ArchivePart =
  | { offset: number; length: number; kind: "header"; fields: TarHeaderFields }
  | { offset: number; length: number; kind: "blob"; digest: string }
  | { offset: number; length: number; kind: "zeros" }
  | { offset: number; length: number; kind: "bytes"; bytes: Buffer };

/** Where every byte of an archive comes from; `size` is its exact length. */
export interface ArchiveLayout {
  size: number;
  parts: ArchivePart[];
}

type PartWithoutOffset = ArchivePart extends infer P ? (P extends ArchivePart ? Omit<P, "offset"> : never) : never;

interface Entry {
  path: string;
  fields: TarHeaderFields;
  digest?: string;
}

/**
 * The layout of the archive of `manifest` with entry times `mtime` (whole seconds).
 * `manifestJson` is the first entry's content: the stored manifest blob's bytes (for a
 * version) or `JSON.stringify(manifest)` (a delta). O(items) time and parts.
 */
export function archiveLayout(manifest: PackageManifest, manifestJson: Buffer, mtime: number): ArchiveLayout {
  const entries: Entry[] = [];
  for (const item of manifest.items) {
    if (item.type === "dir")
      entries.push({
        path: item.path,
        fields: { name: item.path, type: "directory", mode: item.mode, size: 0, mtime },
      });
    else if (item.type === "link")
      entries.push({
        path: item.path,
        fields: { name: item.path, type: "symlink", mode: item.mode, size: 0, mtime, linkname: item.target! },
      });
    else
      entries.push({
        path: item.path,
        fields: { name: item.path, type: "file", mode: item.mode, size: item.size, mtime },
        digest: item.digest!,
      });
  }
  for (const license of manifest.licenses) {
    entries.push({
      path: license.path,
      fields: { name: license.path, type: "file", mode: 0o644, size: license.size, mtime },
      digest: license.digest,
    });
  }
  entries.sort((a, b) => compareUtf8(a.path, b.path));

  const parts: ArchivePart[] = [];
  let offset = 0;
  const push = (part: PartWithoutOffset) => {
    if (part.length === 0) return;
    parts.push({ ...part, offset } as ArchivePart);
    offset += part.length;
  };
  const pushEntry = (fields: TarHeaderFields, content: PartWithoutOffset | null) => {
    push({ kind: "header", fields, length: encodeTarHeader(fields).length });
    if (content) push(content);
    push({ kind: "zeros", length: paddingAfter(content?.length ?? 0) });
  };
  pushEntry(
    { name: MANIFEST_PATH, type: "file", mode: 0o644, size: manifestJson.length, mtime },
    { kind: "bytes", bytes: manifestJson, length: manifestJson.length },
  );
  for (const entry of entries) {
    const size = entry.fields.type === "file" ? entry.fields.size : 0;
    pushEntry(
      entry.fields,
      entry.digest !== undefined && size > 0 ? { kind: "blob", digest: entry.digest, length: size } : null,
    );
  }
  push({ kind: "zeros", length: END_OF_ARCHIVE_BYTES });
  return { size: offset, parts };
}

/** An item blob an archive needs is not stored (a commit answers COMMIT_INVALID, a read 500). */
class MissingContentError extends Error {
  constructor(readonly digest: string) {
    super(`Item content ${digest} is no longer stored`);
    this.name = "MissingContentError";
  }
}

const ZERO_CHUNK = Buffer.alloc(64 * 1024);

/** Options of {@link readArchive}. */
interface ReadArchiveOptions {
  /**
   * Item bytes may come as borrowed chunks (depot/store/blob-chunks.ts), valid only until the next
   * chunk is asked for, when the store offers `openBlob`: nothing is allocated per chunk.
   * Only for a consumer that is done with each chunk by then (a hash, or a socket writer
   * that waits for each borrowed chunk's write); never for a Web stream.
   */
  borrow?: boolean;
}

/**
 * Streams the archive bytes of `layout` (or the inclusive `range` of them) from the
 * store: finding the first part is a binary search, O(log parts); the rest reads only
 * the bytes asked for. Throws MissingContentError when an item's blob is gone.
 */
export async function* readArchive(
  store: PackageStore,
  layout: ArchiveLayout,
  range?: ByteRange,
  options: ReadArchiveOptions = {},
): AsyncGenerator<Uint8Array> {
  const start = range?.start ?? 0;
  const end = Math.min(range?.end ?? layout.size - 1, layout.size - 1);
  if (start > end) return;
  for (let i = firstPartAt(layout.parts, start); i < layout.parts.length; i++) {
    const part = layout.parts[i]!;
    if (part.offset > end) return;
    const from = Math.max(start, part.offset) - part.offset;
    const to = Math.min(end, part.offset + part.length - 1) - part.offset; // inclusive
    if (part.kind === "header") yield encodeTarHeader(part.fields).subarray(from, to + 1);
    else if (part.kind === "bytes") yield part.bytes.subarray(from, to + 1);
    else if (part.kind === "zeros") {
      for (let at = from; at <= to; at += ZERO_CHUNK.length)
        yield ZERO_CHUNK.subarray(0, Math.min(ZERO_CHUNK.length, to + 1 - at));
    } else {
      // openBlob may decline a blob it holds (the S3 store opens only its local copies): then getBlob reads it.
      const reader = options.borrow && store.openBlob ? await store.openBlob(part.digest) : null;
      if (reader) {
        try {
          yield* readBorrowed(reader, from, to, part.digest);
        } finally {
          await reader.close();
        }
        continue;
      }
      const body = await store.getBlob(part.digest, { start: from, end: to });
      if (!body) throw new MissingContentError(part.digest);
      yield* body;
    }
  }
}

function firstPartAt(parts: ArchivePart[], offset: number): number {
  let low = 0;
  let high = parts.length - 1;
  while (low < high) {
    const mid = (low + high + 1) >> 1;
    if (parts[mid]!.offset <= offset) low = mid;
    else high = mid - 1;
  }
  return low;
}

/**
 * The commit's one seam: the digest and size of the archive of `manifest` at `mtime`,
 * from one pass over the assembled stream (each item read once, hashed, not copied). A
 * store that serves by redirect (`signBlobUrl`, e.g. S3) also keeps the archive as a
 * blob, since a signed URL must point at stored bytes, but not here: the caller starts
 * that copy once this answered (archive-keeper.ts); the fs and memory stores keep none.
 *
 * @example
 * const { digest, size } = await commitArchive(store, manifest, mtime); // sha256:… of the tar
 */
export async function commitArchive(
  store: PackageStore,
  manifest: PackageManifest,
  mtime: number,
  manifestJson?: Buffer,
): Promise<BlobInfo> {
  const json = manifestJson ?? Buffer.from(JSON.stringify(manifest), "utf8");
  const layout = archiveLayout(manifest, json, mtime);
  try {
    // Borrowed chunks: hash.update is done with each before the next is read into its buffer.
    const hash = createHash("sha256");
    let size = 0;
    for await (const chunk of readArchive(store, layout, undefined, { borrow: true })) {
      hash.update(chunk);
      size += chunk.byteLength;
    }
    return { digest: `sha256:${hash.digest("hex")}`, size };
  } catch (error) {
    if (error instanceof MissingContentError) {
      throw new RunnerDepotError(
        "COMMIT_INVALID",
        `Content ${error.digest} of an item is no longer stored; add it again`,
        { cause: error },
      );
    }
    throw error;
  }
}
