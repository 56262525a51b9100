/**
 * The deterministic package archive: a POSIX tar whose first entry is
 * `.pkg/manifest.json`, then every entry in UTF-8 byte order of its path, all with the
 * same mtime, uid/gid 0 and no user or group names. Built straight into a blob.
 */
import { once } from "node:events";
import tar, { type Header } from "tar-stream";

type HeaderArgument = Partial<Header> & Pick<Header, "name">;
import { RunnerDepotError } from "../errors.js";
import { compareUtf8 } from "./paths.js";
import type { BlobInfo, PackageStore } from "./ports.js";

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

interface Entry {
  path: string;
  header: HeaderArgument;
  digest?: string;
}

/**
 * Streams the archive of `manifest` (whose file and licence digests must all be stored)
 * into `store` and returns the archive blob. `mtime` is whole seconds since the epoch.
 */
export async function writeArchive(store: PackageStore, manifest: PackageManifest, mtime: number): Promise<BlobInfo> {
  const date = new Date(mtime * 1000);
  const base = { mtime: date, uid: 0, gid: 0 };
  const entries: Entry[] = [];
  for (const item of manifest.items) {
    if (item.type === "dir") entries.push({ path: item.path, header: { ...base, name: item.path, type: "directory", mode: item.mode } });
    else if (item.type === "link") entries.push({ path: item.path, header: { ...base, name: item.path, type: "symlink", linkname: item.target!, mode: item.mode } });
    else entries.push({ path: item.path, header: { ...base, name: item.path, type: "file", mode: item.mode, size: item.size }, digest: item.digest! });
  }
  for (const license of manifest.licenses) {
    entries.push({ path: license.path, header: { ...base, name: license.path, type: "file", mode: 0o644, size: license.size }, digest: license.digest });
  }
  entries.sort((a, b) => compareUtf8(a.path, b.path));

  const pack = tar.pack();
  const produce = (async () => {
    const json = Buffer.from(JSON.stringify(manifest), "utf8");
    await entryDone(pack, { ...base, name: MANIFEST_PATH, type: "file", mode: 0o644, size: json.length }, json);
    for (const entry of entries) {
      if (entry.digest === undefined) {
        await entryDone(pack, entry.header);
        continue;
      }
      const body = await store.getBlob(entry.digest);
      if (!body) throw new RunnerDepotError("COMMIT_INVALID", `The content of ${entry.path} (${entry.digest}) is no longer stored`);
      let callbackError: Error | null | undefined;
      const finished = new Promise<void>((resolve, reject) => {
        const sink = pack.entry(entry.header, (error) => {
          callbackError = error;
          if (error) reject(error);
          else resolve();
        });
        void (async () => {
          try {
            for await (const chunk of body) {
              if (!sink.write(chunk)) await once(sink as unknown as NodeJS.EventEmitter, "drain");
            }
            (sink as unknown as { end(): void }).end();
          } catch (error) {
            sink.destroy(error as Error);
            reject(error);
          }
        })();
      });
      await finished;
      if (callbackError) throw callbackError;
    }
    pack.finalize();
  })();
  produce.catch((error: unknown) => pack.destroy(error as Error));
  const stored = store.putBlob(pack as unknown as AsyncIterable<Uint8Array>).catch((error: unknown) => {
    pack.destroy(error as Error);
    throw error;
  });
  const [info] = await Promise.all([stored, produce]);
  return info;
}

function entryDone(pack: tar.Pack, header: HeaderArgument, body?: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const callback = (error?: Error | null) => (error ? reject(error) : resolve());
    if (body) pack.entry(header, body, callback);
    else pack.entry(header, callback);
  });
}
