/**
 * The archive writer the depot used before archives were assembled at read time
 * (tar-stream's pack, straight from the manifest and item blobs). Kept as the oracle:
 * every archive the depot serves must equal this writer's bytes for the same manifest,
 * so digests published by earlier versions never change.
 */
import { once } from "node:events";
import tar, { type Header } from "tar-stream";
import { MANIFEST_PATH, type PackageManifest } from "../src/depot/package/archive.js";
import { compareUtf8 } from "../src/depot/package/paths.js";

type HeaderArgument = Partial<Header> & Pick<Header, "name">;

/** Returns the tar-stream archive of `manifest`, reading item bytes through `content`. */
export async function referenceArchive(
  manifest: PackageManifest,
  mtime: number,
  content: (digest: string) => Promise<AsyncIterable<Uint8Array> | Uint8Array | null>,
  manifestJson: Buffer = Buffer.from(JSON.stringify(manifest), "utf8"),
): Promise<Buffer> {
  const base = { mtime: new Date(mtime * 1000), uid: 0, gid: 0 };
  const entries: Array<{ path: string; header: HeaderArgument; digest?: string }> = [];
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
  const collected: Buffer[] = [];
  pack.on("data", (chunk: unknown) => void collected.push(chunk as Buffer));
  const ended = once(pack as unknown as NodeJS.EventEmitter, "end");
  await new Promise<void>((resolve, reject) => pack.entry({ ...base, name: MANIFEST_PATH, type: "file", mode: 0o644, size: manifestJson.length }, manifestJson, (e) => (e ? reject(e) : resolve())));
  for (const entry of entries) {
    if (entry.digest === undefined) {
      await new Promise<void>((resolve, reject) => pack.entry(entry.header, (e) => (e ? reject(e) : resolve())));
      continue;
    }
    const body = await content(entry.digest);
    if (!body) throw new Error(`missing ${entry.digest}`);
    const chunks: Buffer[] = [];
    if (body instanceof Uint8Array) chunks.push(Buffer.from(body));
    else for await (const chunk of body) chunks.push(Buffer.from(chunk));
    const bytes = Buffer.concat(chunks);
    await new Promise<void>((resolve, reject) => {
      const sink = pack.entry(entry.header, (e) => (e ? reject(e) : resolve()));
      sink.write(bytes);
      (sink as unknown as { end(): void }).end();
    });
  }
  pack.finalize();
  await ended;
  return Buffer.concat(collected);
}
