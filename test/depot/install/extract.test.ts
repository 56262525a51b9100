import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, lstat, mkdir, mkdtemp, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import tar from "tar-stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { extractPackage } from "../../../src/depot/install/extract.js";
import {
  checkLinkTarget,
  checkPackagePath,
  type ManifestItem,
  type PackageManifest,
} from "../../../src/depot/install/manifest.js";
import { readPackageManifest } from "../../../src/depot/install/tar-entries.js";
import { verifyPackageTree } from "../../../src/depot/install/verify-tree.js";
import { digestToHex, hexToHttpDigest } from "../../../src/depot/client/http.js";
import { RunnerDepotError } from "../../../src/errors.js";
import { failure } from "../../fixtures/errors.js";

const sha = (s: string | Buffer) => `sha256:${createHash("sha256").update(s).digest("hex")}`;

interface Entry {
  name: string;
  type?: "file" | "directory" | "symlink" | "link" | "character-device" | "fifo";
  content?: string;
  linkname?: string;
  mode?: number;
}

/** Builds a tar the way an attacker could: any header, any order, manifest first. */
async function archive(
  manifest: Partial<PackageManifest> & { items: ManifestItem[] },
  entries: Entry[],
  opts: { raw?: boolean } = {},
) {
  const pack = tar.pack();
  const m = { name: "pkg", version: "1.0.0", attributes: {}, requires: [], ...manifest };
  if (!opts.raw) pack.entry({ name: ".pkg/manifest.json", mode: 0o644 }, JSON.stringify(m));
  for (const e of entries) {
    const header = { name: e.name, type: e.type ?? "file", mode: e.mode ?? 0o644, linkname: e.linkname };
    if (e.type && e.type !== "file") pack.entry(header);
    else pack.entry(header, e.content ?? "");
  }
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

const file = (p: string, content: string, mode = 0o644): ManifestItem => ({
  type: "file",
  path: p,
  mode,
  size: Buffer.byteLength(content),
  digest: sha(content),
});

let tmp: string;
let target: string;
beforeEach(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), "depot-extract-"));
  target = path.join(tmp, "deep", "target");
  await mkdir(target, { recursive: true });
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe("extractPackage", () => {
  it("extracts files, directories and links with their modes, and verifies digests", async () => {
    const items: ManifestItem[] = [
      { type: "dir", path: "bin", mode: 0o750 },
      file("bin/tool", "#!/bin/sh\necho hi\n", 0o755),
      { type: "dir", path: "share", mode: 0o755 },
      file("share/data.txt", "data", 0o600),
      file("top.txt", "top"),
      { type: "link", path: "share/tool", target: "../bin/tool" },
      file("implicit/parent/file", "x"),
    ];
    const tarball = await archive({ items }, [
      { name: "bin/", type: "directory", mode: 0o750 },
      { name: "bin/tool", content: "#!/bin/sh\necho hi\n", mode: 0o755 },
      { name: "implicit/parent/file", content: "x" },
      { name: "share/", type: "directory" },
      { name: "share/data.txt", content: "data", mode: 0o600 },
      { name: "share/tool", type: "symlink", linkname: "../bin/tool" },
      { name: "top.txt", content: "top" },
    ]);
    const manifest = await extractPackage([tarball], target, { expect: { name: "PKG", version: "1.0.0" } });
    expect(manifest.items).toHaveLength(7);
    expect(await readFile(path.join(target, "bin/tool"), "utf8")).toBe("#!/bin/sh\necho hi\n");
    expect((await lstat(path.join(target, "bin/tool"))).mode & 0o777).toBe(0o755);
    expect((await lstat(path.join(target, "bin"))).mode & 0o777).toBe(0o750);
    expect((await lstat(path.join(target, "share/data.txt"))).mode & 0o777).toBe(0o600);
    expect(await readlink(path.join(target, "share/tool"))).toBe("../bin/tool");
    await verifyPackageTree(target, items);
    expect(await readPackageManifest([tarball])).toMatchObject({ name: "pkg", version: "1.0.0" });
  });

  it("refuses an entry with .. and writes nothing outside", async () => {
    const tarball = await archive({ items: [file("ok", "ok")] }, [
      { name: "../escaped", content: "pwned" },
      { name: "ok", content: "ok" },
    ]);
    const error = await failure(extractPackage([tarball], target));
    expect(error.code).toBe("PATH_INVALID");
    expect(error.message).toContain("'..' segment");
    expect(existsSync(path.join(target, "..", "escaped"))).toBe(false);
  });

  it("refuses an absolute path", async () => {
    const outside = path.join(tmp, "absolute-victim");
    const tarball = await archive({ items: [] }, [{ name: outside, content: "pwned" }]);
    const error = await failure(extractPackage([tarball], target));
    expect(error.code).toBe("PATH_INVALID");
    expect(error.message).toContain("absolute");
    expect(existsSync(outside)).toBe(false);
  });

  it("refuses a manifest that lists a path escaping the package", async () => {
    const tarball = await archive({ items: [file("a/../../x", "x")] }, [{ name: "a/../../x", content: "x" }]);
    expect((await failure(extractPackage([tarball], target))).code).toBe("PATH_INVALID");
    expect(existsSync(path.join(tmp, "deep", "x"))).toBe(false);
  });

  it("refuses what the server would refuse: .pkg in any case, a link into .pkg/, a licence name that is a path", async () => {
    for (const [items, entries] of [
      [[file(".PKG/evil", "x")], [{ name: ".PKG/evil", content: "x" }]],
      [
        [{ type: "link", path: "peek", target: ".pkg/manifest.json" }],
        [{ name: "peek", type: "symlink", linkname: ".pkg/manifest.json" }],
      ],
    ] as Array<[ManifestItem[], Entry[]]>) {
      const dir = path.join(tmp, `t-${Math.random()}`);
      expect((await failure(extractPackage([await archive({ items }, entries)], dir))).code).toBe("PATH_INVALID");
      expect(existsSync(path.join(dir, items[0]!.path))).toBe(false);
    }
    const licence = await archive(
      { items: [], licenses: [{ name: "x", path: ".pkg/licenses/a/b", size: 1, digest: sha("x") }] },
      [{ name: ".pkg/licenses/a/b", content: "x" }],
    );
    expect((await failure(extractPackage([licence], path.join(tmp, "lic")))).code).toBe("PATH_INVALID");
  });

  it("refuses a link whose target resolves outside", async () => {
    for (const linkname of ["../../etc", "/etc/passwd", "a/../../.."]) {
      const dir = path.join(tmp, `t-${Math.random()}`);
      const tarball = await archive({ items: [{ type: "link", path: "sub/evil", target: "a" }] }, [
        { name: "sub/evil", type: "symlink", linkname },
      ]);
      const error = await failure(extractPackage([tarball], dir));
      expect(error.code).toBe("PATH_INVALID");
      expect(existsSync(path.join(dir, "sub/evil"))).toBe(false);
    }
  });

  it("refuses an entry through a link, even one pointing inside", async () => {
    // A link that escapes, then a file written through it.
    const victim = path.join(tmp, "victim");
    await mkdir(victim);
    const escaping = await archive(
      { items: [{ type: "link", path: "evil", target: "../../victim" }, file("evil/x", "pwned")] },
      [
        { name: "evil", type: "symlink", linkname: "../../victim" },
        { name: "evil/x", content: "pwned" },
      ],
    );
    expect((await failure(extractPackage([escaping], target))).code).toBe("PATH_INVALID");
    expect(existsSync(path.join(victim, "x"))).toBe(false);

    // A link inside the package, then a file through it (the manifest agrees, to get past it).
    const dir2 = path.join(tmp, "t2");
    const inside = await archive(
      {
        items: [{ type: "dir", path: "real" }, { type: "link", path: "lnk", target: "real" }, file("lnk/x", "through")],
      },
      [
        { name: "lnk", type: "symlink", linkname: "real" },
        { name: "real/", type: "directory" },
        { name: "lnk/x", content: "through" },
      ],
    );
    const error = await failure(extractPackage([inside], dir2));
    expect(error.code).toBe("PATH_INVALID");
    expect(error.message).toContain("passes through the link lnk");
    expect(existsSync(path.join(dir2, "real", "x"))).toBe(false);
  });

  it("refuses hard links, devices and fifos", async () => {
    for (const type of ["link", "character-device", "fifo"] as const) {
      const dir = path.join(tmp, `t-${type}`);
      const tarball = await archive({ items: [file("a", "a")] }, [
        { name: "a", content: "a" },
        { name: "b", type, linkname: "a" },
      ]);
      const error = await failure(extractPackage([tarball], dir));
      expect(error.code).toBe("TYPE_INVALID");
    }
  });

  it("refuses content that does not match the manifest digest", async () => {
    const tarball = await archive({ items: [file("a.txt", "expected")] }, [{ name: "a.txt", content: "tampered" }]);
    const error = await failure(extractPackage([tarball], target));
    expect(error.code).toBe("DIGEST_MISMATCH");
    expect(error.message).toContain("a.txt");
  });

  it("refuses entries the manifest does not list, items it lists that are missing, and duplicates", async () => {
    const extra = await archive({ items: [] }, [{ name: "stowaway", content: "x" }]);
    expect((await failure(extractPackage([extra], path.join(tmp, "e1")))).message).toContain("not in the manifest");
    const missing = await archive({ items: [file("a", "a")] }, []);
    expect((await failure(extractPackage([missing], path.join(tmp, "e2")))).message).toContain(
      "missing from the archive",
    );
    const twice = await archive({ items: [file("a", "a")] }, [
      { name: "a", content: "a" },
      { name: "a", content: "a" },
    ]);
    expect((await failure(extractPackage([twice], path.join(tmp, "e3")))).code).toBe("ARCHIVE_INVALID");
  });

  it("refuses an archive whose first entry is not the manifest, a truncated one, and the wrong package", async () => {
    const noManifest = await archive({ items: [] }, [{ name: "a", content: "a" }], { raw: true });
    expect((await failure(extractPackage([noManifest], path.join(tmp, "n1")))).code).toBe("ARCHIVE_INVALID");
    const whole = await archive({ items: [file("a", "a".repeat(5000))] }, [{ name: "a", content: "a".repeat(5000) }]);
    const cut = await failure(extractPackage([whole.subarray(0, 2048)], path.join(tmp, "n2")));
    expect(cut.code).toBe("ARCHIVE_INVALID");
    const wrong = await failure(extractPackage([whole], path.join(tmp, "n3"), { expect: { name: "other" } }));
    expect(wrong.message).toContain("not other");
  });

  it("checks licence texts in .pkg/licenses/ against the manifest and keeps them out of the tree", async () => {
    const licenses = [{ name: "MIT", path: ".pkg/licenses/MIT", size: 8, digest: sha("MIT text") }];
    const good = await archive({ items: [file("a", "a")], licenses }, [
      { name: ".pkg/licenses/MIT", content: "MIT text" },
      { name: "a", content: "a" },
    ]);
    await extractPackage([good], path.join(tmp, "l1"));
    await verifyPackageTree(path.join(tmp, "l1"), [file("a", "a")]);
    const tampered = await archive({ items: [], licenses }, [{ name: ".pkg/licenses/MIT", content: "GPL text" }]);
    expect((await failure(extractPackage([tampered], path.join(tmp, "l2")))).code).toBe("DIGEST_MISMATCH");
    const unlisted = await archive({ items: [] }, [{ name: ".pkg/hooks/postinstall", content: "rm -rf /" }]);
    expect((await failure(extractPackage([unlisted], path.join(tmp, "l3")))).code).toBe("PATH_INVALID");
    const missing = await archive({ items: [], licenses }, []);
    expect((await failure(extractPackage([missing], path.join(tmp, "l4")))).message).toContain("licence(s) missing");
  });

  it("refuses a manifest larger than maxManifestBytes", async () => {
    const tarball = await archive({ items: [file("a", "a")], attributes: { padding: "x".repeat(5000) } }, [
      { name: "a", content: "a" },
    ]);
    const error = await failure(extractPackage([tarball], target, { maxManifestBytes: 4096 }));
    expect(error.code).toBe("ARCHIVE_INVALID");
    expect(error.message).toContain("larger than 4096 bytes");
    await extractPackage([tarball], path.join(tmp, "roomy"), { maxManifestBytes: 8192 });
  });

  it("refuses to extract a whole package into a non-empty directory", async () => {
    await writeFile(path.join(target, "old"), "x");
    const tarball = await archive({ items: [] }, []);
    expect((await failure(extractPackage([tarball], target))).code).toBe("PATH_EXISTS");
  });
});

