/**
 * Checking that an installed directory holds exactly a manifest's items: types, bytes, sizes,
 * permission bits and link targets (the installer's verify and repair).
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, readdir, readlink, rmdir } from "node:fs/promises";
import path from "node:path";
import { RunnerDepotError } from "../../errors.js";
import { digestToHex } from "../client/http.js";
import { resolveLink, treeOf } from "../package/links.js";
import { checkLinkTarget, modeOf, type ManifestItem } from "./manifest.js";

async function fileSha256(p: string): Promise<{ hex: string; size: number }> {
  const hash = createHash("sha256");
  let size = 0;
  for await (const chunk of createReadStream(p) as AsyncIterable<Buffer>) {
    hash.update(chunk);
    size += chunk.byteLength;
  }
  return { hex: hash.digest("hex"), size };
}

/** Options of {@link verifyPackageTree}. */
interface VerifyTreeOptions {
  /** First delete empty directories that neither the manifest nor any item below needs. */
  prune?: boolean;
}

/**
 * Checks that `dir` holds exactly the manifest's items: types, bytes (SHA-256), sizes,
 * permission bits and link targets; directories only as listed or as parents of items.
 * Throws DIGEST_MISMATCH listing the differences.
 */
export async function verifyPackageTree(
  dir: string,
  items: readonly ManifestItem[],
  options: VerifyTreeOptions = {},
): Promise<void> {
  const root = path.resolve(dir);
  const wanted = new Map(items.map((i) => [i.path, i]));
  const needed = new Set<string>();
  for (const item of items) {
    const parts = item.path.split("/");
    for (let i = 1; i < parts.length; i++) needed.add(parts.slice(0, i).join("/"));
  }
  const problems: string[] = [];
  const seen = new Set<string>();

  const walk = async (rel: string): Promise<void> => {
    const abs = rel === "" ? root : path.join(root, rel);
    for (const dirent of await readdir(abs, { withFileTypes: true })) {
      const childRel = rel === "" ? dirent.name : `${rel}/${dirent.name}`;
      const child = path.join(abs, dirent.name);
      const st = await lstat(child);
      const item = wanted.get(childRel);
      if (st.isDirectory()) {
        await walk(childRel);
        if (!item && !needed.has(childRel) && options.prune && (await readdir(child)).length === 0) {
          await rmdir(child);
          continue;
        }
      }
      seen.add(childRel);
      if (!item) {
        if (!(st.isDirectory() && needed.has(childRel))) problems.push(`${childRel}: not in the manifest`);
        continue;
      }
      const actual = st.isDirectory() ? "dir" : st.isSymbolicLink() ? "link" : st.isFile() ? "file" : "other";
      if (actual !== item.type) {
        problems.push(`${childRel}: is a ${actual}, the manifest says ${item.type}`);
        continue;
      }
      if (item.type === "link") {
        const target = await readlink(child);
        if (target !== item.target)
          problems.push(`${childRel}: links to ${target}, the manifest says ${String(item.target)}`);
        continue;
      }
      const mode = modeOf(item.mode, item.type === "dir" ? 0o755 : 0o644);
      if ((st.mode & 0o777) !== mode) {
        problems.push(`${childRel}: mode ${(st.mode & 0o777).toString(8)}, the manifest says ${mode.toString(8)}`);
      }
      if (item.type === "file") {
        const { hex, size } = await fileSha256(child);
        if (hex !== digestToHex(item.digest ?? "") || (item.size !== undefined && size !== item.size)) {
          problems.push(`${childRel}: content differs from ${String(item.digest)}`);
        }
      }
    }
  };
  await walk("");
  for (const item of items) if (!seen.has(item.path)) problems.push(`${item.path}: missing`);
  // The tree is the manifest's: its links must not lead out through each other either.
  const tree = treeOf(items);
  for (const item of items) {
    if (item.type !== "link") continue;
    try {
      await resolveLink(item.path, checkLinkTarget(item.path, item.target), tree);
    } catch (error) {
      problems.push(`${item.path}: ${(error as Error).message}`);
    }
  }
  if (problems.length > 0) {
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `${dir} does not match the manifest (${problems.length} difference(s)): ${problems.slice(0, 10).join("; ")}`,
      { details: { problems: problems.slice(0, 100) } },
    );
  }
}
