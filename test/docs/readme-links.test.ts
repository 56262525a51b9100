/**
 * Every relative link in the README, and in the Markdown documents the package ships,
 * resolves to a file of this repository AND to a file of the npm tarball (the list
 * `npm pack --dry-run --json` reports), so the links work in a clone, in node_modules
 * and in a registry's file browser alike. Anchors (`#…`) into Markdown files must name a
 * heading of the target. Nothing may point outside the repository.
 */
import { execFile } from "node:child_process";
import { readFile, stat } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { anchorsOf, headingSlug, markdownLinks, relativeLinks } from "../fixtures/markdown-links.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

function packedFiles(): Promise<string[]> {
  return new Promise((resolve, reject) => {
    execFile(
      "npm",
      ["pack", "--dry-run", "--json", "--ignore-scripts"],
      { cwd: root, maxBuffer: 64 * 1024 * 1024 },
      (error, stdout) => {
        if (error) return reject(error);
        const [report] = JSON.parse(stdout) as [{ files: { path: string }[] }];
        resolve(report.files.map((f) => f.path));
      },
    );
  });
}

describe("documentation links", () => {
  let packed: string[] = [];
  let shippedMarkdown: string[] = [];
  beforeAll(async () => {
    packed = await packedFiles();
    shippedMarkdown = packed.filter((f) => f.endsWith(".md"));
  });

  it("the tarball ships the README, the licence, the protocol documents and openapi.yaml", () => {
    for (const file of ["README.md", "LICENSE", "docs/runner-protocol.md", "docs/depot-api.md", "openapi.yaml"])
      expect(packed).toContain(file);
  });

  it("finds links the way a Markdown renderer does", () => {
    const sample = [
      'See [the spec](docs/a.md#limits) and ![logo](img/x.png "Logo").',
      "`[not](a-link.md)`",
      "```",
      "[also not](b.md)",
      "```",
      "[ref]: ../c.md",
      '<img src="d.png">',
    ].join("\n");
    expect(markdownLinks(sample)).toEqual(["docs/a.md#limits", "img/x.png", "../c.md", "d.png"]);
    expect(headingSlug("9. Status codes")).toBe("9-status-codes");
    expect(headingSlug("`GET /catalog`")).toBe("get-catalog");
  });

  it("every relative link of every shipped Markdown file resolves in the repository and in the tarball", async () => {
    const problems: string[] = [];
    let checked = 0;
    for (const doc of shippedMarkdown) {
      const text = await readFile(path.join(root, doc), "utf8");
      for (const { link, target, anchor, outside } of relativeLinks(doc, text)) {
        checked++;
        if (outside) {
          problems.push(`${doc}: ${link} points outside the repository`);
          continue;
        }
        const onDisk = await stat(path.join(root, target)).catch(() => null);
        if (!onDisk) problems.push(`${doc}: ${link} → ${target} does not exist in the repository`);
        const inTarball = onDisk?.isDirectory()
          ? packed.some((f) => f.startsWith(`${target.replace(/\/$/, "")}/`))
          : packed.includes(target);
        if (!inTarball) problems.push(`${doc}: ${link} → ${target} is not in the npm tarball (package.json "files")`);
        if (anchor && onDisk?.isFile() && target.endsWith(".md")) {
          const anchors = anchorsOf(await readFile(path.join(root, target), "utf8"));
          if (!anchors.has(anchor)) problems.push(`${doc}: ${link} names no heading of ${target}`);
        }
      }
    }
    expect(problems).toEqual([]);
    // The README alone links the examples, the protocol documents, openapi.yaml and more.
    expect(checked).toBeGreaterThan(10);
  });

  it("the README links the normative documents and nothing outside the repository", async () => {
    const links = markdownLinks(await readFile(path.join(root, "README.md"), "utf8"));
    expect(links).toContain("docs/runner-protocol.md");
    expect(links).toContain("docs/depot-api.md");
    expect(links).toContain("openapi.yaml");
    expect(links.filter((l) => l.includes("../"))).toEqual([]);
  });
});