describe("deltas and tree verification", () => {
  const v1: ManifestItem[] = [
    { type: "dir", path: "d", mode: 0o755 },
    file("d/keep", "keep"),
    file("d/change", "old"),
    file("gone/deep", "bye"),
    file("script", "run", 0o644),
    { type: "link", path: "current", target: "d/keep" },
  ];
  const v2: ManifestItem[] = [
    { type: "dir", path: "d", mode: 0o755 },
    file("d/keep", "keep"),
    file("d/change", "new!"),
    file("script", "run", 0o755),
    { type: "link", path: "current", target: "d/change" },
    file("added", "added"),
  ];

  async function installV1() {
    await extractPackage(
      [
        await archive({ items: v1 }, [
          { name: "current", type: "symlink", linkname: "d/keep" },
          { name: "d/", type: "directory" },
          { name: "d/change", content: "old" },
          { name: "d/keep", content: "keep" },
          { name: "gone/deep", content: "bye" },
          { name: "script", content: "run" },
        ]),
      ],
      target,
    );
  }

  it("applies removals, changed bytes, modes and link targets, then matches the new manifest", async () => {
    await installV1();
    const changed = v2.filter((i) => ["d/change", "script", "current", "added"].includes(i.path));
    const delta = await archive({ version: "2.0.0", from: "1.0.0", removed: ["gone/deep"], items: changed }, [
      { name: "added", content: "added" },
      { name: "current", type: "symlink", linkname: "d/change" },
      { name: "d/change", content: "new!" },
      { name: "script", content: "run", mode: 0o755 },
    ]);
    await expect(verifyPackageTree(target, v2)).rejects.toThrow(/does not match/);
    await extractPackage([delta], target, { delta: true, expect: { version: "2.0.0", from: "1.0.0" } });
    // `gone/` was an implicit parent only: pruning removes it, as a fresh install would not have it.
    await verifyPackageTree(target, v2, { prune: true });
    expect(existsSync(path.join(target, "gone"))).toBe(false);
    expect(await readlink(path.join(target, "current"))).toBe("d/change");
  });

  it("refuses a delta that removes through a link or names another base", async () => {
    await installV1();
    const outside = path.join(tmp, "outside");
    await mkdir(outside);
    await writeFile(path.join(outside, "precious"), "x");
    await symlink(outside, path.join(target, "sneaky"));
    const delta = await archive({ version: "2.0.0", from: "1.0.0", removed: ["sneaky/precious"], items: [] }, []);
    expect((await failure(extractPackage([delta], target, { delta: true }))).code).toBe("PATH_INVALID");
    expect(existsSync(path.join(outside, "precious"))).toBe(true);
    const wrongBase = await archive({ version: "2.0.0", from: "0.9.0", items: [] }, []);
    expect((await failure(extractPackage([wrongBase], target, { delta: true, expect: { from: "1.0.0" } }))).code).toBe(
      "ARCHIVE_INVALID",
    );
  });

  it("never writes through a link planted where a delta puts a file", async () => {
    await installV1();
    const outside = path.join(tmp, "outside-file");
    await writeFile(outside, "original");
    await rm(path.join(target, "d/change"));
    await symlink(outside, path.join(target, "d/change"));
    const delta = await archive({ version: "2.0.0", from: "1.0.0", items: [file("d/change", "new!")] }, [
      { name: "d/change", content: "new!" },
    ]);
    await extractPackage([delta], target, { delta: true });
    expect(await readFile(outside, "utf8")).toBe("original");
    expect((await lstat(path.join(target, "d/change"))).isFile()).toBe(true);
  });

  it("verifyPackageTree reports extra files, changed bytes, modes and missing items", async () => {
    await installV1();
    await writeFile(path.join(target, "extra"), "x");
    await writeFile(path.join(target, "d/keep"), "KEEP");
    await chmod(path.join(target, "script"), 0o700);
    await rm(path.join(target, "gone/deep"));
    const error = await failure(verifyPackageTree(target, v1));
    expect(error.code).toBe("DIGEST_MISMATCH");
    const problems = error.details.problems as string[];
    expect(problems).toEqual(
      expect.arrayContaining([
        "extra: not in the manifest",
        expect.stringMatching(/^d\/keep: content differs/),
        "script: mode 700, the manifest says 644",
        "gone/deep: missing",
      ]),
    );
  });
});

