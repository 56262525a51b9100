/**
 * A directory tree as the items to publish (`publish({ dir })`, the CLI's `depot publish`).
 */
import { lstat, readdir, readlink } from "node:fs/promises";
import path from "node:path";
import { RunnerDepotError } from "../../errors.js";
import type { PublishItem } from "./types.js";

/**
 * The items of a directory tree, sorted by path: every subdirectory, regular file and
 * symbolic link, with permission bits. Anything else (a socket, a device) is refused.
 */
export async function collectDirectory(dir: string): Promise<PublishItem[]> {
  const root = path.resolve(dir);
  const items: PublishItem[] = [];
  const walk = async (rel: string) => {
    const abs = rel === "" ? root : path.join(root, rel);
    const names = (await readdir(abs)).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    for (const entry of names) {
      const childRel = rel === "" ? entry : `${rel}/${entry}`;
      const child = path.join(abs, entry);
      const st = await lstat(child);
      if (st.isDirectory()) {
        items.push({ type: "dir", path: childRel, mode: st.mode & 0o777 });
        await walk(childRel);
      } else if (st.isFile()) {
        items.push({ type: "file", path: childRel, mode: st.mode & 0o777, file: child });
      } else if (st.isSymbolicLink()) {
        items.push({ type: "link", path: childRel, target: await readlink(child) });
      } else {
        throw new RunnerDepotError("TYPE_INVALID", `${child} is neither a file, a directory nor a link`);
      }
    }
  };
  await walk("");
  return items;
}
