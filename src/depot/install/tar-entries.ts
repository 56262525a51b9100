/**
 * Reading a depot archive's tar entries one at a time with modern-tar's strict decoder, and
 * reading only its manifest (the first entry). Nothing here writes to disk.
 */
import { Readable } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { createTarDecoder, type ParsedTarEntry, type TarHeader } from "modern-tar";
import { RunnerDepotError } from "../../errors.js";
import { MANIFEST_PATH } from "../package/archive.js";
import {
  invalid,
  parseManifest,
  type ManifestItem,
  type ManifestReadOptions,
  type PackageManifest,
} from "./manifest.js";

/** Where an archive's bytes come from. */
export type ArchiveSource = AsyncIterable<Uint8Array> | Iterable<Uint8Array> | NodeJS.ReadableStream;
/** One archive entry: its header, and its bytes to read once (or `resume()` to skip them). */
export interface TarEntry extends AsyncIterable<Uint8Array> {
  header: TarHeader;
  resume(): void;
}
export type TarEntries = AsyncIterator<TarEntry>;

/** The manifest item type of a tar header; TYPE_INVALID for anything but a file, directory or symlink. */
export function entryType(header: TarHeader): ManifestItem["type"] {
  switch (header.type) {
    case "file":
      return "file";
    case "directory":
      return "dir";
    case "symlink":
      return "link";
    default:
      throw new RunnerDepotError(
        "TYPE_INVALID",
        `archive entry ${header.name} has the unsupported type ${String(header.type)}`,
      );
  }
}

async function readAll(entry: AsyncIterable<Uint8Array>, max: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of entry) {
    size += chunk.byteLength;
    if (size > max) throw invalid(`the manifest is larger than ${max} bytes`);
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}

/**
 * The decoder's entries one at a time: an entry whose bytes were neither read nor skipped
 * is drained before the next is read (the decoder waits for them). O(1) memory per entry.
 */
function entriesOf(reader: ReadableStreamDefaultReader<ParsedTarEntry>): TarEntries {
  let unread: WebReadableStream<Uint8Array> | ReadableStream<Uint8Array> | null = null;
  const drain = async (body: ReadableStream<Uint8Array>) => {
    for await (const _ of body as unknown as AsyncIterable<Uint8Array>) {
      // skipped: an entry whose bytes nothing needs (a directory's or a link's are empty)
    }
  };
  return {
    async next() {
      if (unread !== null) await drain(unread as ReadableStream<Uint8Array>);
      unread = null;
      const read = await reader.read();
      if (read.done) return { done: true, value: undefined };
      const { header, body } = read.value;
      unread = body;
      let skipping: Promise<void> | null = null;
      const entry: TarEntry = {
        header,
        [Symbol.asyncIterator]() {
          unread = null;
          return (body as unknown as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
        },
        resume() {
          unread = null;
          skipping ??= drain(body).catch(() => undefined);
        },
      };
      return { done: false, value: entry };
    },
  };
}

/**
 * Runs `body` over the archive's tar entries (modern-tar's strict decoder: checksums,
 * magic and truncation checked, metadata entries capped at 8 MiB), tearing the decoder
 * and source down on error or when `stopEarly` has what it needs.
 */
export async function withEntries<T>(
  source: ArchiveSource,
  body: (entries: TarEntries) => Promise<T>,
  stopEarly = false,
): Promise<T> {
  const input =
    source instanceof Readable ? source : Readable.from(source as AsyncIterable<Uint8Array> | Iterable<Uint8Array>);
  const reader = (Readable.toWeb(input) as unknown as ReadableStream<Uint8Array>)
    .pipeThrough(createTarDecoder({ strict: true }))
    .getReader();
  const stop = async () => {
    await reader.cancel().catch(() => undefined);
    input.destroy();
  };
  try {
    const result = await body(entriesOf(reader));
    if (stopEarly) await stop();
    return result;
  } catch (error) {
    await stop();
    if (error instanceof RunnerDepotError) throw error;
    throw new RunnerDepotError("ARCHIVE_INVALID", `the archive is malformed: ${(error as Error).message}`, {
      cause: error,
    });
  }
}

/** Reads the first entry, which must be the manifest, and checks it. */
export async function firstManifest(entries: TarEntries, options: ManifestReadOptions): Promise<PackageManifest> {
  const first = await entries.next();
  if (first.done) throw invalid("the archive is empty");
  const entry = first.value;
  if (entry.header.name !== MANIFEST_PATH || entryType(entry.header) !== "file") {
    throw invalid(`the archive's first entry is ${entry.header.name}, not ${MANIFEST_PATH}`);
  }
  return parseManifest(
    await readAll(entry as unknown as AsyncIterable<Uint8Array>, options.maxManifestBytes ?? 64 * 2 ** 20),
    options,
  );
}

/**
 * Reads only the manifest (the first entry) of an archive; the rest of the stream is
 * not consumed, so a ranged download of the archive's head is enough.
 */
export async function readPackageManifest(
  source: ArchiveSource,
  options: ManifestReadOptions = {},
): Promise<PackageManifest> {
  return withEntries(source, (entries) => firstManifest(entries, options), true);
}