describe("path rules and digests", () => {
  it("accepts normal paths and refuses the rest", () => {
    expect(checkPackagePath("a/b.c/d")).toBe("a/b.c/d");
    for (const bad of [
      "",
      "/a",
      "a//b",
      "a/./b",
      "..",
      "a/..",
      "a\\b",
      "a\0b",
      ".pkg/x",
      ".pkg",
      "a/",
      ".PKG/x",
      ".Pkg",
      "x".repeat(256),
      `${"a/".repeat(2048)}b`,
    ]) {
      expect(() => checkPackagePath(bad), bad).toThrow(RunnerDepotError);
    }
    // Paths the server would store (NFC) pass; another normalisation form is not what it stores.
    expect(checkPackagePath("caf\u00e9")).toBe("caf\u00e9");
    expect(() => checkPackagePath("cafe\u0301")).toThrow(/NFC/);
    expect(() => checkLinkTarget("link", "cafe\u0301")).toThrow(/NFC/);
    expect(() => checkPackagePath(42)).toThrow(RunnerDepotError);
    expect(checkLinkTarget("a/b/link", "../c")).toBe("../c");
    expect(checkLinkTarget("a/b/link", "../../c")).toBe("../../c");
    expect(() => checkLinkTarget("a/link", "../../c")).toThrow(/leaves the package root/);
    expect(() => checkLinkTarget("link", "/abs")).toThrow(/absolute/);
    // The server's own rules (one implementation): targets are normalised, never into .pkg/.
    for (const bad of [".", "./x", "a//b", "a/../.pkg/manifest.json", ".PKG/x", "x\\y"]) {
      expect(() => checkLinkTarget("link", bad), bad).toThrow(RunnerDepotError);
    }
  });

  it("reads both digest notations", () => {
    const hex = createHash("sha256").update("x").digest("hex");
    expect(digestToHex(`sha256:${hex}`)).toBe(hex);
    expect(digestToHex(hexToHttpDigest(hex))).toBe(hex);
    expect(digestToHex(`sha-512=:AAAA:, ${hexToHttpDigest(hex)}`)).toBe(hex);
    expect(digestToHex("md5=:AAAA:")).toBeNull();
  });
});
