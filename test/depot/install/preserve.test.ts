/**
 * Installs never destroy (docs/decisions/install-preserve.md), through
 * `createDepotClient().install` against a real listening depot: a user's files in a
 * package's folder are kept, or the install refuses naming them, never lost.
 */
import { mkdir, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient, type DepotClient } from "../../../src/depot/client/depot-client.js";
import { isRunnerDepotError, type RunnerDepotError } from "../../../src/errors.js";
import { snapshotTree, startDepot } from "../../fixtures/depot-client-harness.js";

type Depot = Awaited<ReturnType<typeof startDepot>>;
let depot: Depot;
let client: DepotClient;

beforeAll(async () => {
  depot = await startDepot();
  client = createDepotClient({ baseUrl: depot.url });
  const src = await depot.tempDir("src");
  await mkdir(path.join(src, "etc"));
  await writeFile(path.join(src, "etc", "app.conf"), "color = blue\n");
  await writeFile(path.join(src, "README"), "version one\n");
  await writeFile(path.join(src, "gone-in-2"), "only in 1.0.0\n");
  await symlink("README", path.join(src, "readme-link"));
  await client.publish({ name: "app", version: "1.0.0", dir: src });
  // 2.0.0: README changes, gone-in-2 goes, bin/ arrives; etc/app.conf is the same.
  await writeFile(path.join(src, "README"), "version two\n");
  await rm(path.join(src, "gone-in-2"));
  await mkdir(path.join(src, "bin"));
  await writeFile(path.join(src, "bin", "run"), "#!/bin/sh\n", { mode: 0o755 });
  await client.publish({ name: "app", version: "2.0.0", dir: src });
});
afterAll(async () => {
  await depot?.close();
});

async function refusal(promise: Promise<unknown>): Promise<RunnerDepotError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  if (!isRunnerDepotError(error)) throw new Error(`expected a RunnerDepotError, got ${String(error)}`);
  return error;
}

describe("install over a user's files", () => {
  it("refuses to replace a user's file where the package has one, naming it; changes nothing", async () => {
    const target = await depot.tempDir("over");
    await mkdir(path.join(target, "app", "etc"), { recursive: true });
    await writeFile(path.join(target, "app", "README"), "my own notes\n");
    await writeFile(path.join(target, "app", "etc", "app.conf"), "color = blue\n"); // same bytes: no conflict
    const before = await snapshotTree(target);
    const error = await refusal(client.install("app@1.0.0", target));
    expect(error.code).toBe("CONFLICT");
    expect(error.details.paths).toEqual(["app/README"]);
    expect(error.message).toContain("app/README (not written by an install)");
    expect(error.message).toContain('preserve "renameold"');
    // Nothing changed: the user's tree is as it was, and nothing is recorded as installed.
    expect(await snapshotTree(target, { skip: [".runner-depot"] })).toEqual(before);
    expect(await readdir(path.join(target, ".runner-depot"))).toEqual([]);
  });

  it("keeps a user's file the package does not have, and an identical one, and installs", async () => {
    const target = await depot.tempDir("beside");
    await mkdir(path.join(target, "app", "etc"), { recursive: true });
    await mkdir(path.join(target, "app", "mine", "deep"), { recursive: true });
    await writeFile(path.join(target, "app", "notes.txt"), "keep me\n");
    await writeFile(path.join(target, "app", "mine", "deep", "data"), "mine too\n");
    await writeFile(path.join(target, "app", "etc", "app.conf"), "color = blue\n");
    const result = await client.install("app@1.0.0", target);
    expect(result.packages[0]).toMatchObject({ action: "installed", kept: ["app/mine", "app/notes.txt"] });
    expect(await readFile(path.join(target, "app", "notes.txt"), "utf8")).toBe("keep me\n");
    expect(await readFile(path.join(target, "app", "mine", "deep", "data"), "utf8")).toBe("mine too\n");
    expect(await readFile(path.join(target, "app", "README"), "utf8")).toBe("version one\n");
  });

  it("with preserve renameold keeps the user's file as <path>.old and installs the package's", async () => {
    const target = await depot.tempDir("renameold");
    await mkdir(path.join(target, "app"), { recursive: true });
    await writeFile(path.join(target, "app", "README"), "my own notes\n");
    await writeFile(path.join(target, "app", "README.old"), "an older note\n");
    const result = await client.install("app@1.0.0", target, { preserve: "renameold" });
    expect(result.packages[0]!.kept?.sort()).toEqual(["app/README.old", "app/README.old.1"]);
    expect(await readFile(path.join(target, "app", "README"), "utf8")).toBe("version one\n");
    expect(await readFile(path.join(target, "app", "README.old.1"), "utf8")).toBe("my own notes\n");
    expect(await readFile(path.join(target, "app", "README.old"), "utf8")).toBe("an older note\n");
  });

  it("refuses a user's folder where the package has a file, and a file where it has a folder", async () => {
    const target = await depot.tempDir("kinds");
    await mkdir(path.join(target, "app", "README"), { recursive: true });
    await writeFile(path.join(target, "app", "README", "inside"), "x");
    await writeFile(path.join(target, "app", "etc"), "a file where etc/ goes");
    const error = await refusal(client.install("app@1.0.0", target));
    expect((error.details.paths as string[]).sort()).toEqual(["app/README", "app/etc"]);
    expect(await readFile(path.join(target, "app", "README", "inside"), "utf8")).toBe("x");
    expect(await readFile(path.join(target, "app", "etc"), "utf8")).toBe("a file where etc/ goes");
  });
});

