/**
 * docs/depot-api.md §7 is exact enough to reimplement: a tar writer built only from that
 * section's words (below; it shares no code with src/depot) reproduces, byte for byte, the
 * archive a real depot serves over HTTP for a package that exercises every rule — long
 * ASCII paths split into the prefix, a segment too long to split, non-ASCII paths, a link
 * with a long target, a directory, a licence, attributes and requirements.
 */
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../src/adapters/memory/index.js";
import {
  createDepotClient,
  createPackageRouter,
  servePackageRouter,
  type PackageServer,
} from "../../src/depot/index.js";

// ---- The document's byte format, written from its text -----------------------------------

interface DocEntry {
  path: string;
  type: "file" | "dir" | "link";
  mode: number;
  data?: Buffer;
  target?: string;
}

function octalField(value: number, digits: number): string {
  return `${value.toString(8).padStart(digits, "0")} `;
}

/** One ustar block (§7 "Header fields"), or null when the path or target does not fit. */
function ustarBlock(
  name: string,
  type: "0" | "2" | "5" | "x",
  mode: number,
  size: number,
  mtime: number,
  target?: string,
): Buffer | null {
  let rest = name;
  const moved: string[] = [];
  if (!/^[\x00-\x7f]*$/.test(name)) return null;
  while (rest.length > 100) {
    const slash = rest.indexOf("/");
    if (slash === -1) return null;
    moved.push(rest.slice(0, slash));
    rest = rest.slice(slash + 1);
  }
  const prefix = moved.join("/");
  if (prefix.length > 155 || (target !== undefined && Buffer.byteLength(target) > 100)) return null;
  const block = Buffer.alloc(512);
  block.write(rest, 0, "latin1");
  block.write(octalField(mode & 0o7777, 6), 100);
  block.write("000000 ", 108);
  block.write("000000 ", 116);
  block.write(octalField(size, 11), 124);
  block.write(octalField(mtime, 11), 136);
  block.write(type, 156);
  if (target !== undefined) block.write(target, 157);
  block.write("ustar\0", 257);
  block.write("00", 263);
  block.write("000000 ", 329);
  block.write("000000 ", 337);
  block.write(prefix, 345);
  block.write("        ", 148);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.fill(0, 148, 156);
  block.write(octalField(sum, 6), 148);
  return block;
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length)
    length = String(length).length + Buffer.byteLength(body);
  return `${length}${body}`;
}

const pad = (size: number) => Buffer.alloc((512 - (size % 512)) % 512);

function docEntryBytes(entry: DocEntry, mtime: number): Buffer {
  const type = entry.type === "file" ? "0" : entry.type === "link" ? "2" : "5";
  const size = entry.type === "file" ? entry.data!.length : 0;
  let header = ustarBlock(entry.path, type, entry.mode, size, mtime, entry.target);
  if (header === null) {
    const records = Buffer.from(
      paxRecord("path", entry.path) + (entry.target !== undefined ? paxRecord("linkpath", entry.target) : ""),
    );
    const linkName = entry.target !== undefined ? "PaxHeader" : undefined;
    header = Buffer.concat([
      ustarBlock("PaxHeader", "x", entry.mode, records.length, mtime, linkName)!,
      records,
      pad(records.length),
      ustarBlock("PaxHeader", type, entry.mode, size, mtime, linkName)!,
    ]);
  }
  return Buffer.concat([header, entry.data ?? Buffer.alloc(0), pad(size)]);
}