describe("upgrade over a user's edits", () => {
  it("refuses to drop an edit of an installed file, keeps an added file, and records what it wrote", async () => {
    const target = await depot.tempDir("upgrade");
    await client.install("app@1.0.0", target);
    const record = JSON.parse(await readFile(path.join(target, ".runner-depot", "records", "app.json"), "utf8")) as {
      version: string;
      items: Array<{ path: string; sha256?: string }>;
    };
    expect(record.version).toBe("1.0.0");
    expect(record.items.find((i) => i.path === "README")?.sha256).toMatch(/^[0-9a-f]{64}$/);

    await writeFile(path.join(target, "app", "etc", "app.conf"), "color = red\n"); // the user's edit
    await writeFile(path.join(target, "app", "local.txt"), "added by the user\n");
    const error = await refusal(client.install("app@2.0.0", target));
    expect(error.code).toBe("CONFLICT");
    expect(error.details.paths).toEqual(["app/etc/app.conf"]);
    expect(error.message).toContain("app/etc/app.conf (changed since installed)");
    expect(await readFile(path.join(target, "app", "etc", "app.conf"), "utf8")).toBe("color = red\n");
    expect(await readFile(path.join(target, "app", "README"), "utf8")).toBe("version one\n");
    expect(
      JSON.parse(await readFile(path.join(target, ".runner-depot", "installed.json"), "utf8")).packages.app.version,
    ).toBe("1.0.0");

    const result = await client.install("app@2.0.0", target, { preserve: "renameold" });
    expect(result.packages[0]).toMatchObject({ action: "upgraded", from: "1.0.0" });
    expect(result.packages[0]!.kept?.sort()).toEqual(["app/etc/app.conf.old", "app/local.txt"]);
    expect(await readFile(path.join(target, "app", "etc", "app.conf.old"), "utf8")).toBe("color = red\n");
    expect(await readFile(path.join(target, "app", "etc", "app.conf"), "utf8")).toBe("color = blue\n");
    expect(await readFile(path.join(target, "app", "local.txt"), "utf8")).toBe("added by the user\n");
    expect(await readFile(path.join(target, "app", "README"), "utf8")).toBe("version two\n");
    await expect(readFile(path.join(target, "app", "gone-in-2"))).rejects.toMatchObject({ code: "ENOENT" });

    // Going back down keeps the user's files again (they are not in the record).
    const down = await client.install("app@1.0.0", target);
    expect(down.packages[0]!.kept?.sort()).toEqual(["app/etc/app.conf.old", "app/local.txt"]);
    expect(await readFile(path.join(target, "app", "local.txt"), "utf8")).toBe("added by the user\n");
  });

  it("keeps an edited file the new version no longer ships", async () => {
    const target = await depot.tempDir("dropped");
    await client.install("app@1.0.0", target);
    await writeFile(path.join(target, "app", "gone-in-2"), "edited by the user\n");
    const result = await client.install("app@2.0.0", target);
    expect(result.packages[0]!.kept).toEqual(["app/gone-in-2"]);
    expect(await readFile(path.join(target, "app", "gone-in-2"), "utf8")).toBe("edited by the user\n");
  });

  it("upgrades an unedited install silently, through the delta, with nothing kept", async () => {
    const target = await depot.tempDir("clean");
    await client.install("app@1.0.0", target);
    const result = await client.install("app@2.0.0", target);
    expect(result.packages[0]).toMatchObject({ action: "upgraded", via: "delta", kept: [] });
    expect(await readFile(path.join(target, "app", "README"), "utf8")).toBe("version two\n");
  });

  it("an install without a record (an older runner-depot) is vouched for by the installed version's manifest", async () => {
    const target = await depot.tempDir("legacy");
    await client.install("app@1.0.0", target);
    await rm(path.join(target, ".runner-depot", "records"), { recursive: true });
    await writeFile(path.join(target, "app", "README"), "edited\n");
    const error = await refusal(client.install("app@2.0.0", target));
    expect(error.details.paths).toEqual(["app/README"]);
    await writeFile(path.join(target, "app", "README"), "version one\n");
    const result = await client.install("app@2.0.0", target);
    expect(result.packages[0]).toMatchObject({ action: "upgraded", kept: [] });
  });
});