const sha = (bytes: Buffer | string) => `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
const utf8Order = (a: string, b: string) => Buffer.compare(Buffer.from(a), Buffer.from(b));

// ---- The package, published through the real depot ------------------------------------------

const files: Record<string, { content: string; mode: number }> = {
  [`${"a".repeat(60)}/${"b".repeat(60)}/long.txt`]: { content: "long ascii path\n", mode: 0o644 },
  [`${"x".repeat(120)}`]: { content: "one segment past 100 bytes\n", mode: 0o600 },
  "ünïcode/naïve.txt": { content: "non-ascii\n", mode: 0o644 },
  "d/hello.sh": { content: "#!/bin/sh\necho hello\n", mode: 0o755 },
};
const longTarget = `${"../d/".repeat(22)}hello.sh`;
const links: Record<string, string> = { "d/short": "hello.sh", "d/far": longTarget };

describe("docs/depot-api.md §7, reimplemented from its text", () => {
  let server: PackageServer;
  beforeAll(async () => {
    server = await servePackageRouter(createPackageRouter(createMemoryStore()), { port: 0 });
  });
  afterAll(async () => {
    await server.close();
  });

  it("reproduces the served archive byte for byte, and its digest", async () => {
    const client = createDepotClient({ baseUrl: server.url });
    const published = await client.publish({
      name: "Spec-Check",
      version: "1.0.0+build.7",
      items: [
        { type: "dir", path: "d", mode: 0o750 },
        ...Object.entries(files).map(([path, f]) => ({
          type: "file" as const,
          path,
          mode: f.mode,
          content: f.content,
        })),
        ...Object.entries(links).map(([path, target]) => ({ type: "link" as const, path, target })),
      ],
      attributes: { zeta: "last", alpha: "first, with a comma" },
      requires: { "lib-b": "^2", "lib-a": ">=1 <3" },
      license: { name: "MIT", text: "MIT licence text\n" },
    });
    const served = Buffer.from(await (await fetch(`${server.url}/data/spec-check@1.0.0`)).arrayBuffer());
    const info = (await (await fetch(`${server.url}/version/spec-check@1.0.0`)).json()) as {
      versions: [{ publishedAt: string }];
    };
    const publishedAt = info.versions[0].publishedAt;
    const mtime = Date.parse(publishedAt) / 1000;
    expect(Number.isInteger(mtime)).toBe(true);

    // The manifest, members in the documented order.
    const items = [
      { type: "dir", path: "d", mode: 0o750, size: 0 },
      ...Object.entries(files).map(([path, f]) => ({
        type: "file",
        path,
        mode: f.mode,
        size: Buffer.byteLength(f.content),
        digest: sha(f.content),
      })),
      ...Object.entries(links).map(([path, target]) => ({ type: "link", path, mode: 0o777, size: 0, target })),
    ].sort((a, b) => utf8Order(a.path, b.path));
    const licenseText = "MIT licence text\n";
    const manifest = {
      name: "spec-check",
      version: "1.0.0",
      publishedAt,
      attributes: { alpha: "first, with a comma", zeta: "last" },
      requires: [
        { name: "lib-a", range: ">=1 <3" },
        { name: "lib-b", range: "^2" },
      ],
      licenses: [{ name: "MIT", path: ".pkg/licenses/MIT", size: licenseText.length, digest: sha(licenseText) }],
      items,
    };

    // The entries: the manifest first, then items and licences in UTF-8 byte order.
    const entries: DocEntry[] = [
      ...items.map((item) => ({
        path: item.path,
        type: item.type as DocEntry["type"],
        mode: item.mode,
        ...(item.type === "file" ? { data: Buffer.from(files[item.path]!.content) } : {}),
        ...(item.type === "link" ? { target: links[item.path]! } : {}),
      })),
      { path: ".pkg/licenses/MIT", type: "file" as const, mode: 0o644, data: Buffer.from(licenseText) },
    ].sort((a, b) => utf8Order(a.path, b.path));
    const expected = Buffer.concat([
      docEntryBytes(
        { path: ".pkg/manifest.json", type: "file", mode: 0o644, data: Buffer.from(JSON.stringify(manifest)) },
        mtime,
      ),
      ...entries.map((entry) => docEntryBytes(entry, mtime)),
      Buffer.alloc(1024),
    ]);

    // Every rule of the section is exercised: prefix split, pax for a long segment, for
    // non-ASCII paths and for a long link target.
    expect(expected.indexOf(Buffer.from("a".repeat(60) + "\0"))).toBeGreaterThan(0);
    expect(expected.includes(Buffer.from(` path=${"x".repeat(120)}\n`))).toBe(true);
    expect(expected.includes(Buffer.from(" path=ünïcode/naïve.txt\n"))).toBe(true);
    expect(expected.includes(Buffer.from(` linkpath=${longTarget}\n`))).toBe(true);

    expect(served.length).toBe(expected.length);
    expect(served.equals(expected)).toBe(true);
    expect(published.digest).toBe(sha(expected));
  });
});
